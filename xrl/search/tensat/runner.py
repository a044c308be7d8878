"""Equality saturation under limits (egg's `Runner`, with Tensat's defaults).

Each iteration finds every match of every rule in the e-graph as it stands (`Rewrites.search`),
applies the valid ones (`Rewrites.apply`), and completes the analysis (types and constants of
every new e-class) before the next. The runner stops when an iteration changes nothing
(saturated), or when the e-graph passes `node_limit` e-nodes, or after `iter_limit` iterations,
or once `time_limit` seconds have gone. egglog cannot stop inside an iteration, so the limits are
checked between iterations, as egg checks them. Unlike egg, an iteration is not started when it
would likely end past the time limit: its time is predicted from the last one's, scaled by how
much the e-graph grew in it (iterations cost about what they match, and matches grow with the
e-graph). On Inception-v3 the second iteration takes ten times the first; started regardless, it
turned a 2.5 s saturation budget into 17 s. The first iteration has no prediction (it runs unless
the time is already up) and may overshoot, and the last may overshoot the node limit, as in egg.

Multi-pattern rules (TASO's multi-output rules: merge two MatMuls that share an input, ...) run
only in the first `multi_iter_limit` iterations, as in Tensat (its `k_multi`, 1 by default): they
apply to their own results (a merged MatMul merges again with a third, in every order), and left
running they multiply the e-graph by the number of sibling ops each iteration.

Tensat's defaults are 50,000 e-nodes and 15 iterations (its paper's setting). On this project's
2-core CPU machines the defaults are smaller (10,000 e-nodes, 8 iterations, 60 s), which is where
the suite's graphs stop growing usefully; pass Tensat's values for a faithful reproduction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from egglog import EGraph, Ruleset, run

from xrl.search.tensat.language import Args, Tensor
from xrl.search.tensat.rewrites import Rewrites

TENSAT_NODE_LIMIT = 50_000
TENSAT_ITER_LIMIT = 15


@dataclass(frozen=True)
class Limits:
    node_limit: int = 10_000
    iter_limit: int = 8
    time_limit: float | None = 60.0
    multi_iter_limit: int = 1


@dataclass
class RunReport:
    iterations: int = 0
    enodes: int = 0
    stop_reason: str = ""  # "saturated" | "node limit" | "iteration limit" | "time limit" | "time limit (predicted)"
    time_s: float = 0.0
    enodes_per_iteration: list[int] = field(default_factory=list)


_CONSTRUCTORS = frozenset(str(c) for c in (Tensor.input, Tensor.weight, Tensor.none, Tensor.op, Args.nil, Args.cons))


def count_enodes(egraph: EGraph) -> int:
    """E-nodes of the term language (the Tensor and Args constructors), not analysis or match rows."""
    return sum(size for fn, size in egraph.all_function_sizes()
               if str(fn) in _CONSTRUCTORS or str(fn).endswith(".out"))


def saturate(egraph: EGraph, rewrites: Rewrites, analysis: Ruleset, limits: Limits = Limits()) -> RunReport:
    """Run `rewrites` to saturation or a limit, keeping `analysis` complete; the analysis is complete
    again on return, so every e-class can be costed."""
    t0 = time.perf_counter()
    deadline = t0 + limits.time_limit if limits.time_limit is not None else float("inf")
    report = RunReport()
    egraph.run(run(analysis).saturate())
    report.enodes = count_enodes(egraph)
    predicted_s = 0.0  # the next iteration's expected time: unknown before the first
    while True:
        if report.iterations >= limits.iter_limit:
            report.stop_reason = "iteration limit"
            break
        if report.enodes >= limits.node_limit:
            report.stop_reason = "node limit"
            break
        now = time.perf_counter()
        if now >= deadline:
            report.stop_reason = "time limit"
            break
        if now + predicted_s > deadline:
            report.stop_reason = "time limit (predicted)"
            break
        started, enodes_before = now, report.enodes
        multi = report.iterations < limits.multi_iter_limit
        changed = egraph.run(run(rewrites.search)).updated
        if multi:
            changed |= egraph.run(run(rewrites.search_multi)).updated
        changed |= egraph.run(run(rewrites.apply)).updated
        if multi:
            changed |= egraph.run(run(rewrites.apply_multi)).updated
        egraph.run(run(analysis).saturate())
        report.iterations += 1
        report.enodes = count_enodes(egraph)
        report.enodes_per_iteration.append(report.enodes)
        predicted_s = (time.perf_counter() - started) * max(1.0, report.enodes / max(enodes_before, 1))
        if not changed:
            report.stop_reason = "saturated"
            break
    report.time_s = time.perf_counter() - t0
    return report
