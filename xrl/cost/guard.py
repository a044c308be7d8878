"""The measured guard: of the graphs a run could write, time each end to end and keep the fastest.

A cost model proposes; the machine decides. Before `xrl optimize` writes a model for an onnxruntime
target, it times the original, an A/A copy of the original (the noise floor of this run) and each
candidate it could write (the pre-passes' result, the search's best) in alternating rounds, each
round a fresh onnxruntime session per graph (one session of a file can run several percent faster or
slower than another for its whole life), and compares every candidate with the original by the
rounds' paired ratios (`xrl.cost.speedup`).

The rule: a changed model is written only when it is measurably faster than the original beyond the
noise of this run: its verdict is "faster", which with the A/A control means its 95% interval lies
above 1 and above the A/A control's interval, and its point estimate is further from 1 than the A/A
control's farthest end (`MeasuredSpeedup.verdict`). Of those, the one with the highest speed-up is
written, or, among those the rounds cannot tell apart from it, the one with the fewest ops (an exact merge
is not left half done for noise); when none is, the original itself is written and the reason says why (measured slower,
within noise, or too noisy to tell), and its reported interval is the A/A control's: what identical
work measured in this run.

Rounds: at least `min_rounds` (3) before anything is decided, `rounds` before the precision rule, at
most `max_rounds` (within `budget_s`). The guard stops as soon as its decision is settled (`settled`):
every candidate's interval is below 1, or on a quiet run below the A/A control's upper end (nothing
can be shown faster: the common case, decided in few rounds), or the leader is measurably faster and
its interval is above every other candidate's. Otherwise rounds are added while the leader's interval
is wider than +-RESOLUTION/2, and while the A/A control deviates by more than RESOLUTION ("too noisy
to tell": more rounds may resolve it; at the limit the original is written and the report says so).
After `rounds`, a candidate whose whole interval is below the leader's is no longer timed (racing: on
bert, 150 ms a run, each graph in a round costs about 2 s). From `min_rounds` on, a candidate that cannot
become writable is no longer timed either (`hopeless`: its interval below 1, or on a quiet run below the A/A
control's upper end, or too close to 1 to clear the noise in the rounds the guard may still take, even at its
interval's upper end); when no candidate is left, the original is written. The time budget counts from
`min_rounds` on: a loaded machine (a bert round of seven graphs took 75 s) stops at the budget, not at
`rounds`. Neither makes a candidate writable that was not: both only stop timing sooner.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from xrl.cost.base import CostModel, Measurement
from xrl.cost.speedup import RESOLUTION, MeasuredSpeedup, pool_rounds, ratio_interval, t95
from xrl.ir import Graph

ORIGINAL = "original"
# the fewest rounds anything is decided on: two degrees of freedom (a t of 4.3) keeps early decisions rare
# on a noisy machine, where the A/A control's interval is then wide
MIN_ROUNDS = 3
# seconds the guard may time for, counted from MIN_ROUNDS on. On a quiet machine a bert-base round of seven graphs
# takes ~8 s: at 120 s the common case (candidates within 1-2% of the original, none measurably faster) was timed
# for 14 rounds, 124 s of a 167 s run, to write the original; at 40 s a candidate that cannot clear the noise in
# the rounds the budget leaves is dropped from the third round (`hopeless`), and a 3% gain is still shown
BUDGET_S = 40.0


@dataclass(frozen=True)
class GuardCandidate:
    label: str  # "pre-pass", "search", ...
    graph: Graph


@dataclass(frozen=True)
class OriginalMeasurement:
    """What is reported when the original itself is written: speed-up 1 (the same file), with the A/A
    control's interval (identical work measured in this run) and its verdict; the fields a
    `MeasuredSpeedup` reports (`speedup`, `interval`, `verdict`, `noise`, `cost_model`)."""

    control: tuple[float, float] | None  # the A/A control's 95% interval; None where nothing was timed
    cost_model: str = "guard"
    speedup: float = 1.0
    identical: bool = True

    @property
    def interval(self) -> tuple[float, float]:
        return self.control if self.control is not None else (1.0, 1.0)

    @property
    def noise(self) -> float | None:
        c = self.control
        return max(c[1] - 1, 1 - c[0]) if c is not None else None

    @property
    def verdict(self) -> str:
        noise = self.noise
        return "too noisy to tell" if noise is not None and noise > RESOLUTION else "within noise"

    @property
    def note(self) -> str:
        if self.control is None:
            return "the original itself was written; nothing was timed"
        return ("the original itself was written; its interval is the A/A control's (identical work measured in "
                "this run)")

    def to_json(self) -> dict[str, Any]:
        c = self.control
        return {"cost_model": self.cost_model, "speedup": self.speedup, "interval95": list(self.interval),
                "verdict": self.verdict, "identical": self.identical, "control_interval95": list(c) if c else None,
                "noise": self.noise, "note": self.note}


@dataclass(frozen=True)
class GuardResult:
    chosen: str  # a candidate's label, or ORIGINAL
    reason: str
    measured: dict[str, MeasuredSpeedup]  # label -> its measurement against the original
    rounds: int
    time_s: float
    control_speedups: tuple[float, ...] = ()  # the A/A control's per-round ratios (original / its copy)
    settled: str = ""  # why the rounds stopped
    # label -> the cost model's estimated speed-up of that candidate (set by the deployment's guard stage)
    estimated_speedups: dict[str, float] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)  # label -> why it stopped being timed early (`hopeless`)

    def speedup_of(self, label: str) -> MeasuredSpeedup | None:
        return self.measured.get(label)

    @property
    def control(self) -> tuple[float, float] | None:
        """The A/A control's 95% interval (None where nothing was timed)."""
        return ratio_interval(self.control_speedups) if self.control_speedups else None

    def original_measurement(self) -> OriginalMeasurement:
        """What is reported when the original itself is written (`OriginalMeasurement`)."""
        return OriginalMeasurement(self.control)

    def written_measurement(self) -> MeasuredSpeedup | OriginalMeasurement:
        """The measurement of what is written: the chosen candidate's, or the original's."""
        return self.original_measurement() if self.chosen == ORIGINAL else self.measured[self.chosen]

    def to_json(self) -> dict[str, Any]:
        c = self.control
        return {"chosen": self.chosen, "reason": self.reason, "rounds": self.rounds, "time_s": round(self.time_s, 3),
                "settled": self.settled, "control_interval95": list(c) if c else None,
                "original": self.original_measurement().to_json(),
                "candidates": {k: v.to_json() for k, v in self.measured.items()},
                "estimated_speedups": dict(self.estimated_speedups), "dropped": dict(self.dropped)}


