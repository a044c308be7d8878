"""Each stage's wall seconds, in order (`OptimizeResult.stage_seconds`, --json's `stage_seconds`)."""

from __future__ import annotations

import time


class StageClock:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lap = time.perf_counter()

    def done(self, stage: str) -> None:
        """`stage` took the time since the last stage ended (added up where a stage comes twice)."""
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self._lap
        self._lap = now
