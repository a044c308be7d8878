"""What the guard chooses among: one typed record per result, each carrying its own file and rewrites.

Every candidate's file is exported once and verified against the original's outputs before it is timed
(what would be written is what is timed); the winner is written from its own record, so no caller
dispatches on its label.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xrl.frontends.prepass import PassReport
from xrl.ir import Graph

# the record and its export live with the searches: `xrl compare` makes its files the same way
from xrl.search.exported import Candidate, exported

if TYPE_CHECKING:
    from xrl.deploy.deployment import Deployment
    from xrl.deploy.search import Searched
    from xrl.deploy.starts import Starts


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
    from xrl.search.registry import get_search, run_search

    cost = deployment.cost_model
    # a target's kernels timed on this machine (the declared hooks); its roofline is the same target's estimate
    if not get_search(search).roofline_alternative or cost.target is None or cost.timing_device() is None:
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
        note = PassReport("(all)", True, st.original_nodes, len(prepassed),
                          "kept after all: the guard measured the pre-passes' result fastest")
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