def writable(m: MeasuredSpeedup) -> bool:
    """Whether a candidate may be written: measured faster than the original beyond this run's noise."""
    return m.verdict == "faster"


def settled(measured: dict[str, MeasuredSpeedup], control: tuple[float, float]) -> str:
    """Why the guard's decision can no longer change with more rounds ("" while it can).

    Nothing to write: every candidate's interval is below 1, or, on a run whose A/A control is within
    +-RESOLUTION, below the control's upper end (identical work measured as fast: nothing is shown
    faster). A winner: the leader is writable and its interval is above every other candidate's."""
    highs = {k: ratio_interval(m.round_speedups)[1] for k, m in measured.items()}
    noisy = max(control[1] - 1, 1 - control[0]) > RESOLUTION
    if all(h < 1.0 for h in highs.values()):
        return "every candidate measured below the original"
    if not noisy and all(h <= max(1.0, control[1]) for h in highs.values()):
        return "no candidate can be shown faster than the A/A control"
    leader = max(measured, key=lambda k: measured[k].speedup)
    low = ratio_interval(measured[leader].round_speedups)[0]
    if writable(measured[leader]) and all(highs[k] < low for k in measured if k != leader):
        return f"{leader} measured faster than the original and every other candidate"
    return ""


def _log_sd(ratios: Sequence[float]) -> float:
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / len(logs)
    return math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)) if len(logs) > 1 else 0.0


