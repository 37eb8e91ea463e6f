"""Which checkpoints a job keeps: the newest N, and every K-th step (DLRover-RM sec. 5.2
keeps only the latest; keeping every K-th step as well lets a user go back past a bad
stretch of training without keeping everything)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stride.ckptcache.domain.checkpoints import CheckpointInfo, newest_first


@dataclass(frozen=True)
class RetentionPolicy:
    """Keep the newest ``keep_last`` checkpoints, plus every step divisible by
    ``keep_every_steps`` (0: none)."""

    keep_last: int
    keep_every_steps: int = 0

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {self.keep_last}")
        if self.keep_every_steps < 0:
            raise ValueError(f"keep_every_steps must not be negative, got {self.keep_every_steps}")

    def keeps_step(self, step: int) -> bool:
        """True if a checkpoint at ``step`` is kept whatever its age."""
        return self.keep_every_steps > 0 and step % self.keep_every_steps == 0

    def expired(self, checkpoints: Iterable[CheckpointInfo]) -> list[CheckpointInfo]:
        """The checkpoints to delete, oldest last."""
        ordered = newest_first(checkpoints)
        return [
            info
            for index, info in enumerate(ordered)
            if index >= self.keep_last and not self.keeps_step(info.step)
        ]
