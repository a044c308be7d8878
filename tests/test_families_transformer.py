"""The transformer families meet onnxruntime's contrib ops (issue 23): RMSNorm and the residual Add before it
fuse into SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization where the target runs them (ort-cpu)
and never where it does not (paper); the IR's numpy semantics of those ops are onnxruntime's; a model the
transformers optimizer fused imports (its SimplifiedLayerNormalization outputs come back untyped); the
default optimisation of both llama exports reaches its limit's op histogram and verifies.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from xrl.cost.targets import get_target
from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.ir.execute import execute

pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from xrl.graphs import families as F  # noqa: E402

RMS_OPS = {"SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"}
CONTRIB_OPS = RMS_OPS | {"RotaryEmbedding"}
NORM_PATTERN = {"Pow", "ReduceMean", "Sqrt"}


def _histogram(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def _ort_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _contrib_model(hidden: int = 24) -> onnx.ModelProto:
    """SimplifiedLayerNormalization, then SkipSimplifiedLayerNormalization of its output and a skip input."""
    rng = np.random.default_rng(3)
    g = rng.standard_normal(hidden).astype(np.float32)
    g2 = rng.standard_normal(hidden).astype(np.float32)
    nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y", "inv"], axis=-1, epsilon=1e-6,
                              stash_type=1),
             helper.make_node("SkipSimplifiedLayerNormalization", ["y", "s", "g2"], ["z", "mean", "inv2", "sum"],
                              domain="com.microsoft", epsilon=1e-5)]
    vi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, None)  # noqa: E731
    shape = [2, 5, hidden]
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name in ("x", "s")]
    weights = [onnx.numpy_helper.from_array(g, "g"), onnx.numpy_helper.from_array(g2, "g2")]
    graph = helper.make_graph(nodes, "contrib", inputs, [vi("y"), vi("inv"), vi("z"), vi("inv2"), vi("sum")],
                              initializer=weights)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def test_numpy_semantics_of_the_rmsnorm_contrib_ops_match_onnxruntime() -> None:
    """The reference executor (which verifies every rule) computes what onnxruntime's kernels compute, and the
    ops round-trip through import and export with their domains (SkipSimplified in com.microsoft)."""
    model = _contrib_model()
    graph = from_onnx(model)  # untyped contrib outputs: the IR types them
    assert graph.type_of("z").shape == (2, 5, 24) and graph.type_of("inv2").shape == (2, 5, 1)
    rng = np.random.default_rng(0)
    for trial in range(3):
        feeds = {"x": (rng.standard_normal((2, 5, 24)) * (1 + trial)).astype(np.float32),
                 "s": rng.standard_normal((2, 5, 24)).astype(np.float32)}
        want = _ort_run(model, feeds)
        got = execute(graph, feeds)
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    written = to_onnx(graph)
    domains = {n.op_type: n.domain for n in written.graph.node}
    assert domains == {"SimplifiedLayerNormalization": "", "SkipSimplifiedLayerNormalization": "com.microsoft"}
    assert {o.domain for o in written.opset_import} == {"", "com.microsoft"}
    for w, g in zip(_ort_run(model, feeds), _ort_run(written, feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_numpy_semantics_of_rotary_embedding_match_onnxruntime(interleaved: int) -> None:
    """RotaryEmbedding (com.microsoft) on (batch, heads, sequence, head size), positions from an offset and from
    a (batch, sequence) table, rotate-half and interleaved: the reference executor against onnxruntime."""
    rng = np.random.default_rng(interleaved)
    b, n, s, d = 2, 3, 5, 8
    cos = rng.standard_normal((7, d // 2)).astype(np.float32)
    sin = rng.standard_normal((7, d // 2)).astype(np.float32)
    for pos in (np.array([2], np.int64), rng.integers(0, 7, size=(b, s)).astype(np.int64)):
        node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft",
                                interleaved=interleaved)
        weights = [onnx.numpy_helper.from_array(a, name) for a, name in ((pos, "pos"), (cos, "cos"), (sin, "sin"))]
        graph = helper.make_graph([node], "rope", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, n, s, d])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=weights)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        x = rng.standard_normal((b, n, s, d)).astype(np.float32)
        imported = from_onnx(model)
        np.testing.assert_allclose(execute(imported, {"x": x})[0], _ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
        assert [(n.op_type, n.domain) for n in to_onnx(imported).graph.node] == [("RotaryEmbedding", "com.microsoft")]


def test_targets_declare_which_runtime_runs_the_contrib_ops() -> None:
    assert get_target("ort-cpu").runs("SkipSimplifiedLayerNormalization")
    assert get_target("ort-cuda").runs("SimplifiedLayerNormalization")
    assert not get_target("paper").runs("SimplifiedLayerNormalization")
    assert get_target("paper").runs("LayerNormalization")


@pytest.fixture(scope="module")
def results() -> dict:
    return {}


def _optimized(cache: dict, exporter: str, target: str, prepass: tuple | None, limit: bool = False,
               member: str = "llama"):
    from xrl.api import optimize

    key = (member, exporter, target, prepass, limit)
    if key not in cache:
        model = F.build_onnx(member, "small", exporter, limit=limit)
        cache[key] = optimize(model, search="greedy", target=target, prepass=prepass, time_limit=60)
    return cache[key]


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_xrl_rules_fuse_rmsnorm_and_skip_rmsnorm_under_ort_cpu(exporter: str, results: dict) -> None:
    """Without the pre-passes (so xrl's own rules do it), every RMSNorm of both exports becomes a contrib op:
    the first of the network a SimplifiedLayerNormalization, the four after a residual Add a Skip one."""
    result = _optimized(results, exporter, "ort-cpu", ())
    hist = _histogram(result.model)
    assert hist["SimplifiedLayerNormalization"] == 1 and hist["SkipSimplifiedLayerNormalization"] == 4
    assert not NORM_PATTERN & set(hist), hist
    applied = {step.split("@", 1)[0] for step in result.steps}
    assert applied & {"fuse_skip_rmsnorm", "fuse_skip_rmsnorm_cast"}
    assert applied & {"fuse_rmsnorm_div_scaled", "fuse_rmsnorm_div_cast_scaled", "fuse_rmsnorm_reciprocal_scaled"}
    assert result.verified and result.max_abs_err < 1e-4
    feeds = F.input_feeds("llama", "small", seed=2)
    (want,) = F.run(F.build_onnx("llama", "small", exporter), feeds)
    (got,) = F.run(result.model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_the_paper_target_gets_no_contrib_ops(exporter: str, results: dict) -> None:
    result = _optimized(results, exporter, "paper", None)
    assert not CONTRIB_OPS & set(_histogram(result.model))
    assert all(n.domain in ("", "ai.onnx") for n in result.model.graph.node)


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_default_optimisation_of_llama_reaches_its_limits_histogram(exporter: str, results: dict) -> None:
    """With the default pre-passes the transformers optimizer's RMSNorm fusions are kept (they import now),
    xrl packs q/k/v and gate/up, and the result has the op histogram of the same done to the hand-folded limit."""
    result = _optimized(results, exporter, "ort-cpu", None)
    limit = _optimized(results, exporter, "ort-cpu", None, limit=True)
    hist = _histogram(result.model)
    assert RMS_OPS <= set(hist) and hist["RotaryEmbedding"] == 4  # q and k of both layers
    assert hist == _histogram(limit.model)
    assert result.verified and result.max_abs_err < 1e-4


def test_a_rule_may_leave_an_underscored_output_unread() -> None:
    """SkipSimplifiedLayerNormalization's mean and inv_std_var sit before the sum the rule needs: a target may
    name them `_name` and leave them unread; any other unread new value is still an error."""
    from xrl.rewrite.lang import RuleSyntaxError, parse_rules

    rule = """
# Skip
rule skip family=fusion
  s = Add(a, b)
  y = SimplifiedLayerNormalization(s, g)
  =>
  y, {m}, _inv, s = SkipSimplifiedLayerNormalization(a, b, g)
  example a=[B, M, H], b=[B, M, H], g=[H]
"""
    (parsed,) = parse_rules(rule.format(m="_mean"))
    assert parsed.roots == ("y", "s")
    with pytest.raises(RuleSyntaxError, match="target computes 'mean' but nothing reads it"):
        parse_rules(rule.format(m="mean"))


def test_onnx_23s_own_rotary_embedding_stays_opaque() -> None:
    """ONNX 23 has a RotaryEmbedding of its own (inputs in another order): it must not be read as the contrib op."""
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"])
    rng = np.random.default_rng(0)
    weights = [onnx.numpy_helper.from_array(rng.standard_normal((5, 4)).astype(np.float32), "cos"),
               onnx.numpy_helper.from_array(rng.standard_normal((5, 4)).astype(np.float32), "sin"),
               onnx.numpy_helper.from_array(np.arange(5, dtype=np.int64)[None], "pos")]
    graph = helper.make_graph([node], "rope23", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 5, 8])],
                              initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    imported = from_onnx(model)
    (rope,) = imported.nodes.values()
    assert rope.domain == "ai.onnx"
    from xrl.ir.ops import is_known

    assert not is_known(rope.op, rope.domain)
    written = to_onnx(imported)
    assert [(n.op_type, n.domain) for n in written.graph.node] == [("RotaryEmbedding", "")]
    x = {"x": rng.standard_normal((1, 2, 5, 8)).astype(np.float32)}
    np.testing.assert_allclose(_ort_run(written, x)[0], _ort_run(model, x)[0], rtol=1e-6)


def test_interleaved_rotary_of_llama_eager_fuses_and_reaches_its_limit(results: dict) -> None:
    """llama_eager's rotate_every_two (Slices of step 2, stacked and flattened) becomes RotaryEmbedding with
    interleaved=1, and the whole network reaches its limit's histogram."""
    result = _optimized(results, "ts", "ort-cpu", None, member="llama_eager")
    limit = _optimized(results, "ts", "ort-cpu", None, limit=True, member="llama_eager")
    ropes = [n for n in result.model.graph.node if n.op_type == "RotaryEmbedding"]
    assert len(ropes) == 4 and all(n.domain == "com.microsoft" for n in ropes)
    assert all({a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}.get("interleaved") == 1 for n in ropes)
    assert _histogram(result.model) == _histogram(limit.model)
    assert result.verified and result.max_abs_err < 1e-4


def test_the_transformers_pre_pass_reads_the_head_count_off_the_reshapes():
    """HF BertSelfAttention as TorchScript exports it: the optimizer cannot find the head count itself
    (num_heads=0 fuses no Attention); the heads a Reshape to [batch, seq, heads, head size] names can."""
    from xrl.frontends.prepass import _head_shapes, _ort_transformers

    model = F.build_onnx("attn_bert", "small", "ts")
    assert _head_shapes(model) == [(4, 64)]
    fused, detail = _ort_transformers(model)
    assert Counter(n.op_type for n in fused.graph.node)["Attention"] == 2, detail


def test_the_transformers_pre_pass_keeps_the_mask_exact():
    """The optimizer's default mask form (mask_index: ReduceSum of the mask, a count of ones) is exact only for
    right-padded masks; the pre-pass asks for the raw mask, so the fused Attention verifies on any 0/1 mask."""
    from xrl.frontends.prepass import _ort_transformers
    from xrl.frontends.verify import compare_models

    model = F.build_onnx("attn_bert", "small", "ts")
    fused, _ = _ort_transformers(model)
    assert "ReduceSum" not in {n.op_type for n in fused.graph.node}
    check = compare_models(model, fused, trials=3)
    assert check.ok and check.max_abs_err < 1e-4, check.detail


@pytest.mark.parametrize(("member", "exporter", "wanted", "unwanted"), [
    ("attn_bert", "ts", {"Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}, {"Gemm", "Softmax"}),
    ("attn_mha", "ts", {"SkipLayerNormalization": 4, "BiasGelu": 2}, {"LayerNormalization", "Erf"}),
])
def test_ort_targets_run_the_transformers_optimizer_before_onnxslim(member, exporter, wanted, unwanted):
    """ort-cpu's pre-passes: the transformers optimizer first (onnxslim's Reshape-Gemm-Reshape form of a MatMul+Add
    hides q/k/v from its Attention fusion and the bias from its BiasGelu fusion), onnxslim, then the optimizer
    again for exports it can only read after onnxslim's clean-up (nn.MultiheadAttention as TorchScript writes it)."""
    from xrl.frontends.prepass import run_prepasses
    from xrl.frontends.verify import compare_models

    assert get_target("ort-cpu").prepasses == ("ort-transformers", "onnxslim", "ort-transformers")
    model = F.build_onnx(member, "small", exporter)
    out, reports = run_prepasses(model, get_target("ort-cpu").prepasses, time_limit=300)
    hist = _histogram(out)
    assert all(hist[op] == n for op, n in wanted.items()), (hist, [r.detail for r in reports])
    assert not unwanted & set(hist), hist
    assert compare_models(model, out, trials=2).ok


def test_default_optimisation_of_attn_bert_keeps_the_fused_attention(results: dict) -> None:
    result = _optimized(results, "ts", "ort-cpu", None, member="attn_bert")
    assert _histogram(result.model)["Attention"] == 2
    assert result.verified and result.max_abs_err < 1e-4


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_default_optimisation_of_attn_packed_fuses_multi_head_attention(exporter: str, results: dict) -> None:
    """timm's packed-QKV attention (no mask) becomes onnxruntime's MultiHeadAttention in both exports, through
    fuse_mha_packed_split (TorchScript's Split) or fuse_mha_packed_slice (dynamo's three Slices); its limit is the
    plain export, so the limit's own optimisation is the same computation."""
    result = _optimized(results, exporter, "ort-cpu", None, member="attn_packed")
    hist = _histogram(result.model)
    assert hist["MultiHeadAttention"] == 2 and "Softmax" not in hist, hist
    assert {s.split("@", 1)[0] for s in result.steps} & {"fuse_mha_packed_split", "fuse_mha_packed_slice"}
    assert result.verified and result.max_abs_err < 1e-4
    feeds = F.input_feeds("attn_packed", "small", seed=2)
    (want,) = F.run(F.build_onnx("attn_packed", "small", exporter), feeds)
    (got,) = F.run(result.model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