def hopeless(m: MeasuredSpeedup, control: Sequence[float], most_rounds: int) -> str:
    """Why `m` cannot become writable ("" where it still can), from its rounds so far (at least three) and the
    A/A control's over the same rounds, if timed for at most `most_rounds` rounds in all:

    - its 95% interval is below 1 (measured slower), or, on a quiet run (the A/A control within
      +-RESOLUTION), below the A/A control's upper end (what `settled` asks of every candidate at once);
    - or, optimistically taking its interval's upper end as its true speed-up and its and the A/A control's
      round-to-round spread as they are, the interval at `most_rounds` rounds would still not clear the A/A
      control's: writable needs log(speed-up) - t sd_c / sqrt(n) > t sd_a / sqrt(n)
      (`MeasuredSpeedup.verdict`), so a candidate within that of 1 cannot become writable in time."""
    n = len(m.round_speedups)
    if n < 3 or len(control) < n:
        return ""
    high = ratio_interval(m.round_speedups)[1]
    c = ratio_interval(control[:n])
    if high < 1.0:
        return "its interval is below 1"
    if max(c[1] - 1, 1 - c[0]) <= RESOLUTION and high <= max(1.0, c[1]):
        return "its interval is below the A/A control's upper end"
    most = max(most_rounds, n)
    reach = t95(most - 1) * (_log_sd(m.round_speedups) + _log_sd(control[:n])) / math.sqrt(most)
    if math.log(high) <= reach:
        return f"even at its interval's upper end ({high:.3f}x) it cannot clear the noise in {most} rounds"
    return ""


def measure_guard(timer: CostModel, original: Graph, candidates: Sequence[GuardCandidate], *, rounds: int = 6,
                  max_rounds: int = 20, budget_s: float = BUDGET_S, min_rounds: int = MIN_ROUNDS) -> GuardResult:
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

    def ratios(b: str) -> tuple[float, ...]:
        return tuple(x.median_s / y.median_s for x, y in zip(timed[ORIGINAL], timed[b]))

    def speedups() -> dict[str, MeasuredSpeedup]:
        control = ratios("A/A")
        # an eliminated candidate's rounds pair with the original's first rounds: the rounds it was timed in
        return {c.label: MeasuredSpeedup(timer.describe(), pool_rounds(timed[ORIGINAL][:len(timed[c.label])]),
                                         pool_rounds(timed[c.label]), ratios(c.label),
                                         control_speedups=control[:len(timed[c.label])]) for c in distinct}

    first = max(1, min(min_rounds, rounds))  # no decision on fewer rounds than this
    r = 0
    why = ""
    racing = list(names)  # the graphs still timed each round
    dropped: dict[str, str] = {}  # candidate -> why it stopped being timed before the end (`hopeless`)
    graph_rounds = 0  # graphs timed so far: the time one costs, for the rounds the budget leaves
    while True:
        k = r % len(racing)  # rotate the order: no graph is always timed first or last in a round
        for which in racing[k:] + racing[:k]:
            timed[which].append(timer.remeasure(graphs[which]))
        graph_rounds += len(racing)
        r += 1
        if r < first:
            continue
        current = speedups()
        control = ratio_interval(ratios("A/A"))
        why = settled(current, control)
        if why:
            break
        elapsed = time.perf_counter() - t0
        # the most rounds a candidate can still get: the round limit, or the budget's at three graphs a round
        # (the original, its A/A copy and it: optimistic, so a candidate is dropped only where hopeless then)
        per_round = 3 * elapsed / graph_rounds
        most = min(max_rounds, max(rounds, r + math.ceil(max(0.0, budget_s - elapsed) / max(per_round, 1e-9))))
        aa = ratios("A/A")
        for n in racing:
            if n not in (ORIGINAL, "A/A") and (hopeless_why := hopeless(current[n], aa, most)):
                dropped[n] = hopeless_why
        racing = [n for n in racing if n not in dropped]
        if len(racing) == 2:  # the original and its A/A copy: no candidate can still be shown faster
            why = "no candidate can be shown faster in the rounds left"
            break
        if r >= max_rounds:
            why = f"the limit of {max_rounds} rounds"
            break
        if elapsed > budget_s:
            why = f"the guard's time budget of {budget_s:g} s"
            break
        if r < rounds:
            continue
        leader = max((current[n] for n in racing if n in current), key=lambda m: m.speedup)
        low, high = ratio_interval(leader.round_speedups)
        quiet = max(control[1] - 1, 1 - control[0]) <= RESOLUTION
        if quiet and (high - low) / 2 <= RESOLUTION / 2:
            why = f"the leader's interval within +-{RESOLUTION / 2:.1%}"
            break
        racing = [n for n in racing if n in (ORIGINAL, "A/A") or current[n] is leader
                  or ratio_interval(current[n].round_speedups)[1] >= low]
    control_rounds = ratios("A/A")
    chosen, reason = choose(current, ratio_interval(control_rounds), rounds=r,
                            sizes={c.label: len(c.graph) for c in distinct})
    return GuardResult(chosen, reason, current, r, time.perf_counter() - t0, control_rounds, why, dropped=dropped)


