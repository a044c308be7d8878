"""onnxruntime's contrib MultiHeadAttention (com.microsoft) in xrl (issue 23): the IR's numpy semantics of the op
are onnxruntime's kernel's, it round-trips through import and export in its domain, only onnxruntime targets run
it, the fusion rules of rewrite_rules/contrib_attention.rules verify at 20 trials, and xrl's search fuses an
unmasked attention block into it under ort-cpu (never under paper), verified against the original. The family
member it fuses (attn_packed, timm's packed QKV, both exporters) is tested in tests/test_families_transformer.py.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

from xrl.cost.targets import get_target
from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.ir.execute import execute

ort = pytest.importorskip("onnxruntime")

OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _mha_model(attrs: dict, bias: bool, b: int = 2, s: int = 5, kv: int = 7, d: int = 12, heads: int = 3):
    names = ["q", "k", "v"] + (["bias"] if bias else [])
    node = helper.make_node("MultiHeadAttention", names, ["y"], domain="com.microsoft", num_heads=heads, **attrs)
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [b, s, d])]
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [b, kv, d]) for n in "kv"]
    inits = [nh.from_array(np.random.default_rng(5).standard_normal(3 * d).astype(np.float32), "bias")] if bias else []
    graph = helper.make_graph([node], "mha", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=OPSETS)


@pytest.mark.parametrize("attrs", [{}, {"unidirectional": 1}, {"scale": 0.3}], ids=["plain", "causal", "scale"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_numpy_semantics_of_multi_head_attention_match_onnxruntime(attrs: dict, bias: bool) -> None:
    kv = 5 if attrs.get("unidirectional") else 7
    model = _mha_model(attrs, bias, kv=kv)
    graph = from_onnx(model)  # the contrib output is untyped in the file: the IR types it
    assert graph.type_of("y").shape == (2, 5, 12)
    rng = np.random.default_rng(0)
    for trial in range(3):
        feeds = {"q": rng.standard_normal((2, 5, 12)).astype(np.float32) * (1 + trial),
                 "k": rng.standard_normal((2, kv, 12)).astype(np.float32),
                 "v": rng.standard_normal((2, kv, 12)).astype(np.float32)}
        np.testing.assert_allclose(execute(graph, feeds)[0], _run(model, feeds)[0], rtol=1e-5, atol=1e-5)
    written = to_onnx(graph)
    assert [(n.op_type, n.domain) for n in written.graph.node] == [("MultiHeadAttention", "com.microsoft")]
    np.testing.assert_array_equal(_run(written, feeds)[0], _run(model, feeds)[0])


@pytest.mark.parametrize(("names", "attrs"), [
    (["q", "k", "v", "", "", "ab"], {}),
    (["q", "k", "v", "bias", "pad"], {}),
    (["q", "k", "v", "bias", "pad", "ab"], {"mask_filter_value": -1e9}),
    (["q", "k", "v", "", "pad"], {"scale": 0.2}),
], ids=["attention_bias", "key_padding_mask", "both", "mask_no_bias"])
def test_masked_multi_head_attention_matches_onnxruntime(names: list, attrs: dict) -> None:
    """The masks onnxscript's fusions write (attention_bias; key_padding_mask adds mask_filter_value where it is
    0), with omitted optional inputs between: the IR computes them as onnxruntime does and writes them back."""
    b, s, kv, d, heads = 2, 5, 7, 12, 3
    rng = np.random.default_rng(4)
    node = helper.make_node("MultiHeadAttention", names, ["y"], domain="com.microsoft", num_heads=heads, **attrs)
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [b, s, d]),
              *(helper.make_tensor_value_info(n, TensorProto.FLOAT, [b, kv, d]) for n in "kv"),
              helper.make_tensor_value_info("pad", TensorProto.INT32, [b, kv])]
    inits = [nh.from_array(rng.standard_normal(3 * d).astype(np.float32), "bias"),
             nh.from_array(rng.standard_normal((1, heads, s, kv)).astype(np.float32), "ab")]
    graph = helper.make_graph([node], "mha", [i for i in inputs if i.name in names],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[i for i in inits if i.name in names])
    model = helper.make_model(graph, opset_imports=OPSETS)
    shapes = {"q": (b, s, d), "k": (b, kv, d), "v": (b, kv, d)}
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n, shape in shapes.items()}
    feeds["pad"] = (rng.random((b, kv)) < 0.7).astype(np.int32)
    feeds = {k: v for k, v in feeds.items() if k in names}
    imported = from_onnx(model)
    np.testing.assert_allclose(execute(imported, feeds)[0], _run(model, feeds)[0], rtol=1e-5, atol=1e-5)
    written = to_onnx(imported)
    assert [list(n.input) for n in written.graph.node] == [names]
    np.testing.assert_array_equal(_run(written, feeds)[0], _run(model, feeds)[0])


def test_only_onnxruntime_targets_run_multi_head_attention() -> None:
    assert get_target("ort-cpu").runs("MultiHeadAttention")
    assert get_target("ort-cuda").runs("MultiHeadAttention")
    assert not get_target("paper").runs("MultiHeadAttention")


def test_the_attention_rules_verify_at_20_trials() -> None:
    from pathlib import Path

    from xrl.rewrite import parse_rules, verify_rule

    path = Path(__file__).resolve().parents[1] / "rewrite_rules" / "contrib_attention.rules"
    rules = parse_rules(path.read_text(), str(path))
    assert {r.name for r in rules} == {"fuse_mha_Div", "fuse_mha_Mul", "fuse_mha_packed_split", "fuse_mha_packed_slice",
                                       "fuse_mha_masked_sdpa", "fuse_mha_masked_sdpa_k3", "fuse_mha_seq_first",
                                       "fuse_mha_seq_first_k3"}
    for rule in rules:
        check = verify_rule(rule, seed=3, trials=20)
        assert check.ok and check.trials == 20 and check.max_err <= 1e-9, (rule.name, check.detail)


def _attention_block(scale_op: str = "Div", seq: int = 16, hidden: int = 64, heads: int = 4) -> onnx.ModelProto:
    """Separate bias-free q/k/v projections and unmasked softmax attention, as HF's BertSelfAttention exports
    it without a mask, then the output projection."""
    rng = np.random.default_rng(1)
    size = hidden // heads
    w = {f"w{i}": nh.from_array((rng.standard_normal((hidden, hidden)) * 0.2).astype(np.float32), f"w{i}")
         for i in "qkvo"}
    consts = [nh.from_array(np.array([1, seq, heads, size], np.int64), "split"),
              nh.from_array(np.array([1, seq, hidden], np.int64), "merge"),
              nh.from_array(np.array(np.sqrt(size) if scale_op == "Div" else 1 / np.sqrt(size), np.float32), "c")]
    nodes = []
    for i, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("MatMul", ["x", f"w{i}"], [f"{i}"]),
                  helper.make_node("Reshape", [i, "split"], [f"{i}4"]),
                  helper.make_node("Transpose", [f"{i}4"], [f"{i}h"], perm=perm)]
    nodes += [helper.make_node("MatMul", ["qh", "kh"], ["s"]), helper.make_node(scale_op, ["s", "c"], ["ss"]),
              helper.make_node("Softmax", ["ss"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "vh"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "merge"], ["om"]), helper.make_node("MatMul", ["om", "wo"], ["y"])]
    x, y = (helper.make_tensor_value_info(v, TensorProto.FLOAT, [1, seq, hidden]) for v in "xy")
    graph = helper.make_graph(nodes, "attention", [x], [y], initializer=[*w.values(), *consts])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("scale_op", ["Div", "Mul"])
def test_xrl_fuses_unmasked_attention_into_multi_head_attention_under_ort_cpu(scale_op: str) -> None:
    from xrl.api import optimize

    model = _attention_block(scale_op)
    result = optimize(model, search="greedy", target="ort-cpu", prepass=(), time_limit=30)
    hist = Counter(n.op_type for n in result.model.graph.node)
    assert hist["MultiHeadAttention"] == 1 and "Softmax" not in hist, hist
    assert any(s.startswith(f"fuse_mha_{scale_op}") for s in result.steps), result.steps
    mha = next(n for n in result.model.graph.node if n.op_type == "MultiHeadAttention")
    assert mha.domain == "com.microsoft"
    assert result.verified and result.max_abs_err < 1e-4
    x = {"x": np.random.default_rng(2).standard_normal((1, 16, 64)).astype(np.float32)}
    np.testing.assert_allclose(_run(result.model, x)[0], _run(model, x)[0], rtol=1e-4, atol=1e-5)
    paper = optimize(model, search="greedy", target="paper", prepass=(), time_limit=30)
    assert "MultiHeadAttention" not in {n.op_type for n in paper.model.graph.node}


# ----- masked attention (torch's SDPA export with a mask) into MultiHeadAttention's attention_bias -------------
def test_a_target_may_leave_an_optional_input_empty_with_none() -> None:
    from xrl.rewrite.lang import Omitted, RuleSyntaxError, parse_rules

    head = "# a test rule\nrule r family=fusion\n  y = Softmax(Add(s, m), axis=-1)\n  =>\n"
    (rule,) = parse_rules(head + "  y = MultiHeadAttention(s, s, s, None, None, m, num_heads=1)\n")
    (mha,) = [st for st in rule.target if st.op == "MultiHeadAttention"]
    assert [type(a) for a in mha.inputs[3:5]] == [Omitted, Omitted]
    with pytest.raises(RuleSyntaxError, match="trailing None"):
        parse_rules(head + "  y = MultiHeadAttention(s, s, s, None)\n")
    with pytest.raises(RuleSyntaxError, match="must be"):  # a source has no empty inputs to match
        parse_rules("# a test rule\nrule r family=fusion\n  y = MultiHeadAttention(s, s, s, None, None, m)\n  =>\n"
                    "  y = Relu(s)\n")


@pytest.fixture(scope="module")
def sdpa_members() -> dict:
    from xrl.graphs import families as fam

    return {e: fam.build_onnx("attn_sdpa", "small", e) for e in ("ts", "dynamo")}


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_masked_sdpa_fuses_into_multi_head_attention_exactly_even_for_fully_masked_rows(exporter: str,
                                                                                      sdpa_members: dict) -> None:
    """Both exports' masked SDPA (a bool padding mask, -inf where masked, NaN rows zeroed) fuse into one
    MultiHeadAttention per layer with the mask as attention_bias, and onnxruntime computes what the original
    computes, also for a mask that leaves every key masked (the original's zeroed NaN rows)."""
    from xrl.rewrite import RewriteEngine

    model = sdpa_members[exporter]
    g = from_onnx(model)
    engine = RewriteEngine.default()
    for _ in range(2):  # one fusion per layer
        g = next(c for c in engine.candidates(g) if str(c.step).startswith("fuse_mha_masked_sdpa")).graph
    assert not [c for c in engine.candidates(g) if str(c.step).startswith("fuse_mha_masked")]
    written = to_onnx(g)
    ops = Counter(n.op_type for n in written.graph.node)
    assert ops["MultiHeadAttention"] == 2 and ops["Softmax"] == 0
    rng = np.random.default_rng(0)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    x = rng.standard_normal(shapes["hidden_states"]).astype(np.float32)
    for mask in (np.array([[1] * 10 + [0] * 6], np.int64), np.zeros(shapes["attention_mask"], np.int64)):
        feeds = {"hidden_states": x, "attention_mask": mask}
        want, got = _run(model, feeds)[0], _run(written, feeds)[0]
        assert np.isfinite(got).all() == np.isfinite(want).all()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_costed_candidate_holds_the_values_of_its_new_shape_weights(sdpa_members: dict) -> None:
    """The skeleton a cost model reads (never run) computes a rule's small integer weights, here the fused
    attention's Expand shape: a kernel is timed and cached by them, and zeros would make that Expand
    unrunnable (onnxruntime: incompatible dimensions) and key it wrongly."""
    from xrl.rewrite import RewriteEngine

    g = from_onnx(sdpa_members["ts"])
    cand = next(c for c in RewriteEngine.default().candidates(g) if str(c.step).startswith("fuse_mha_masked"))
    (expand,) = [n for n in cand.added if n.op == "Expand"]
    shape = cand.skeleton.initializers[expand.inputs[1]]
    np.testing.assert_array_equal(shape, cand.graph.initializers[expand.inputs[1]])
    assert shape.tolist() == [1, 1, 16, 16]


@pytest.mark.parametrize("member", ["attn_mha", "attn_mha_causal"])
@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_nn_multihead_attention_fuses_with_its_mask_into_multi_head_attention(member: str, exporter: str) -> None:
    """nn.MultiheadAttention's sequence-first export (a key padding mask's bias, or a causal constant) fuses
    into one MultiHeadAttention per layer, and onnxruntime computes what the original computes, also where the
    mask leaves a row no key (NaN in both)."""
    from xrl.graphs import families as fam

    from xrl.rewrite import RewriteEngine

    model = fam.build_onnx(member, "small", exporter)
    g = from_onnx(model)
    engine = RewriteEngine.default()
    for _ in range(2):  # one fusion per layer
        g = next(c for c in engine.candidates(g) if str(c.step).startswith("fuse_mha_seq_first")).graph
    written = to_onnx(g)
    ops = Counter(n.op_type for n in written.graph.node)
    assert ops["MultiHeadAttention"] == 2 and ops["Softmax"] == 0
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    feeds = {"hidden_states": np.random.default_rng(1).standard_normal(shapes["hidden_states"]).astype(np.float32)}
    masks = [None]
    if "attention_mask" in shapes:
        masks = [np.array([[1] * 12 + [0] * (shapes["attention_mask"][1] - 12)], np.int64),
                 np.zeros(shapes["attention_mask"], np.int64)]
    for mask in masks:
        if mask is not None:
            feeds["attention_mask"] = mask
        want, got = _run(model, feeds)[0], _run(written, feeds)[0]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
