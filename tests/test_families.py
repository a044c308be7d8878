"""The deployment families (graphs/families, issue 23): small members build with both torch exporters,
run under onnxruntime, their limits compute what the originals compute, builds are deterministic, and
xrl's default optimisation of a small member verifies.

Fast set: every member with the TorchScript exporter, one member per family (REPRESENTATIVE) with
dynamo too (a dynamo export takes 2-5 s); the other members' dynamo exports are marked slow and run
only with XRL_SLOW_TESTS=1 (they would add a minute to `make test` on two cores).
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from xrl.graphs import families as F

from xrl import graphs
from xrl.cost.runtime_fusion import VIEW_OPS

pytest.importorskip("torch")

SMALL = F.members("small")  # the deployment models (family deploy) have sizes tiny and base
FAST = [(m, "ts") for m in SMALL] + [(m, "dynamo") for m in F.REPRESENTATIVE.values()]
SLOW_ONLY = pytest.mark.skipif(not os.environ.get("XRL_SLOW_TESTS"), reason="slow: set XRL_SLOW_TESTS=1")
SLOW = [pytest.param(m, "dynamo", marks=[pytest.mark.slow, SLOW_ONLY]) for m in SMALL
        if m not in F.REPRESENTATIVE.values()]
CASES = FAST + SLOW


def _ids(case) -> str:
    values = case.values if hasattr(case, "values") else case
    return f"{values[0]}-{values[1]}"


def _histogram(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def test_registry_lists_every_member_for_both_exporters_and_sizes() -> None:
    small, full = graphs.names("families"), graphs.names("families_full")
    assert small == [f"fam_{m}_{e}" for m in SMALL for e in ("ts", "dynamo")]
    assert full == [f"fam_{m}_full_{e}" for m in F.members("full") for e in ("ts", "dynamo")]
    assert set(F.MEMBERS.values()) == set(F.FAMILIES)
    for family in F.FAMILIES:  # the static table agrees with the family modules
        assert tuple(m for m, f in F.MEMBERS.items() if f == family) == F.family_module(family).MEMBERS
    for name in small + full:
        g = graphs.BUILTIN_GRAPHS[name]
        assert g.family in ("transformer", "cnn") and g.description
    assert set(F.REPRESENTATIVE) == {F.MEMBERS[m] for m in SMALL} == set(F.LIMIT_FAMILIES)


@pytest.mark.parametrize(("member", "exporter"), CASES, ids=[_ids(c) for c in CASES])
def test_small_member_builds_runs_and_its_limit_matches(member: str, exporter: str) -> None:
    model = graphs.build(f"fam_{member}_{exporter}")
    onnx.checker.check_model(model)
    opset = {o.domain: o.version for o in model.opset_import}[""]
    assert opset == (17 if exporter == "ts" else 18)
    assert model.graph.name == f"fam_{member}_{exporter}"
    for value in model.graph.input:  # static shapes, batch 1 (an adapter's first dimension is its rank)
        dims = value.type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") for d in dims)
        assert dims[0].dim_value == 1 or value.name.startswith("lora_")
    feeds = F.input_feeds(member, "small", seed=1)
    assert [i.name for i in model.graph.input] == list(feeds)
    (out,) = F.run(model, feeds)
    assert np.isfinite(out).all() and 0.05 < float(out.std()) < 10.0
    err = F.verify_limit(member, "small", exporter)  # raises beyond rtol 1e-4 / atol 1e-4 x scale
    limit = F.build_onnx(member, "small", exporter, limit=True)
    if F.limit_kind(member) == "exact":
        assert len(limit.graph.node) < len(model.graph.node) or _histogram(limit) != _histogram(model), \
            "an exact limit must change the graph"
        assert err < 1e-4
    else:
        assert err == 0.0


def test_weights_look_trained() -> None:
    """Non-zero biases, non-unit norm scales, calibrated BatchNorm statistics, non-zero LoRA B."""
    import torch

    enc = F.build_module("lora_encoder", "small").module
    lin = enc.layers[0].attn.query
    assert lin.base_layer.bias.abs().min() > 0 and lin.lora_B.weight.abs().max() > 0
    assert not torch.allclose(enc.layers[0].ln1.weight, torch.ones(64))
    cnn = F.build_module("repvgg", "small").module
    bn = cnn.stage0.rbr_dense.bn
    assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    assert not torch.allclose(bn.running_mean, torch.zeros_like(bn.running_mean))
    assert not torch.allclose(bn.weight, torch.ones_like(bn.weight))
    llama = F.build_module("llama", "small").module
    assert not torch.allclose(llama.norm.weight, torch.ones(64))


def test_adapters_as_inputs_stay_inputs() -> None:
    model = graphs.build("fam_lora_server_ts")
    names = [i.name for i in model.graph.input]
    adapters = [n for n in names if n.startswith("lora_")]
    assert len(adapters) == 8 and not any(t.name.startswith("lora_") for t in model.graph.initializer)
    assert F.limit_kind("lora_server") == "plain"
    # they change the output: a request's adapter matters
    feeds = F.input_feeds("lora_server", "small", seed=1)
    (a,) = F.run(model, feeds)
    (b,) = F.run(model, {k: (v * 0 if k.startswith("lora_") else v) for k, v in feeds.items()})
    assert np.abs(a - b).max() > 1e-4


@pytest.mark.parametrize("exporter", ["ts", pytest.param("dynamo", marks=[pytest.mark.slow, SLOW_ONLY])])
def test_same_seed_gives_byte_identical_exports(exporter: str) -> None:
    from xrl.graphs.families.export import export

    def digest(seed: int) -> str:
        built = F.build_module("repvgg", "small", seed)
        return hashlib.sha256(export(built.module, built.inputs, built.outputs, exporter).SerializeToString()
                              ).hexdigest()

    assert digest(0) == digest(0)
    assert digest(0) != digest(1)


def test_batch_and_seed_change_the_model() -> None:
    one = graphs.build("fam_attn_bert_ts")
    two = graphs.build("fam_attn_bert_ts", batch=2, seed=1)
    assert two.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2
    w1 = {t.name: onnx.numpy_helper.to_array(t) for t in one.graph.initializer}
    w2 = {t.name: onnx.numpy_helper.to_array(t) for t in two.graph.initializer}
    assert any(k in w2 and w1[k].shape == w2[k].shape and not np.array_equal(w1[k], w2[k]) for k in w1)


# --------------------------------------------------------------------------- xrl on the families

XRL_CASES = [(m, "ts") for m in F.REPRESENTATIVE.values()] + [(F.REPRESENTATIVE["lora"], "dynamo")]


@pytest.fixture(scope="module")
def optimized(tmp_path_factory) -> dict:
    return {}


def _optimize(cache: dict, member: str, exporter: str, limit: bool = False, time_limit: float = 60) -> tuple:
    from xrl.api import optimize

    key = (member, exporter, limit)
    if key not in cache:
        tmp = Path(tempfile_dir()) / f"{member}-{exporter}-{'limit' if limit else 'orig'}.onnx"
        src = tmp.with_name(tmp.stem + "-src.onnx")
        onnx.save(F.build_onnx(member, "small", exporter, limit=limit), str(src))
        result = optimize(str(src), search="greedy", output=str(tmp), force=True, time_limit=time_limit)
        cache[key] = (result, onnx.load(str(tmp)))
    return cache[key]


_TMP: list = []


def tempfile_dir() -> str:
    import tempfile

    if not _TMP:
        _TMP.append(tempfile.TemporaryDirectory(prefix="xrl-test-families-"))
    return _TMP[0].name


@pytest.mark.parametrize(("member", "exporter"), XRL_CASES, ids=[f"{m}-{e}" for m, e in XRL_CASES])
def test_default_optimisation_of_a_small_member_verifies(member: str, exporter: str, optimized: dict) -> None:
    result, model = _optimize(optimized, member, exporter)
    assert result.verified and result.max_abs_err < 1e-3
    assert result.optimized_nodes <= result.original_nodes
    feeds = F.input_feeds(member, "small", seed=2)
    (want,) = F.run(F.build_onnx(member, "small", exporter), feeds)
    (got,) = F.run(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(want).max())))


# What still stops a family from reaching its limit's graph (issue 23); empty when every representative reaches
# it. lora_encoder reaches it with both exporters: its adapters are merged before the pre-passes
# (xrl.deploy.exact_merges), so onnxruntime's transformers optimizer fuses the same Attention and BiasGelu in
# both; llama with the RMSNorm, SkipRMSNorm and rotary fusions.
NOT_YET: dict[str, str] = {}
LIMIT_CASES = [pytest.param(m, e, marks=pytest.mark.xfail(strict=True, reason=NOT_YET[m])) if m in NOT_YET
               else (m, e) for m, e in XRL_CASES]


def reaches(model: onnx.ModelProto, limit: onnx.ModelProto) -> bool:
    """The same compute ops as the limit's, and no more of the free views (Reshape, Squeeze, ...) than it
    has: attn_bert's packed Linear keeps a 3-D view before its Split that xrl's output of the original
    does without, and a view costs nothing, so no search removes it from the limit's."""
    got, want = _histogram(model), _histogram(limit)
    compute = {op for op in got | want if op not in VIEW_OPS}
    return all(got[op] == want[op] for op in compute) and all(got[op] <= want[op] for op in VIEW_OPS)


