"""A search's result as the file it would write: exported once, read back, verified (`Candidate`).

The deployment path's guard candidates (`xrl.deploy.candidates`) and `xrl compare`'s runs
(`xrl.search.compare.run_one`) both make their files here, so what is costed, verified and timed is
what would be written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx

from xrl.cost.guard import GuardCandidate
from xrl.frontends.prepass import PassReport
from xrl.ir import Graph


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
    note: PassReport | None = None

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


