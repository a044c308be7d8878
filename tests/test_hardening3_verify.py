"""Issue 34 item 1: verification that cannot be silently off. No trial or no output compared is a failure,
never a pass; a candidate that computes something else is refused end to end (exit 2, no file), with the real
comparison (nothing here replaces `compare_models`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_helpers import assert_user_error, run

from xrl import api, graphs
from xrl.errors import ConfigError
from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.frontends.verify import ReferenceRun, compare_models, compare_to, reference_run
from xrl.ir import Graph, Node
from xrl.search import registry
from xrl.search.result import SearchResult


def plus_one(graph: Graph) -> Graph:
    """`graph` with 1 added to its first output: the same inputs and outputs, another computation."""
    out = graph.outputs[0]
    to = graph.type_of(out)
    types, weights = dict(graph.types), dict(graph.initializers)
    weights["plus_one_w"] = np.ones(to.shape, np.float32)
    types["plus_one_w"] = types["plus_one_y"] = to
    nodes = [*graph.nodes.values(), Node("plus_one", "Add", (out, "plus_one_w"), ("plus_one_y",))]
    return Graph(nodes, graph.inputs, ("plus_one_y", *graph.outputs[1:]), types, weights, name=graph.name,
                 output_names=graph.output_names, domain_opsets=graph.domain_opsets)


def plus_one_search(graph: Graph, cost, **_options):  # noqa: ANN001 - a search runner
    return SearchResult(graph=plus_one(graph), steps=["plus_one@out"])


def test_a_candidate_that_computes_something_else_is_refused_and_nothing_written(monkeypatch, capsys,
                                                                                 tmp_path: Path):
    monkeypatch.setitem(registry.searches(), "greedy", replace(registry.get_search("greedy"), runner=plus_one_search))
    src = tmp_path / "mlp.onnx"
    onnx.save(graphs.build("mlp"), src)
    out = tmp_path / "out.onnx"
    code, _, err = run(capsys, "optimize", str(src), "-o", str(out), "--prepass", "none", "--no-guard")
    assert_user_error(code, err, "does not compute what the original computes", "nothing was written")
    assert not out.exists() and not list(tmp_path.glob("out*"))


def test_the_comparison_refuses_a_different_model_and_passes_the_same():
    model = graphs.build("mlp")
    graph = from_onnx(model)
    other = to_onnx(plus_one(graph))
    assert compare_models(model, to_onnx(graph)).ok
    bad = compare_models(model, other)
    assert not bad.ok and bad.max_abs_err == pytest.approx(1.0, abs=1e-3) and "output 0" in bad.detail
    ref = reference_run(model, seed=3, trials=2)
    assert compare_to(ref, graph).ok and compare_to(ref, graph).trials == 2
    assert not compare_to(ref, other).ok


def test_comparing_nothing_is_a_failure_never_a_pass():
    model = graphs.build("mlp")
    graph = from_onnx(model)
    ref = reference_run(model, trials=1)
    for trials in (0, -1):
        res = compare_to(ref, graph, trials=trials)
        assert not res.ok and res.trials == 0 and "nothing was compared" in res.detail
        assert not compare_models(model, graph, trials=trials).ok
    empty = ReferenceRun(ref.specs, (), ref.names, ref.seed)  # no stored trial
    assert not compare_to(empty, graph).ok
    no_outputs = ReferenceRun(ref.specs, ((),), (), ref.seed)
    assert not compare_to(no_outputs, graph).ok
    with pytest.raises(ConfigError, match="at least 1 trial"):
        reference_run(model, trials=0)


@pytest.mark.parametrize("trials", [0, -2])
def test_verify_trials_below_one_is_refused(trials: int):
    with pytest.raises(ConfigError, match="verify_trials"):
        api.optimize("mlp", verify_trials=trials, guard=False, prepass=())
