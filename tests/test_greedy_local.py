"""Issue 35, item 2: greedy under the measured kernel cost re-costs only what a rewrite changed.

`MeasuredKernelCostModel.local_cost` plans and prices again only the kernels near a rewrite (the parent's other
kernels keep their costs); every candidate's local cost must equal its whole graph's, on CNNs and transformers
(views, which the fusions look through, GatherToSplit and MatMulTranspose across a rewrite included), and greedy
must take the same steps either way. Timings are a stub keyed by the kernel model's key (nothing runs)."""

from __future__ import annotations

import math

import pytest

from xrl.cost import MeasuredKernelCostModel
from xrl.cost.base import Measurement
from xrl.cost.kernel_measured import RunOverhead
from xrl.frontends.loader import load_model
from xrl.ir import Graph
from xrl.rewrite import RewriteEngine
from xrl.search import greedy
from xrl.search.greedy import greedy_search, rewrite_seeds

GRAPHS = ("tiny_cnn", "squeezenet", "fam_repvgg_ts", "fam_attn_mha_ts", "fam_lora_encoder_ts", "fam_llama_dynamo")


class StubTimings(MeasuredKernelCostModel):
    """The measured model with a made-up timing per kernel model key (as in test_costing_speed)."""

    def __init__(self, tmp_path) -> None:  # noqa: ANN001
        super().__init__(target="ort-cpu", cache_path=tmp_path / "kernels.sqlite")
        self._overhead = RunOverhead(3e-5, 1e-6)

    def _timing_of(self, key: str, roofline=None) -> Measurement:  # noqa: ANN001
        return Measurement(int(key[:8], 16) * 1e-12 + 1e-6, 1, 0.0)


def graph_of(name: str) -> Graph:
    m = load_model(name)
    return m.graph if hasattr(m, "graph") else m


@pytest.mark.parametrize("name", GRAPHS)
def test_every_candidate_costs_locally_as_its_whole_graph(name: str, tmp_path) -> None:  # noqa: ANN001
    g = graph_of(name)
    model = StubTimings(tmp_path)
    plan = model.plan_costs(g)
    assert math.isclose(plan.total, model.cost(g), rel_tol=1e-12)
    cands = RewriteEngine.default().candidates(g, original_nodes=len(g))
    assert cands
    for c in cands:
        local = model.local_cost(plan, c.skeleton, rewrite_seeds(c))
        whole = StubTimings(tmp_path).cost(c.skeleton)
        assert local is not None and math.isclose(local, whole, rel_tol=1e-9), c.step


@pytest.mark.parametrize("name", ["fam_repvgg_ts", "fam_lora_encoder_ts"])
def test_greedy_takes_the_same_steps_with_local_costing(name: str, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    g = graph_of(name)
    local = greedy_search(g, StubTimings(tmp_path), max_steps=6)
    monkeypatch.setattr(greedy, "LOCAL_COSTING", False)
    whole = greedy_search(g, StubTimings(tmp_path), max_steps=6)
    assert local.steps == whole.steps and local.steps
    assert math.isclose(local.cost, whole.cost, rel_tol=1e-12)
