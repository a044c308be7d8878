"""Issue 32, item 1: every composite rule's result is reached by elementary rules alone.

On each family's representative (PEFT LoRA on 3-D inputs from both torch exporters, the 2-D nn.Linear Gemm forms
both exporters write, onnxslim's Reshape-Gemm-Reshape form, RepVGG, ACNet, DBB and MobileOne blocks), the
default optimisation (greedy over all rules) is replayed; at each composite step, a breadth-first search over the
elementary rules (`xrl.rewrite.decompose.elementary_route`) must reach a graph with the composite's structure,
the same analytic cost, and the same outputs under the reference executor.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from xrl.cost import get_cost_model
from xrl.frontends.loader import load_model
from xrl.frontends.onnx_io import from_onnx
from xrl.ir import Graph
from xrl.ir.execute import execute
from xrl.rewrite import RewriteEngine, load_rules
from xrl.rewrite.decompose import elementary_route, structure

COST = get_cost_model("target", target="paper")


@pytest.fixture(scope="module")
def engines() -> tuple[RewriteEngine, RewriteEngine]:
    return RewriteEngine(load_rules(rule_set="all")), RewriteEngine(load_rules(rule_set="elementary"))


def _lora_2d(form: str, batch: int = 4, din: int = 32, dout: int = 24, rank: int = 4, seed: int = 0) -> Graph:
    """One nn.Linear with a PEFT adapter on a matrix, as the exporters write it: `ts` Gemm + (x A) B * s with
    MatMuls, `dynamo` Gemm + bias-free Gemms, `flat` onnxslim's Reshape-Gemm-Reshape base on a 3-D input."""
    from xrl.graphs.builder import OnnxBuilder

    b = OnnxBuilder(f"lora_{form}", seed)
    x = b.input("x", (batch, 3, din) if form == "flat" else (batch, din))
    w = b.weight((dout, din), 1 / math.sqrt(din), "weight")
    bias = b.weight((dout,), 0.02, "bias")
    if form == "flat":
        f = b.reshape(x, (batch * 3, din))
        base = b.reshape(b.node("Gemm", [f, w, bias], (batch * 3, dout), transB=1), (batch, 3, dout))
    else:
        base = b.node("Gemm", [x, w, bias], (batch, dout), transB=1)
    if form == "dynamo":
        a = b.weight((rank, din), 1 / math.sqrt(din), "lora_A")
        c = b.weight((dout, rank), 0.05, "lora_B")
        low = b.node("Gemm", [b.node("Gemm", [x, a], (batch, rank), transB=1), c], (batch, dout), transB=1)
    else:
        a = b.weight((din, rank), 1 / math.sqrt(din), "lora_A")
        c = b.weight((rank, dout), 0.05, "lora_B")
        low = b.matmul(b.matmul(x, a), c)
    b.output(b.relu(b.add(base, b.mul(low, b.scalar(2.0)))), "y")
    return from_onnx(b.model(), name=f"lora_{form}")


def _outputs(graph: Graph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in graph.inputs:
        t = graph.types[v]
        feeds[v] = (rng.standard_normal(t.shape) if t.dtype.startswith("float")
                    else np.zeros(t.shape)).astype(t.dtype)
    return execute(graph, feeds)


def _check_composites(graph: Graph, engines: tuple[RewriteEngine, RewriteEngine], expected: set[str]) -> set[str]:
    """Replay greedy over all rules; at the first step of each composite rule, route it with elementary rules."""
    full, elementary = engines
    kinds = {r.name: r.kind for r in (*full.rules, *elementary.rules)}
    done: set[str] = set()
    cost = COST.cost(graph)
    for _ in range(200):
        cands = full.candidates(graph)
        if not cands:
            break
        costs = [COST.cost(c.skeleton) for c in cands]
        i = int(np.argmin(costs))
        if costs[i] >= cost * (1 - 1e-9):
            break
        best = cands[i]
        if kinds[best.rule] == "composite" and best.rule not in done:
            route = elementary_route(graph, best, elementary)
            assert route is not None, f"{graph.name}: no elementary route to {best.step}"
            assert all(kinds[s.split("@")[0]] == "elementary" for s in route.steps)
            assert structure(route.graph) == structure(best.graph)
            assert COST.cost(route.graph) == pytest.approx(COST.cost(best.graph), rel=1e-9)
            for got, want in zip(_outputs(route.graph), _outputs(best.graph), strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())))
            done.add(best.rule)
        graph, cost = best.graph, costs[i]
    assert done >= expected, f"{graph.name}: composites {sorted(expected - done)} never applied"
    return done


