"""Is the rewritten graph really faster? A measured speed-up with its noise, robust to drift.

A cost model's estimate says what a search believes; `measure_speedup` says what the machine does.
It times the two graphs in alternating rounds (before, after; then after, before; ...), each round a
fresh measurement (a new session, new buffers) of `warmup + repeats` runs, so that slow drift of the
machine (frequency, temperature, other tenants) falls on both graphs alike.

Why rounds, and why the verdict is computed from them: on a shared CPU the run time of one graph
varies more between sessions (memory placement, another tenant arriving) than between runs of one
session; a test on the runs of a single session calls identical graphs different. Each round gives
one paired ratio before/after; the verdict is a paired t-test on their logarithms at 95%:

    faster        the mean log-ratio is above zero beyond the t interval of the rounds;
    slower        below zero beyond it;
    within noise  otherwise: this machine cannot tell the two apart at this number of rounds.

One round has no between-round spread: its verdict falls back to the runs' own noise
(`improvement_is_significant`). A deterministic estimate (identical ratios) is judged exactly. Two
graphs with the same canonical hash are the same computation: they are still timed (which shows
the noise), but the verdict is "within noise" whatever the rounds say, since a 95% test calls one
comparison in twenty of identical things different.

With `control=True` every round also times a second, independent measurement of `before` (an A/A
control: a fresh session of the same graph). Its ratios show what the machine does to identical
work in the same run, so the noise floor is measured rather than assumed. Then:

    faster              the interval lies above 1 and above the A/A control's interval, and the effect
                        exceeds the control's deviation (what the guard requires to write a changed model);
    slower              the interval lies below 1 and the effect exceeds the control's deviation;
    too noisy to tell   neither, and the control's deviation (or the interval's half-width) is over
                        RESOLUTION (3%): this machine, now, cannot resolve an effect of that size;
    within noise        neither, on a machine quiet enough to resolve RESOLUTION.

Rounds are added (up to `max_rounds`, within `budget_s`) while the interval is wider than
+-RESOLUTION/2, so a 3% effect is resolved on a quiet machine without a long run on a noisy one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xrl.cost.base import CostModel, Measurement
from xrl.cost.timing import improvement_is_significant
from xrl.ir import Graph

VERDICTS = ("faster", "slower", "within noise", "too noisy to tell")
RESOLUTION = 0.03  # the effect `--measure` aims to resolve on a quiet machine
# Two-sided 95% quantiles of Student's t for 1..10 degrees of freedom (more: the normal's 1.96 plus a margin).
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t95(dof: int) -> float:
    return _T95[dof - 1] if dof <= len(_T95) else 2.2


def ratio_interval(ratios: Sequence[float]) -> tuple[float, float]:
    """The 95% t interval of per-round ratios, on their logarithms (a point for one round or no spread)."""
    logs = [math.log(r) for r in ratios]
    centre = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(centre), math.exp(centre)
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(centre - half), math.exp(centre + half)


@dataclass(frozen=True)
class MeasuredSpeedup:
    """`before` / `after` pool the rounds; `round_speedups` are the per-round ratios before/after."""

    cost_model: str
    before: Measurement
    after: Measurement
    round_speedups: tuple[float, ...]
    identical: bool = False  # the two graphs have the same canonical hash
    control_speedups: tuple[float, ...] = ()  # per-round before/before' of the A/A control, when timed

    @property
    def speedup(self) -> float:
        """The geometric mean of the rounds' ratios: the centre of `interval`."""
        return math.exp(statistics.fmean(math.log(r) for r in self.round_speedups))

    @property
    def interval(self) -> tuple[float, float]:
        """The 95% interval of the speed-up from the rounds' spread (a point for one round or no spread)."""
        return ratio_interval(self.round_speedups)

    @property
    def control(self) -> tuple[float, float] | None:
        """The A/A control's 95% interval (None without a control)."""
        return ratio_interval(self.control_speedups) if self.control_speedups else None

    @property
    def noise(self) -> float:
        """How far from 1 identical work measured in this run: the A/A interval's farthest end (0 without)."""
        c = self.control
        return max(c[1] - 1, 1 - c[0]) if c else 0.0

    @property
    def verdict(self) -> str:
        if self.control_speedups:
            low, high = self.interval
            noise = self.noise
            # faster beyond the noise: the whole interval above 1 and above the A/A control's, and the point
            # estimate further from 1 than the control's farthest end (what the guard requires to write it)
            if not self.identical and low > max(1.0, self.control[1]) and self.speedup - 1 > noise:
                return "faster"
            if not self.identical and high < 1 and 1 - self.speedup > noise:
                return "slower"
            return "too noisy to tell" if max(noise, (high - low) / 2) > RESOLUTION else "within noise"
        if self.identical:
            return "within noise"
        if len(self.round_speedups) < 2:
            if improvement_is_significant(self.before, self.after):
                return "faster"
            return "slower" if improvement_is_significant(self.after, self.before) else "within noise"
        low, high = self.interval
        return "faster" if low > 1 else "slower" if high < 1 else "within noise"

    @property
    def faster(self) -> bool:
        return self.verdict == "faster"

    def to_json(self) -> dict[str, Any]:
        low, high = self.interval
        control = self.control
        return {"cost_model": self.cost_model, "before_s": self.before.median_s, "after_s": self.after.median_s,
                "before_cv": self.before.cv, "after_cv": self.after.cv, "repeats": self.before.repeats,
                "speedup": self.speedup, "interval95": [low, high], "round_speedups": list(self.round_speedups),
                "identical": self.identical, "verdict": self.verdict,
                "control_interval95": list(control) if control else None,
                "control_speedups": list(self.control_speedups), "noise": self.noise if control else None}