def choose(measured: dict[str, MeasuredSpeedup], control: tuple[float, float] | None = None, *,
           rounds: int | None = None, sizes: dict[str, int] | None = None) -> tuple[str, str]:
    """The label to write and why: the fastest candidate measured faster than the original beyond the noise
    (`writable`); the original itself when there is none. `control`: the A/A control's interval, for the
    reason (each candidate carries its own control rounds). `sizes` (label -> ops): among the writable
    candidates the measurement cannot tell apart from the fastest (an interval reaching the fastest's lower
    end), the one with the fewest ops is written: a re-parameterisation merged in full is not left half done
    because noise put the half-merged graph a hair ahead."""
    eligible = {k: m for k, m in measured.items() if writable(m)}
    slower = sorted(k for k, m in measured.items() if m.verdict == "slower")
    if not eligible:
        if control is None:
            control = next((m.control for m in measured.values() if m.control), None)
        noise = max(control[1] - 1, 1 - control[0]) if control else 0.0
        after = f" after {rounds} rounds" if rounds else ""
        if slower and len(slower) == len(measured):
            why = f"{', '.join(slower)} measured slower than the original"
        elif noise > RESOLUTION:
            why = (f"too noisy to tell: the A/A control deviated {noise:.1%} (over {RESOLUTION:.0%}){after}, so no "
                   f"candidate could be shown faster")
        else:
            best = max(measured, key=lambda k: measured[k].speedup) if measured else None
            why = "no candidate measured faster than the original beyond the noise"
            if best is not None:
                lo, hi = measured[best].interval
                why += f" (best: {best} {measured[best].speedup:.3f}x [{lo:.3f}-{hi:.3f}]"
                why += f", A/A [{control[0]:.3f}-{control[1]:.3f}])" if control else ")"
        return ORIGINAL, f"{why}: the original is written"
    best = max(eligible, key=lambda k: eligible[k].speedup)
    note = f"; {', '.join(slower)} measured slower" if slower else ""
    if sizes:
        ops = {k: sizes.get(k, math.inf) for k in eligible}
        floor = eligible[best].interval[0]
        tied = [k for k in eligible if eligible[k].interval[1] >= floor]  # not resolved apart from the fastest
        smallest = min(tied, key=lambda k: (ops[k], -eligible[k].speedup))
        if ops[smallest] < ops[best]:
            m, (lo, hi) = eligible[smallest], eligible[smallest].interval
            return smallest, (f"{smallest} measured faster than the original ({m.speedup:.3f}x [{lo:.3f}-{hi:.3f}]) "
                              f"and within noise of {best} ({eligible[best].speedup:.3f}x), with fewer ops "
                              f"({ops[smallest]} against {ops[best]}){note}")
    m = eligible[best]
    lo, hi = m.interval
    return best, f"{best} measured fastest ({m.speedup:.3f}x [{lo:.3f}-{hi:.3f}], {m.verdict}){note}"