@pytest.mark.parametrize("form, rule", [("ts", "merge_lowrank_gemm_matmul_scaled"),
                                        ("dynamo", "merge_lowrank_gemm_scaled"),
                                        ("flat", "merge_lowrank_flat_gemm_scaled")])
def test_lora_linear_2d_forms(engines, form: str, rule: str) -> None:
    _check_composites(_lora_2d(form), engines, {rule})


@pytest.mark.parametrize("name, expected", [
    ("lora_tiny", {"merge_lowrank_matmul_scaled"}),
    ("multi_lora", {"merge_lowrank_linear_scaled", "merge_lowrank_matmul_scaled"}),
    ("fam_lora_encoder_ts", {"merge_lowrank_linear_scaled"}),
    ("fam_lora_decoder_dynamo", {"merge_lowrank_linear_scaled"}),
    ("fam_repvgg_ts", {"merge_sum_conv_kernels_bias", "merge_sum_conv_bn_input"}),
    ("fam_acnet_ts", {"merge_sum_conv_kernels_bias"}),
    ("fam_dbb_ts", {"merge_sum_conv_kernels_bias", "fold_channel_pad_bn_conv1x1", "merge_sum_conv_avgpool_conv1x1",
                    "factor_conv_bias_add_chain"}),
    ("fam_mobileone_ts", {"merge_sum_conv_kernels_bias", "merge_sum_conv_bn_input", "factor_conv_bias_add_chain"}),
])
def test_family_representatives(engines, name: str, expected: set[str]) -> None:
    _check_composites(load_model(name).graph, engines, expected)


def test_route_fails_without_the_bias_step(engines) -> None:
    """The bias move is what the 3-D merge needs: without it, no elementary route exists (so the test can fail)."""
    full, elementary = engines
    graph = load_model("multi_lora").graph
    comp = next(c for c in full.candidates(graph) if c.rule == "merge_lowrank_linear_scaled")
    without = RewriteEngine([r for r in elementary.rules if r.name != "move_bias_past_product"])
    assert elementary_route(graph, comp, without) is None
    assert elementary_route(graph, comp, elementary) is not None


def test_rmsnorm_fusion_route(engines) -> None:
    """The scaled RMSNorm fusions (onnxruntime's contrib op; `paper` prices it out, so greedy above never takes it)
    are fuse_rmsnorm_reciprocal then fold_rmsnorm_scale."""
    full, elementary = engines
    graph = load_model("fam_llama_dynamo").graph
    comp = next(c for c in full.candidates(graph) if c.rule == "fuse_rmsnorm_reciprocal_scaled")
    route = elementary_route(graph, comp, elementary)
    assert route is not None and [s.split("@")[0] for s in route.steps] == ["fuse_rmsnorm_reciprocal",
                                                                            "fold_rmsnorm_scale"]
    for got, want in zip(_outputs(route.graph), _outputs(comp.graph), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["fam_lora_dora_ts", "fam_lora_dora_dynamo"])
def test_dora_merge_route(engines, name: str) -> None:
    """PEFT's DoRA merge (merge_dora_linear) is reached by 8 elementary steps: reassociate the low-rank product,
    fold the scale, cancel the re-subtracted bias, move both column scales into their weights, factor the shared
    input, move the bias, factor again."""
    full, elementary = engines
    graph = load_model(name).graph
    comp = next(c for c in full.candidates(graph) if c.rule == "merge_dora_linear")
    route = elementary_route(graph, comp, elementary, max_depth=9, max_states=2000)
    assert route is not None, f"{name}: no elementary route to {comp.step}"
    kinds = {r.name: r.kind for r in elementary.rules}
    assert all(kinds[s.split("@")[0]] == "elementary" for s in route.steps)
    assert structure(route.graph) == structure(comp.graph)
    assert COST.cost(route.graph) == pytest.approx(COST.cost(comp.graph), rel=1e-9)
    for got, want in zip(_outputs(route.graph), _outputs(comp.graph), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())))
    # the column-scale step is what DoRA's magnitude needs: without it there is no route (so the test can fail)
    without = RewriteEngine([r for r in elementary.rules if r.name != "scale_matmul_weight_columns"])
    assert elementary_route(graph, comp, without, max_depth=9, max_states=2000) is None
