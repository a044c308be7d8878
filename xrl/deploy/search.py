"""The search stage of the deployment path: the search from the starts, its file exported and verified.

Where the pre-passes' result fails verification the search runs again from what they were given; where it
measured slower (the starts' pre-check) the search runs from both, and the second result is another of the
guard's candidates.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xrl.deploy.deployment import Deployment
from xrl.deploy.starts import Starts
from xrl.errors import VerificationError
from xrl.frontends.prepass import PassReport
from xrl.ir import Graph
from xrl.search.exported import Candidate
from xrl.search.exported import exported as exported_candidate
from xrl.search.registry import run_search

SEARCH_WITHOUT_PREPASSES = "search without the pre-passes"  # the guard's label for it (where they measure slower)


@dataclass
class Searched:
    result: Candidate  # the search's best, its file exported, read back and verified ("search")
    start: Graph  # where it ran from (the starts' `start`, or `base` where the pre-passes failed verification)
    max_abs_err: float  # its verification's
    details: dict[str, Any]  # the search's own report
    time_limit: float | None  # what the time limit left the searches after the starts
    others: list[Candidate] = field(default_factory=list)  # the search's result without the pre-passes


def search_stage(search: str, st: Starts, dep: Deployment, *, seed: int, steps: int | None,
                 time_limit: float | None, options: Mapping[str, Any] | None, began: float, name: str) -> Searched:
    """Run `search` from `st.start` under the deployment's cost model, within what `time_limit` left since
    `began` (the starts' share came out of it); `name`: the model's, for the file read back. Raises
    VerificationError where its file fails verification."""
    from xrl.frontends.onnx_io import from_onnx, to_onnx
    from xrl.frontends.verify import compare_models
    from xrl.search.progress import DEFAULT_TIME_LIMIT_S

    cost_model, start, base, merged = dep.cost_model, st.start, st.base, st.merged
    if time_limit is not None and time_limit != float("inf"):
        time_limit = max(time_limit - (time.perf_counter() - began), 1.0)
    # kernels not yet timed when the search's time is up: the scaled roofline (estimates ignore it)
    cost_model.deadline = time.monotonic() + (time_limit if time_limit is not None else DEFAULT_TIME_LIMIT_S)
    while True:
        outcome = run_search(search, start, cost_model, seed=seed, steps=steps, time_limit=time_limit,
                             options=options or {})
        best = outcome.graph.validate()
        # the file's model: a head whose weights are the graph's own arrays (no copy of them)
        weights: dict = {}
        exported = to_onnx(best, external=weights)
        check = compare_models(st.ref, exported, external=weights)
        if check.ok or start is base:
            break
        # a pre-pass changed what the model computes (beyond float32 tolerance): search without them
        st.reports.append(PassReport("(all)", False, len(start), len(start),
                                     f"dropped: failed verification ({check.detail})"))
        start = base
    others: list[Candidate] = []
    if st.pre_slower is not None and start is not base:
        st.reports.append(PassReport("(all)", True, st.original_nodes, len(start),
                                     f"measured {st.pre_slower:.3f}x what they were given: the search ran from "
                                     f"both"))
        cost_model.deadline = time.monotonic() + (time_limit if time_limit is not None else DEFAULT_TIME_LIMIT_S)
        too = run_search(search, base, cost_model, seed=seed, steps=steps, time_limit=time_limit,
                         options=options or {})
        candidate = exported_candidate(SEARCH_WITHOUT_PREPASSES, too.graph.validate(), [*merged, *too.steps],
                                       st.ref)
        if candidate is not None:
            others.append(candidate)
    # What is reported is the file: its cost is that of the exported model read back, never the search's
    written = from_onnx(exported, name=name, external=weights)
    if not check.ok:
        raise VerificationError(f"the optimised graph does not compute what the original computes "
                                f"({check.detail}); nothing was written. Please report this with the model.")
    result = Candidate("search", best, written, exported, weights, [*merged, *outcome.steps])
    return Searched(result, start, check.max_abs_err, outcome.details, time_limit, others)