@pytest.mark.parametrize(("member", "exporter"), LIMIT_CASES, ids=[f"{m}-{e}" for m, e in XRL_CASES])
def test_default_optimisation_reaches_the_limits_op_histogram(member: str, exporter: str, optimized: dict) -> None:
    """xrl's output of the original has the op histogram of xrl's output of the hand-merged limit (both
    through the same pre-passes, so fusions both get do not count)."""
    _, model = _optimize(optimized, member, exporter)
    _, limit = _optimize(optimized, member, exporter, limit=True)
    assert reaches(model, limit), (_histogram(model), _histogram(limit))


# --------------------------------------------------------------------------- lora_decoder

# lora_decoder (issue 23): xrl's search merges every adapter (merge_lowrank_linear_scaled on the 12 adapted
# Linears) and packs q/k/v (merge_linear_3), which is exactly xrl's output of the merged limit: the same op
# histogram. Through the default pre-passes the two can differ, but only in forms the pre-passes write:
# onnxruntime's transformers optimizer writes a residual Add and the LayerNormalization after it as one
# SkipLayerNormalization, and onnxslim a 3-D MatMul and its bias Add as Reshape-Gemm-Reshape. xrl keeps a
# pre-passed graph only where its estimate says it is not slower than what the pre-passes started from: it
# keeps them on the original's import (then merges the adapters in the Gemm form, merge_lowrank_flat_gemm_*)
# and drops them on the limit's; on a loaded machine a pre-pass can also run out of its time budget and be
# skipped. `unfused` undoes exactly these two forms and leaves out the free views (Reshape, ...), so the
# default pipeline's outputs compare by the ops they compute. Measured against each other (experiments/
# check_limits.py --measure, docs/results.md) the two outputs are within the A/A noise.
LORA_DECODER = [pytest.param("ts", id="ts"), pytest.param("dynamo", id="dynamo", marks=[pytest.mark.slow, SLOW_ONLY])]