def pool_rounds(rounds: Sequence[Measurement]) -> Measurement:
    """One Measurement from several of the same graph: the median of the round medians, every run
    counted in `repeats`, the mean CV, and the extremes."""
    return Measurement(statistics.median(m.median_s for m in rounds), sum(m.repeats for m in rounds),
                       statistics.fmean(m.cv for m in rounds), min(m.min_s for m in rounds),
                       max(m.max_s for m in rounds))


def measure_speedup(model: CostModel, before: Graph, after: Graph, *, rounds: int = 5, control: bool = False,
                    max_rounds: int | None = None, budget_s: float = 120.0) -> MeasuredSpeedup:
    """Time `before` and `after` in `rounds` alternating rounds with `model` (fresh runs, never a
    cached timing) and compare them. With `control`, each round also times `before` a second time
    (the A/A control). With `max_rounds` above `rounds`, rounds are added while the interval is wider
    than +-RESOLUTION/2 and the whole measurement has taken less than `budget_s` seconds."""
    import time

    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    names = ("before", "after", "control") if control else ("before", "after")
    timed: dict[str, list[Measurement]] = {k: [] for k in names}
    graphs = {"before": before, "after": after, "control": before}
    t0 = time.perf_counter()

    def result() -> MeasuredSpeedup:
        def ratios(a: str, b: str) -> tuple[float, ...]:
            return tuple(x.median_s / y.median_s if y.median_s > 0 else float("nan")
                         for x, y in zip(timed[a], timed[b]))

        return MeasuredSpeedup(model.describe(), pool_rounds(timed["before"]), pool_rounds(timed["after"]),
                               ratios("before", "after"), identical=before.canonical_hash == after.canonical_hash,
                               control_speedups=ratios("before", "control") if control else ())

    r = 0
    while True:
        k = r % len(names)  # rotate the order, so no graph is always timed first or last in a round
        for which in names[k:] + names[:k]:
            timed[which].append(model.remeasure(graphs[which]))
        r += 1
        if r < rounds:
            continue
        if max_rounds is None or r >= max_rounds or time.perf_counter() - t0 > budget_s:
            return result()
        low, high = result().interval
        if (high - low) / 2 <= RESOLUTION / 2:
            return result()
