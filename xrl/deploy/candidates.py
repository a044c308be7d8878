"""What the guard chooses among: one typed record per result, each carrying its own file and rewrites.

Every candidate's file is exported once and verified against the original's outputs before it is timed
(what would be written is what is timed); the winner is written from its own record, so no caller
dispatches on its label.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import onnx

from xrl.cost.guard import GuardCandidate
from xrl.ir import Graph

if TYPE_CHECKING:
    from xrl.deploy.deployment import Deployment
    from xrl.deploy.search import Searched
    from xrl.deploy.starts import Starts


@dataclass
class Candidate:
    label: str  # the guard's name for it: "search", "pre-pass", "pre-pass onnxslim", a search's label, ...
    graph: Graph  # the graph its file is exported from
    written: Graph  # that file read back: what the guard times and the reported cost is taken of
    head: onnx.ModelProto  # the file: a head whose weights are `weights` (the graph's own arrays, not copies)
    weights: dict[str, Any]
    steps: list[Any] = field(default_factory=list)  # its rewrites, from the original
    # a pre-pass report to add where this one is written (the pre-passes' result dropped by the estimate
    # and kept by the measurement says so)
    note: dict[str, Any] | None = None

    def guard(self) -> GuardCandidate:
        return GuardCandidate(self.label, self.written)


def exported(label: str, graph: Graph, steps: list[Any], ref: Any = None, *, head: onnx.ModelProto | None = None,
             weights: dict[str, Any] | None = None, check: bool = True) -> Candidate | None:
    """`graph` as a candidate: its file exported (unless given, `head` and `weights`) and read back; None
    where, with `check`, that file does not compute what the original does (`ref`: the original's outputs)."""
    from xrl.frontends.onnx_io import from_onnx, to_onnx
    from xrl.frontends.verify import compare_models

    if head is None:
        weights = {}
        head = to_onnx(graph, external=weights)
    weights = weights if weights is not None else {}
    if check and not compare_models(ref, head, external=weights).ok:
        return None
    return Candidate(label, graph, from_onnx(head, name=graph.name, external=weights), head, weights, list(steps))


def chosen(candidates: list[Candidate], label: str) -> Candidate | None:
    """The candidate the guard chose by its label; None: the original."""
    return next((c for c in candidates if c.label == label), None)


def roofline_label(search: str) -> str:
    """The guard's label for a search's result under the roofline (`roofline_alternative`)."""
    return f"{search} under the roofline"


def roofline_alternative(search: str, start: Graph, deployment: Deployment, *, seed: int, steps: int | None,
                         time_limit: float | None, ref: Any) -> Candidate | None:
    """A second candidate for the guard when a search registered with `roofline_alternative` (greedy, the
    default) ran under measured kernel costs: the same search under the same kernels' roofline. Neither
    estimate ranks every rewrite as the machine does
    (experiments/measured_tables.py: on the headroom suite each cost's greedy is measured ahead on
    some graphs), and greedy is cheap, so the guard times both results and keeps the faster.
    Returns the verified candidate (its rewrites from `start`), or None."""
    from xrl.cost.kernel_measured import MeasuredKernelCostModel
    from xrl.search.registry import get_search, run_search

    if not get_search(search).roofline_alternative or not isinstance(deployment.cost_model, MeasuredKernelCostModel):
        return None
    outcome = run_search(search, start, deployment.cost_of("roofline"), seed=seed, steps=steps,
                         time_limit=time_limit, options={})
    return exported(roofline_label(search), outcome.graph.validate(), list(outcome.steps), ref)


def guard_candidates(search: str, st: Starts, sr: Searched, dep: Deployment, *, seed: int,
                     steps: int | None) -> list[Candidate]:
    """The candidates stage: every result the guard times, each with its own file and rewrites (they share
    the weights they did not change: export and import pass the arrays, not copies). The guard's order: the
    pre-passes' result, the search's, each peer's alone, the other searches'."""
    prepassed, base, merged, ref = st.prepassed, st.base, st.merged, st.ref
    note = None
    if sr.start is not prepassed:  # dropped by the estimate, kept by the measurement: say so if written
        note = {"name": "(all)", "applied": True, "nodes_before": st.original_nodes, "nodes_after": len(prepassed),
                "detail": "kept after all: the guard measured the pre-passes' result fastest"}
    pre = [c for c in ([exported("pre-pass", prepassed, merged, ref)] if prepassed is not base else [])
           if c is not None]
    for c in pre:
        c.note = note
    candidates = [*pre, sr.result, *(c for c in (exported(label, graph, merged, ref) for label, graph in st.peers)
                                     if c is not None)]
    alternative = roofline_alternative(search, sr.start, dep, seed=seed, steps=steps, time_limit=sr.time_limit,
                                       ref=ref)
    if alternative is not None:
        alternative.steps = [*merged, *alternative.steps]
    return [*candidates, *sr.others, *([alternative] if alternative is not None else [])]
