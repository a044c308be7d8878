"""The measured guard: of the graphs a run could write, time each end to end and keep the fastest.

A cost model proposes; the machine decides. Before `xrl optimize` writes a model for an onnxruntime
target, it times the original, an A/A copy of the original (the noise floor of this run) and each
candidate it could write (the pre-passes' result, the search's best) in alternating rounds, each
round a fresh onnxruntime session per graph (one session of a file can run several percent faster or
slower than another for its whole life), and compares every candidate with the original by the
rounds' paired ratios (`xrl.cost.speedup`).

The choice: the candidate with the highest measured speed-up among those whose verdict is not
"slower"; the original itself counts as 1.0, so a candidate whose point estimate is below 1 never
wins, and one measured slower than the original beyond the noise is never written. Rounds are added
(up to `max_rounds`, within `budget_s`) while the leading candidate's interval is wider than
+-RESOLUTION/2; from then on a candidate whose whole interval is below the leader's is no longer timed
(racing: on bert, 150 ms a run, each graph in a round costs about 2 s).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xrl.cost.base import CostModel, Measurement
from xrl.cost.speedup import RESOLUTION, MeasuredSpeedup, pool_rounds, ratio_interval
from xrl.ir import Graph

ORIGINAL = "original"


@dataclass(frozen=True)
class GuardCandidate:
    label: str  # "pre-pass", "search", ...
    graph: Graph


@dataclass(frozen=True)
class GuardResult:
    chosen: str  # a candidate's label, or ORIGINAL
    reason: str
    measured: dict[str, MeasuredSpeedup]  # label -> its measurement against the original
    rounds: int
    time_s: float

    def speedup_of(self, label: str) -> MeasuredSpeedup | None:
        return self.measured.get(label)

    def to_json(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "reason": self.reason, "rounds": self.rounds, "time_s": round(self.time_s, 3),
                "candidates": {k: v.to_json() for k, v in self.measured.items()}}


def measure_guard(timer: CostModel, original: Graph, candidates: Sequence[GuardCandidate], *, rounds: int = 6,
                  max_rounds: int = 20, budget_s: float = 120.0) -> GuardResult:
    """Time `original`, its A/A control and every candidate in alternating rounds with `timer` (an
    end-to-end model whose `remeasure` opens a fresh session), and choose what to write."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    t0 = time.perf_counter()
    distinct: list[GuardCandidate] = []
    seen = {original.canonical_hash}
    for c in candidates:  # a candidate identical to the original or to an earlier one is the same computation
        if c.graph.canonical_hash not in seen:
            seen.add(c.graph.canonical_hash)
            distinct.append(c)
    if not distinct:
        return GuardResult(ORIGINAL, "no candidate differs from the original", {}, 0, 0.0)
    names = [ORIGINAL, "A/A", *(c.label for c in distinct)]
    graphs = {ORIGINAL: original, "A/A": original, **{c.label: c.graph for c in distinct}}
    timed: dict[str, list[Measurement]] = {k: [] for k in names}

    def speedups() -> dict[str, MeasuredSpeedup]:
        def ratios(b: str) -> tuple[float, ...]:
            return tuple(x.median_s / y.median_s for x, y in zip(timed[ORIGINAL], timed[b]))

        control = ratios("A/A")
        # an eliminated candidate's rounds pair with the original's first rounds: the rounds it was timed in
        return {c.label: MeasuredSpeedup(timer.describe(), pool_rounds(timed[ORIGINAL][:len(timed[c.label])]),
                                         pool_rounds(timed[c.label]), ratios(c.label),
                                         control_speedups=control[:len(timed[c.label])]) for c in distinct}

    r = 0
    racing = list(names)  # the graphs still timed each round
    while True:
        k = r % len(racing)  # rotate the order: no graph is always timed first or last in a round
        for which in racing[k:] + racing[:k]:
            timed[which].append(timer.remeasure(graphs[which]))
        r += 1
        if r < rounds:
            continue
        current = speedups()
        leader = max(current.values(), key=lambda m: m.speedup)
        low, high = ratio_interval(leader.round_speedups)
        if r >= max_rounds or time.perf_counter() - t0 > budget_s or (high - low) / 2 <= RESOLUTION / 2:
            break
        racing = [n for n in racing if n in (ORIGINAL, "A/A") or current[n] is leader
                  or ratio_interval(current[n].round_speedups)[1] >= low]
    chosen, reason = choose(current)
    return GuardResult(chosen, reason, current, r, time.perf_counter() - t0)


def choose(measured: dict[str, MeasuredSpeedup]) -> tuple[str, str]:
    """The label to write and why: the fastest measured candidate that is not slower than the original
    (the original counts as 1.0)."""
    eligible = {k: m for k, m in measured.items() if m.verdict != "slower" and m.speedup > 1.0}
    slower = sorted(k for k, m in measured.items() if m.verdict == "slower")
    if not eligible:
        why = (f"{', '.join(slower)} measured slower than the original" if slower
               else "no candidate measured faster than the original")
        return ORIGINAL, f"{why}: the original is written"
    best = max(eligible, key=lambda k: eligible[k].speedup)
    m = eligible[best]
    note = f"; {', '.join(slower)} measured slower" if slower else ""
    return best, f"{best} measured fastest ({m.speedup:.3f}x, {m.verdict}){note}"
