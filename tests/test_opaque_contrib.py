"""onnxruntime contrib ops the IR knows (MultiHeadAttention, RotaryEmbedding, SimplifiedLayerNormalization), in a
form the IR does not support (packed or 4-D key/values, past key/values with present outputs, partial rotary,
mixed-precision or broadcast RMSNorm scale), import as opaque nodes of their own domain, typed by the file: the
model loads, no rule touches them, export writes them back as they were and onnxruntime gives the original's
outputs. A supported form still imports as the IR op; a standard op that fails the IR's inference is still an
error, and an opaque contrib output the file leaves untyped is the usual clear error.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

from xrl.errors import DynamicShapeError, XrlError
from xrl.frontends.onnx_io import OPAQUE_DEFAULT_DOMAIN, from_onnx, to_onnx
from xrl.ir.ops import is_known

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
B, S, N, H, P = 2, 5, 3, 4, 4  # batch, sequence, heads, head size, past length
D = N * H


def _vi(name: str, shape, elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, value_info=(), inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "contrib", inputs, outputs, initializer=list(inits), value_info=list(value_info))
    return helper.make_model(graph, opset_imports=OPSETS)


def _feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in model.graph.input:
        shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
        feeds[v.name] = (np.zeros(shape, dtype) + np.arange(shape[-1], dtype=dtype) if dtype == np.int64
                         else rng.standard_normal(shape).astype(dtype))
    return feeds


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _packed_qkv() -> onnx.ModelProto:
    """onnxruntime's packed QKV: query (batch, sequence, heads, 3, head size), key and value omitted."""
    mha = helper.make_node("MultiHeadAttention", ["qkv", "", ""], ["y"], domain="com.microsoft", num_heads=N)
    return _model([mha, helper.make_node("Relu", ["y"], ["z"])], [_vi("qkv", [B, S, N, 3, H])], [_vi("z", [B, S, D])],
                  [_vi("y", [B, S, D])])


def _bnsh_kv() -> onnx.ModelProto:
    """Key and value already split into heads, (batch, heads, kv sequence, head size)."""
    mha = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain="com.microsoft", num_heads=N)
    return _model([mha, helper.make_node("Relu", ["y"], ["z"])],
                  [_vi("q", [B, S, D]), _vi("k", [B, N, 6, H]), _vi("v", [B, N, 6, H])], [_vi("z", [B, S, D])],
                  [_vi("y", [B, S, D])])


def _past_kv() -> onnx.ModelProto:
    """Self-attention over a past key/value cache, returning the present key/value; Relu(Relu) after it."""
    w = nh.from_array(np.random.default_rng(1).standard_normal((D, D)).astype(np.float32) / 4, "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]), helper.make_node("Relu", ["q"], ["k"]),
             helper.make_node("Sigmoid", ["q"], ["v"]),
             helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "", "past_k", "past_v"],
                              ["y", "present_k", "present_v"], domain="com.microsoft", num_heads=N),
             helper.make_node("Relu", ["y"], ["y1"]), helper.make_node("Relu", ["y1"], ["z"])]
    return _model(nodes, [_vi("x", [B, S, D]), _vi("past_k", [B, N, P, H]), _vi("past_v", [B, N, P, H])],
                  [_vi("z", [B, S, D]), _vi("present_k", [B, N, P + S, H]), _vi("present_v", [B, N, P + S, H])],
                  [_vi("y", [B, S, D])], [w])


def _partial_rotary() -> onnx.ModelProto:
    """Rotary embedding of the first 4 of 8 channels per head."""
    rot = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft",
                           rotary_embedding_dim=4, num_heads=N)
    return _model([rot, helper.make_node("Relu", ["y"], ["z"])],
                  [_vi("x", [B, N, S, 8]), _vi("pos", [B, S], TensorProto.INT64), _vi("cos", [16, 2]),
                   _vi("sin", [16, 2])], [_vi("z", [B, N, S, 8])], [_vi("y", [B, N, S, 8])])


def _mixed_rmsnorm() -> onnx.ModelProto:
    """SimplifiedLayerNormalization (default domain) of float16 X by a float32 scale: Y is float32."""
    sln = helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y"], axis=-1, epsilon=1e-5)
    scale = nh.from_array(np.linspace(0.5, 1.5, D, dtype=np.float32), "scale")
    return _model([sln, helper.make_node("Relu", ["y"], ["z"])], [_vi("x", [B, S, D], TensorProto.FLOAT16)],
                  [_vi("z", [B, S, D])], [_vi("y", [B, S, D])], [scale])


CASES = {"packed_qkv": (_packed_qkv, "MultiHeadAttention", "com.microsoft"),
         "bnsh_kv": (_bnsh_kv, "MultiHeadAttention", "com.microsoft"),
         "past_kv": (_past_kv, "MultiHeadAttention", "com.microsoft"),
         "partial_rotary": (_partial_rotary, "RotaryEmbedding", "com.microsoft"),
         "mixed_rmsnorm": (_mixed_rmsnorm, "SimplifiedLayerNormalization", "")}


