"""The guard stage of the deployment path: the candidates timed against the original, the winner's file.

What is written is the candidate the guard chooses (`xrl.cost.guard`: measured faster than the original beyond
the A/A noise, the fastest, or among those within noise of it the one with the fewest ops), the original itself
when none is; the winner carries its own file and rewrites (`Candidate`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import onnx

from xrl.deploy.candidates import chosen
from xrl.deploy.deployment import Deployment
from xrl.deploy.starts import Starts
from xrl.errors import VerificationError
from xrl.frontends.loader import LoadedModel
from xrl.frontends.prepass import PassReport
from xrl.ir import Graph
from xrl.search.exported import Candidate

if TYPE_CHECKING:
    from xrl.cost.guard import GuardResult, OriginalMeasurement
    from xrl.cost.speedup import MeasuredSpeedup


@dataclass
class Written:
    graph: Graph  # the graph whose file is written (the original's IR where the original is)
    written: Graph  # that file read back: what the reported cost is taken of
    head: onnx.ModelProto
    weights: dict[str, Any] | None
    steps: list[Any]
    max_abs_err: float  # its verification against the original's outputs
    guard: GuardResult | None = None  # the guard's report, with the cost model's estimates of its candidates
    note: PassReport | None = field(default=None)  # a pre-pass report to add (`Candidate.note`)

    @classmethod
    def of(cls, c: Candidate, max_abs_err: float) -> Written:
        return cls(c.graph, c.written, c.head, c.weights, c.steps, max_abs_err, note=c.note)


def guard_stage(loaded: LoadedModel, st: Starts, candidates: list[Candidate], dep: Deployment, *,
                options: Mapping[str, Any], original_cost: float, max_abs_err: float) -> Written:
    """Time `candidates` against the original (`options`: `measure_guard`'s rounds and the like) and return
    what is written; the original is verified again before it is (`max_abs_err`: the search's file's)."""
    from xrl.cost.guard import ORIGINAL, measure_guard
    from xrl.frontends.onnx_weights import split_model
    from xrl.frontends.verify import compare_models

    cost = dep.cost_model.cost
    estimated = {c.label: original_cost / cost(c.written) for c in candidates}
    screen = screened(loaded.graph, candidates, estimated)
    g = measure_guard(dep.guard_timer(), loaded.graph, [c.guard() for c in candidates if c.label not in screen],
                      **options)
    winner = chosen(candidates, g.chosen)
    if winner is None:  # the original: the user's model, as loaded (checked again before it is written)
        if st.original_head is not None:
            head, weights = st.original_head, st.original_weights
        else:  # read again; its weights the IR's arrays where byte for byte equal: no copy held
            original = loaded.take_reference()
            head, weights = split_model(original, like=loaded.graph.initializers)
            del original
        check = compare_models(st.ref, head, external=weights, trials=1)
        if not check.ok:
            raise VerificationError(f"the original model, read again to be written, no longer computes what it "
                                    f"did ({check.detail}); nothing was written")
        out = Written(loaded.graph, loaded.graph, head, weights, [], check.max_abs_err)
    else:  # the winner carries its own file and rewrites
        out = Written.of(winner, max_abs_err)
    reason = g.reason
    if screen and g.rounds == 0 and g.chosen == ORIGINAL:
        reason = "no candidate was timed (each has the original's ops and its estimate): the original is written"
    out.guard = replace(g, reason=reason, estimated_speedups=estimated, dropped={**screen, **g.dropped})
    return out


# A candidate with the original's ops (the same count of each op type) whose estimate is within this of the
# original's is not timed: what differs (a name, a folded shape constant, an order) onnxruntime's own graph
# optimisations at session creation make the same, so its rounds would only measure noise, at ~2 s a graph a
# round on bert-base
SCREEN_TOLERANCE = 0.005


def screened(original: Graph, candidates: list[Candidate], estimated: Mapping[str, float]) -> dict[str, str]:
    """label -> why it is not timed: the candidates with the original's ops estimated within SCREEN_TOLERANCE
    of it (`estimated`: label -> the cost model's speed-up). Screening only leaves the original in their
    place: nothing is written that was not measured faster."""
    from collections import Counter

    ops = Counter((n.domain, n.op) for n in original.nodes.values())
    out = {}
    for c in candidates:
        est = estimated[c.label]
        if abs(est - 1) <= SCREEN_TOLERANCE and Counter((n.domain, n.op) for n in c.written.nodes.values()) == ops:
            out[c.label] = f"screened, not timed: the original's ops, estimated {est:.3f}x"
    return out


def measured_of(w: Written, loaded: LoadedModel, dep: Deployment, measure: str | None, *, rounds: int,
                max_rounds: int) -> MeasuredSpeedup | OriginalMeasurement | None:
    """The written file against the original, measured: the guard's timing of it where the guard ran (the
    original's own: speed-up 1, the A/A control's interval and verdict), else with `measure` (an e2e engine)
    a timing of its own, with an A/A control of the original in every round; None when neither."""
    if w.guard is not None:
        return w.guard.written_measurement()
    if measure is None:
        return None
    from xrl.cost.speedup import measure_speedup

    return measure_speedup(dep.measure_timer(measure), loaded.graph, w.written, rounds=rounds, control=True,
                           max_rounds=max_rounds)
