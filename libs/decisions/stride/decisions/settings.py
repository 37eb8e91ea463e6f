"""The settings every service that takes policy decisions shares (mixed into its own)."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from stride.decisions import DEFAULT_SILENCE_SECONDS, DEFAULT_TIMEOUT_SECONDS, parse_routes


class DecisionSettings(BaseSettings):
    """Where decisions are made: ``<PREFIX>DECISIONS`` is a JSON object from a decision kind
    (admit, allocate, place, adjust, preempt, tune_data_workers) or an algorithm name to
    ``inprocess`` or ``executor``, e.g. ``{"adjust": "executor"}``."""

    decisions: dict[str, str] = Field(default_factory=dict)
    """Empty by default: the throughput fit and NSGA-II go to the executor pool, everything
    else runs in-process (see ``stride.decisions.HEAVY_ALGORITHMS``)."""
    decision_timeout_seconds: float = Field(
        default=DEFAULT_TIMEOUT_SECONDS, gt=0, le=600, allow_inf_nan=False
    )
    """The deadline of every decision, in-process or in the pool."""
    decision_silence_seconds: float = Field(
        default=DEFAULT_SILENCE_SECONDS, gt=0, le=600, allow_inf_nan=False
    )
    """How long the executor replica running a request may go without saying it still
    runs (it does every second) before the request is sent to another."""

    @field_validator("decisions")
    @classmethod
    def _known_routes(cls, routes: dict[str, str]) -> dict[str, str]:
        return parse_routes(routes)
