"""Commands the agent passes to its trainer: pause for a migration, resume, stop.

DLRover-RM sec. 5.2: in a seamless migration the new pods start first, then training
pauses just long enough to checkpoint and restore. The trainer learns when to do so from
these commands.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ControlAction(Enum):
    """What the trainer must do."""

    PAUSE = "pause"
    """Save a checkpoint and pause (a migration begins)."""
    RESUME = "resume"
    """Continue after a pause; to a standby chief: take over from the old chief."""
    STOP = "stop"
    """Stop training (the job ended, or this pod is going away)."""
    RECONFIGURE = "reconfigure"
    """The job's cluster changed: pause, save, rebuild on the new cluster, restore, resume
    (DLRover-RM sec. 5.2)."""


@dataclass(frozen=True)
class ControlCommand:
    """One command, why it was given, and the plan version that caused it (0 if none)."""

    action: ControlAction
    reason: str
    plan_version: int = 0
    cluster_json: str = ""
    """For RECONFIGURE (and RESUME after a handover): the cluster, ``{"chief": [...], "ps":
    [...], "worker": [...]}``."""
    paused_at: float = 0.0
    """For RESUME after a handover: when training paused (seconds since the Unix epoch)."""
    checkpoint_id: str = ""
    """For RESUME after a handover: the checkpoint the old chief saved."""