def _node(model: onnx.ModelProto, op: str) -> onnx.NodeProto:
    (node,) = [n for n in model.graph.node if n.op_type == op]
    return node


def _inputs(node: onnx.NodeProto) -> list[str]:
    ins = list(node.input)
    while ins and not ins[-1]:  # trailing omitted optionals say nothing
        ins.pop()
    return ins


@pytest.mark.parametrize("case", list(CASES))
def test_unsupported_contrib_form_imports_opaque_and_round_trips(case: str) -> None:
    build, op, domain = CASES[case]
    model = build()
    graph = from_onnx(model)
    (node,) = [n for n in graph.nodes.values() if n.op == op]
    assert node.domain == (domain or OPAQUE_DEFAULT_DOMAIN)
    assert not is_known(node.op, node.domain)  # opaque: no rule, kernel or inference takes it
    for v in node.outputs:  # typed by the file
        vi = {x.name: x for x in [*model.graph.value_info, *model.graph.output]}[v]
        assert graph.type_of(v).shape == tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
    written = to_onnx(graph)
    before, after = _node(model, op), _node(written, op)
    assert (after.domain, _inputs(after), list(after.output)) == (before.domain, _inputs(before), list(before.output))
    assert sorted(a.SerializeToString() for a in after.attribute) == \
        sorted(a.SerializeToString() for a in before.attribute)
    assert {d.domain: d.version for d in written.opset_import}.get("com.microsoft", 1) == 1
    feeds = _feeds(model)
    try:
        want = _run(model, feeds)
    except Exception as e:  # onnxruntime's CPU kernel has no packed QKV: the written model fails the same way
        assert case == "packed_qkv", e
        with pytest.raises(Exception, match="Packed QKV"):
            _run(written, feeds)
        return
    got = _run(written, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_opaque_contrib_output_without_a_type_is_the_clear_error() -> None:
    model = _partial_rotary()
    del model.graph.value_info[:]  # onnx's shape inference knows no com.microsoft op: y stays untyped
    with pytest.raises(DynamicShapeError, match="'y'.*no shape after shape inference"):
        from_onnx(model)


def test_supported_multi_head_attention_still_imports_as_the_ir_op() -> None:
    mha = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain="com.microsoft", num_heads=N)
    model = _model([mha], [_vi("q", [B, S, D]), _vi("k", [B, 7, D]), _vi("v", [B, 7, D])], [_vi("y", [B, S, D])])
    graph = from_onnx(model)
    (node,) = graph.nodes.values()
    assert (node.op, node.domain) == ("MultiHeadAttention", "") and is_known(node.op, node.domain)
    written = to_onnx(graph)
    assert [(n.op_type, n.domain) for n in written.graph.node] == [("MultiHeadAttention", "com.microsoft")]
    feeds = _feeds(model)
    np.testing.assert_allclose(_run(written, feeds)[0], _run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_supported_rmsnorm_still_imports_as_the_ir_op() -> None:
    sln = helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y"], axis=-1, epsilon=1e-5)
    scale = nh.from_array(np.linspace(0.5, 1.5, D, dtype=np.float32), "scale")
    graph = from_onnx(_model([sln], [_vi("x", [B, S, D])], [_vi("y", None)], inits=[scale]))
    (node,) = graph.nodes.values()
    assert (node.op, node.domain) == ("SimplifiedLayerNormalization", "") and graph.type_of("y").shape == (B, S, D)


def test_malformed_standard_op_is_still_an_error() -> None:
    ln = helper.make_node("LayerNormalization", ["x", "scale"], ["y"])
    model = _model([ln], [_vi("x", [B, S, D]), _vi("scale", [D + 1])], [_vi("y", [B, S, D])])
    with pytest.raises(XrlError, match="LayerNormalization"):
        from_onnx(model)


def test_reserved_opaque_domain_in_a_file_is_refused() -> None:
    relu = helper.make_node("Relu", ["x"], ["y"], domain=OPAQUE_DEFAULT_DOMAIN)
    model = _model([relu], [_vi("x", [2])], [_vi("y", [2])])
    model.opset_import.append(helper.make_opsetid(OPAQUE_DEFAULT_DOMAIN, 1))
    with pytest.raises(XrlError, match="reserves"):
        from_onnx(model)


def test_cli_optimize_keeps_the_opaque_node_and_verifies(tmp_path: Path) -> None:
    model = _past_kv()
    src, out = tmp_path / "model.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    xrl = Path(sys.executable).with_name("xrl")
    cmd = [str(xrl)] if xrl.exists() else [sys.executable, "-m", "xrl.cli"]
    res = subprocess.run([*cmd, "optimize", str(src), "-o", str(out), "--search", "greedy", "--no-guard"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "verified against the original" in res.stdout
    written = onnx.load(str(out))
    mha = _node(written, "MultiHeadAttention")
    assert (mha.domain, _inputs(mha)) == ("com.microsoft", _inputs(_node(model, "MultiHeadAttention")))
    feeds = _feeds(model)
    for g, w in zip(_run(written, feeds), _run(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