def unfused(model: onnx.ModelProto) -> Counter:
    """The op histogram with SkipLayerNormalization counted as LayerNormalization + Add (+ Add of its bias
    input), Gemm as MatMul (+ Add of its bias), and the view ops left out."""
    out: Counter = Counter()
    for n in model.graph.node:
        inputs = [v for v in n.input if v]
        if n.op_type == "SkipLayerNormalization":
            out.update({"LayerNormalization": 1, "Add": 1 + (len(inputs) >= 5)})
        elif n.op_type == "Gemm":
            out.update({"MatMul": 1, "Add": int(len(inputs) >= 3)})
        elif n.op_type not in VIEW_OPS:
            out[n.op_type] += 1
    return +out


def test_unfused_counts_what_the_prepass_forms_compute() -> None:
    from onnx import helper

    nodes = [helper.make_node("SkipLayerNormalization", ["x", "r", "g", "b"], ["y"], domain="com.microsoft"),
             helper.make_node("SkipLayerNormalization", ["x", "r", "g", "b", "bias"], ["z"], domain="com.microsoft"),
             helper.make_node("Reshape", ["y", "s"], ["y2"]), helper.make_node("Gemm", ["y2", "w", "c"], ["u"]),
             helper.make_node("Gemm", ["y2", "w"], ["v"]), helper.make_node("Relu", ["v"], ["o"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [], []))
    assert unfused(model) == Counter({"LayerNormalization": 2, "Add": 4, "MatMul": 2, "Relu": 1})


@pytest.mark.parametrize("exporter", LORA_DECODER)
def test_lora_decoders_search_reaches_the_merged_limits_graph(exporter: str) -> None:
    """Without pre-passes: the same op histogram as xrl's output of the merged limit, and it verifies."""
    from xrl.api import optimize

    res, lim = (optimize(F.build_onnx("lora_decoder", "small", exporter, limit=limit), search="greedy",
                         time_limit=60, prepass=()) for limit in (False, True))
    assert res.verified and res.max_abs_err < 1e-3
    assert _histogram(res.model) == _histogram(lim.model)
    assert sum(s.startswith("merge_lowrank") for s in res.steps) == 12  # every adapter merged


@pytest.mark.slow
@SLOW_ONLY
@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_lora_decoders_default_optimisation_reaches_the_limit_up_to_the_prepass_forms(exporter: str,
                                                                                    optimized: dict) -> None:
    result, model = _optimize(optimized, "lora_decoder", exporter)
    _, limit = _optimize(optimized, "lora_decoder", exporter, limit=True)
    assert result.verified and result.max_abs_err < 1e-3
    assert unfused(model) == unfused(limit), (_histogram(model), _histogram(limit))


def _adapter_paths(model: onnx.ModelProto) -> Counter:
    """For each adapter input (a multi-LoRA server's `lora_*`), the op types two steps downstream of it."""
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    out: Counter = Counter()
    for value in (i.name for i in model.graph.input if i.name.startswith("lora_")):
        for first in consumers.get(value, []):
            for second in (c for o in first.output for c in consumers.get(o, [])):
                out[(value, first.op_type, second.op_type)] += 1
    return out


def test_the_default_optimisation_changes_nothing_adapters_as_inputs_touch() -> None:
    """Issue 23: where adapters are graph inputs (one request's adapter each), nothing may merge them; the
    default optimisation (pre-passes, exact merges, search) leaves every adapter's products as they were."""
    from xrl.api import optimize

    model = graphs.build("fam_lora_server_ts")
    res = optimize(model, time_limit=60)
    assert res.verified and not any(s.startswith("merge_lowrank") for s in res.steps)
    assert _adapter_paths(res.model) == _adapter_paths(model) != Counter()
