"""ONNX front end: import (folding, canonical forms, errors), export, saving and verification.

Every fixture is built in code with onnx.helper; round trips are checked with the full ONNX checker
and numerically against the original under onnxruntime.
"""

from __future__ import annotations

import math
import os
import re
import time
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xrl.errors import (
    ConfigError,
    DynamicShapeError,
    InvalidGraphError,
    ModelLoadError,
    OutputPathError,
    XrlError,
)
from xrl.frontends import onnx_write
from xrl.frontends.onnx_io import from_onnx, load_onnx, to_onnx
from xrl.frontends.onnx_write import save_onnx
from xrl.frontends.verify import compare_models, random_feeds, run_onnx
from xrl.ir import Graph, Node, TensorType

F = TensorProto.FLOAT


# ----- fixture helpers -------------------------------------------------------------------------
def _vi(name: str, dims, elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


def _w(name: str, arr) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def _model(nodes, inputs, outputs, inits=(), opset: int = 17, name: str = "m", extra_opsets=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    return helper.make_model(g, opset_imports=opsets, ir_version=8)


def _rand(rng, *shape, scale: float = 0.3) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _round_trip(model: onnx.ModelProto, input_shapes=None, *, opset: int | None = None):
    graph = from_onnx(model, input_shapes)
    out = to_onnx(graph, opset=opset)
    onnx.checker.check_model(out, full_check=True)
    res = compare_models(model, out)
    assert res.ok, res.detail
    assert res.max_abs_err < 1e-5, res.detail
    return graph, out


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def conv_net() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [_w("w1", _rand(rng, 8, 3, 3, 3)), _w("b1", _rand(rng, 8)), _w("gamma", 1 + _rand(rng, 8)),
             _w("beta", _rand(rng, 8)), _w("mean", _rand(rng, 8)), _w("var", 1 + np.abs(_rand(rng, 8))),
             _w("fc", _rand(rng, 10, 8)), _w("fcb", _rand(rng, 10))]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["bn"], epsilon=1e-5),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["logits"], transB=1),
    ]
    return _model(nodes, [_vi("x", ["batch", 3, 16, 16])], [_vi("logits", ["batch", 10])], inits, name="convnet")


def attention_block() -> onnx.ModelProto:
    """LayerNorm -> QKV MatMul -> Split -> heads (Reshape/Transpose) -> Softmax attention -> Slice."""
    rng = np.random.default_rng(1)
    b, s, d, h = 1, 8, 16, 2
    inits = [_w("ln_g", 1 + _rand(rng, d)), _w("ln_b", _rand(rng, d)), _w("wqkv", _rand(rng, d, 3 * d)),
             _w("split", np.array([d, d, d], np.int64)), _w("heads", np.array([b, s, h, d // h], np.int64)),
             _w("scale", np.array(1 / math.sqrt(d // h), np.float32)), _w("merged", np.array([b, s, d], np.int64)),
             _w("wo", _rand(rng, d, d)), _w("starts", np.array([0], np.int64)), _w("ends", np.array([4], np.int64)),
             _w("axes", np.array([1], np.int64))]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "ln_g", "ln_b"], ["ln"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["ln", "wqkv"], ["qkv"]),
        helper.make_node("Split", ["qkv", "split"], ["q", "k", "v"], axis=-1),
        helper.make_node("Reshape", ["q", "heads"], ["q4"]),
        helper.make_node("Reshape", ["k", "heads"], ["k4"]),
        helper.make_node("Reshape", ["v", "heads"], ["v4"]),
        helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qt", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "vt"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merged"], ["ctx2"]),
        helper.make_node("MatMul", ["ctx2", "wo"], ["proj"]),
        helper.make_node("Add", ["proj", "x"], ["res"]),
        helper.make_node("Slice", ["res", "starts", "ends", "axes"], ["y"]),
    ]
    return _model(nodes, [_vi("x", [b, s, d])], [_vi("y", [b, 4, d])], inits, name="attention")


# ----- round trips -----------------------------------------------------------------------------
def test_conv_net_round_trip():
    graph, out = _round_trip(conv_net(), {"x": (2, 3, 16, 16)})
    assert graph.op_histogram() == {"BatchNormalization": 1, "Conv": 1, "Flatten": 1, "Gemm": 1,
                                    "GlobalAveragePool": 1, "MaxPool": 1, "Relu": 1}
    assert graph.inputs == ("x",) and graph.types["x"] == TensorType((2, 3, 16, 16))
    assert graph.types["logits"] == TensorType((2, 10))
    assert set(graph.initializers) == {"w1", "b1", "gamma", "beta", "mean", "var", "fc", "fcb"}
    assert graph.nodes["Conv_0"].attrs["pads"] == (1, 1, 1, 1)  # INTS -> tuple of ints
    assert [i.name for i in out.graph.input] == ["x"] and [o.name for o in out.graph.output] == ["logits"]


def test_attention_block_round_trip_and_canonical_split():
    graph, out = _round_trip(attention_block())
    split = next(n for n in graph.nodes.values() if n.op == "Split")
    assert split.inputs == ("qkv",) and split.attrs["split"] == (16, 16, 16)
    reshape = next(n for n in graph.nodes.values() if n.op == "Reshape")
    assert graph.is_weight(reshape.inputs[1])
    slice_node = next(n for n in graph.nodes.values() if n.op == "Slice")
    assert all(graph.is_weight(v) for v in slice_node.inputs[1:])
    assert graph.types["y"] == TensorType((1, 4, 16))
    # opset 17 wants Split's sizes as an input again.
    exported_split = next(n for n in out.graph.node if n.op_type == "Split")
    assert len(exported_split.input) == 2


def test_opaque_ops_round_trip_unchanged():
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("Einsum", ["x", "w"], ["e"], equation="bij,jk->bik"),
        helper.make_node("TopK", ["e", "k"], ["vals", "idx"], axis=-1, largest=1, sorted=1),
    ]
    model = _model(nodes, [_vi("x", [2, 3, 4])], [_vi("vals", [2, 3, 2]), _vi("idx", [2, 3, 2], TensorProto.INT64)],
                   [_w("w", _rand(rng, 4, 5)), _w("k", np.array([2], np.int64))])
    graph, out = _round_trip(model)
    einsum = next(n for n in graph.nodes.values() if n.op == "Einsum")
    assert einsum.attrs == {"equation": "bij,jk->bik"} and einsum.domain == ""
    topk = next(n for n in graph.nodes.values() if n.op == "TopK")
    assert topk.attrs == {"axis": -1, "largest": 1, "sorted": 1}
    assert graph.types["idx"] == TensorType((2, 3, 2), "int64")  # from ONNX inference: the IR cannot
    assert [o.name for o in out.graph.output] == ["vals", "idx"]


def test_custom_domain_op_exports_with_domain_and_attributes():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("FancyOp", ["r"], ["y"], domain="my.ops", alpha=0.5, mode="fast", sizes=[1, 2])]
    model = _model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 3])], extra_opsets=[("my.ops", 1)])
    graph = from_onnx(model)
    fancy = graph.nodes["FancyOp_0"]
    assert fancy.domain == "my.ops" and fancy.attrs == {"alpha": 0.5, "mode": "fast", "sizes": (1, 2)}
    assert graph.types["y"] == TensorType((2, 3))  # the declared output type stands
    out = to_onnx(graph)
    onnx.checker.check_model(out, full_check=True)
    node = next(n for n in out.graph.node if n.op_type == "FancyOp")
    assert node.domain == "my.ops"
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute} == \
        {"alpha": 0.5, "mode": b"fast", "sizes": [1, 2]}
    assert {d.domain: d.version for d in out.opset_import} == {"": 17, "my.ops": 1}


def test_opaque_op_attribute_picks_the_opset_that_has_it():
    roi_free = [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", antialias=1)]
    model = _model(roi_free, [_vi("x", [1, 1, 4, 4])], [_vi("y", [1, 1, 2, 2])],
                   [_w("scales", np.array([1, 1, 0.5, 0.5], np.float32))], opset=18)
    graph, out = _round_trip(model)
    assert out.opset_import[0].version == 18  # antialias exists from opset 18
    with pytest.raises(ConfigError, match="needs opset 18"):
        to_onnx(graph, opset=17)
    with pytest.raises(ConfigError, match="from 13"):
        to_onnx(graph, opset=11)


# ----- constant folding ------------------------------------------------------------------------
def torch_style_model() -> onnx.ModelProto:
    """What torch.onnx emits for `x.view(x.size(0), -1)` plus a `torch.ones(x.shape)`-style mask."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Constant", [], ["zero"], value=_w("", np.array(0, np.int64))),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "ax0"], ["batch1"]),
        helper.make_node("Constant", [], ["minus1"], value_ints=[-1]),
        helper.make_node("Concat", ["batch1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Shape", ["flat"], ["flat_shape"]),
        helper.make_node("ConstantOfShape", ["flat_shape"], ["ones"], value=_w("", np.array([1.0], np.float32))),
        helper.make_node("Add", ["flat", "ones"], ["y"]),
    ]
    return _model(nodes, [_vi("x", ["batch", 2, 3])], [_vi("y", ["batch", 6])],
                  [_w("ax0", np.array([0], np.int64))], name="torch_style")


def test_shape_chain_folds_to_constants():
    model = torch_style_model()
    graph = from_onnx(model, {"x": (4, 2, 3)})
    assert graph.op_histogram() == {"Add": 1, "Reshape": 1}
    reshape = next(n for n in graph.nodes.values() if n.op == "Reshape")
    np.testing.assert_array_equal(graph.const_value(reshape.inputs[1]), [4, -1])
    add = next(n for n in graph.nodes.values() if n.op == "Add")
    np.testing.assert_array_equal(graph.const_value(add.inputs[1]), np.ones((4, 6), np.float32))
    out = to_onnx(graph)
    onnx.checker.check_model(out, full_check=True)
    assert "Shape" not in _ops(out)
    res = compare_models(model, out)  # the reference's dynamic batch takes the candidate's 4
    assert res.ok and res.max_abs_err == 0, res.detail


def test_folding_does_not_blow_small_constants_up_into_huge_weights(monkeypatch):
    from xrl.frontends import onnx_fold

    monkeypatch.setattr(onnx_fold, "_MAX_FOLD_BYTES", 64)
    graph = from_onnx(torch_style_model(), {"x": (4, 2, 3)})
    assert graph.op_histogram() == {"Add": 1, "ConstantOfShape": 1, "Reshape": 1}  # 24 floats > 64 bytes
    out = to_onnx(graph)
    onnx.checker.check_model(out, full_check=True)
    assert compare_models(torch_style_model(), out).ok


def test_import_leaves_the_callers_model_unchanged():
    model = torch_style_model()
    before = model.SerializeToString()
    from_onnx(model, {"x": (1, 2, 3)})
    assert model.SerializeToString() == before


@pytest.mark.parametrize("case", ["opset13_split_squeeze", "opset17_reduce_attr", "opset18_reduce_input"])
@pytest.mark.parametrize("export_opset", [None, 18])
def test_axes_and_split_normalise_to_attributes(case, export_opset):
    if case == "opset13_split_squeeze":
        nodes = [helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1),
                 helper.make_node("Squeeze", ["a", "ax"], ["y"]),
                 helper.make_node("Unsqueeze", ["b", "ax"], ["z"])]
        inits = [_w("sizes", np.array([1, 3], np.int64)), _w("ax", np.array([1], np.int64))]
        model = _model(nodes, [_vi("x", [2, 4, 5])], [_vi("y", [2, 5]), _vi("z", [2, 1, 3, 5])], inits, opset=13)
        expect = {"Split": ("split", (1, 3)), "Squeeze": ("axes", (1,)), "Unsqueeze": ("axes", (1,))}
    elif case == "opset17_reduce_attr":
        nodes = [helper.make_node("ReduceMean", ["x"], ["y"], axes=[-1], keepdims=1),
                 helper.make_node("ReduceSum", ["x", "ax"], ["z"], keepdims=0)]
        model = _model(nodes, [_vi("x", [2, 4, 5])], [_vi("y", [2, 4, 1]), _vi("z", [2, 5])],
                       [_w("ax", np.array([1], np.int64))], opset=17)
        expect = {"ReduceMean": ("axes", (-1,)), "ReduceSum": ("axes", (1,))}
    else:
        nodes = [helper.make_node("ReduceMean", ["x", "ax"], ["y"], keepdims=0),
                 helper.make_node("ReduceMax", ["x", "ax2"], ["z"]),
                 helper.make_node("Split", ["x"], ["s0", "s1"], axis=1, num_outputs=2)]
        model = _model(nodes, [_vi("x", [2, 4, 5])],
                       [_vi("y", [2, 5]), _vi("z", [1, 4, 1]), _vi("s0", [2, 2, 5]), _vi("s1", [2, 2, 5])],
                       [_w("ax", np.array([1], np.int64)), _w("ax2", np.array([0, 2], np.int64))], opset=18)
        expect = {"ReduceMean": ("axes", (1,)), "ReduceMax": ("axes", (0, 2)), "Split": ("split", (2, 2))}
    graph, out = _round_trip(model, opset=export_opset)
    for node in graph.nodes.values():
        key, value = expect[node.op]
        assert node.attrs[key] == value and len(node.inputs) == 1, node
        assert "num_outputs" not in node.attrs
    assert not graph.initializers  # the axes/sizes tensors now live in attributes
    target = export_opset or 17
    assert out.opset_import[0].version == target
    for node in out.graph.node:
        as_input = node.op_type in ("Split", "Squeeze", "Unsqueeze", "ReduceSum") or target >= 18
        assert len(node.input) == (2 if as_input else 1), (node.op_type, target)


def test_old_opset_is_converted_and_unconvertible_one_explains():
    nodes = [helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0]),
             helper.make_node("Split", ["u"], ["a", "b"], axis=2, split=[1, 2])]
    model = _model(nodes, [_vi("x", [2, 3])], [_vi("a", [1, 2, 1]), _vi("b", [1, 2, 2])], opset=11)
    graph, _ = _round_trip(model)
    assert {n.op: n.attrs for n in graph.nodes.values()} == {"Unsqueeze": {"axes": (0,)},
                                                             "Split": {"axis": 2, "split": (1, 2)}}
    bad = _model([helper.make_node("NotAnOp", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])], opset=9)
    with pytest.raises(ModelLoadError, match=r"opset 9 .*opset 13 or newer"):
        from_onnx(bad)


# ----- fused activations -----------------------------------------------------------------------
def _fused_graph(op: str, act: str) -> Graph:
    rng = np.random.default_rng(3)
    if op == "Conv":
        w, b = _rand(rng, 4, 3, 3, 3), _rand(rng, 4)
        node = Node("conv", "Conv", ("x", "w", "b"), ("y",), {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1),
                                                             "activation": act})
        types = {"x": TensorType((1, 3, 6, 6)), "w": TensorType.of(w), "b": TensorType.of(b),
                 "y": TensorType((1, 4, 6, 6))}
    else:
        w, b = _rand(rng, 5, 4), None
        node = Node("mm", "MatMul", ("x", "w"), ("y",), {"activation": act})
        types = {"x": TensorType((2, 5)), "w": TensorType.of(w), "y": TensorType((2, 4))}
    weights = {"w": w} if b is None else {"w": w, "b": b}
    return Graph([node], ["x"], ["y"], types, weights, name="fused").validate()


def _reference_without_fusion(graph: Graph, act: str) -> onnx.ModelProto:
    """The same graph with its fused activation as a separate node, built by hand."""
    node = next(iter(graph.nodes.values()))
    attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in node.attrs.items() if k != "activation"}
    nodes = [helper.make_node(node.op, list(node.inputs), ["pre"], **attrs),
             helper.make_node(act, ["pre"], ["y"])]
    return _model(nodes, [_vi("x", list(graph.types["x"].shape))], [_vi("y", list(graph.types["y"].shape))],
                  [_w(k, v) for k, v in graph.initializers.items()], opset=20)


@pytest.mark.parametrize("op,act", [("Conv", "Relu"), ("MatMul", "Sigmoid"), ("MatMul", "Tanh"),
                                    ("Conv", "Gelu")])
@pytest.mark.parametrize("opset", [17, 20])
def test_fused_activation_is_lowered_on_export(op, act, opset):
    graph = _fused_graph(op, act)
    out = to_onnx(graph, opset=opset)
    onnx.checker.check_model(out, full_check=True)
    ops = _ops(out)
    assert ops[0] == op and "activation" not in {a.name for a in out.graph.node[0].attribute}
    if act == "Gelu" and opset < 20:
        assert ops[1:] == ["Div", "Erf", "Add", "Mul", "Mul"]
    else:
        assert ops[1:] == [act]
    res = compare_models(_reference_without_fusion(graph, act), out)
    assert res.ok and res.max_abs_err < 1e-5, res.detail


def test_standalone_tanh_gelu_lowered_matches_formula():
    x = TensorType((3, 7))
    graph = Graph([Node("g", "Gelu", ("x",), ("y",), {"approximate": "tanh"})], ["x"], ["y"], {"x": x, "y": x})
    out = to_onnx(graph)
    assert out.opset_import[0].version == 17 and "Gelu" not in _ops(out)
    feeds = random_feeds(graph, seed=5)
    (y,) = run_onnx(out, feeds)
    v = feeds["x"].astype(np.float64)
    want = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    (y20,) = run_onnx(to_onnx(graph, opset=20), feeds)
    np.testing.assert_allclose(y20, y, rtol=1e-5, atol=1e-6)


# ----- output names ----------------------------------------------------------------------------
def test_export_keeps_output_names_after_rename():
    model = _model([helper.make_node("Relu", ["x"], ["hidden"]), helper.make_node("Neg", ["hidden"], ["out"])],
                   [_vi("x", [2, 3])], [_vi("out", [2, 3])])
    graph = from_onnx(model)
    neg = next(n for n in graph.nodes.values() if n.op == "Neg")
    new = Node("neg2", "Neg", ("hidden",), ("renamed",))
    rewritten = graph.replace(remove=[neg.name], add=[new], rename={"out": "renamed"},
                              new_types={"renamed": graph.types["out"]}).validate()
    assert rewritten.outputs == ("renamed",) and rewritten.output_names == ("out",)
    out = to_onnx(rewritten)
    onnx.checker.check_model(out, full_check=True)
    assert [o.name for o in out.graph.output] == ["out"] and [i.name for i in out.graph.input] == ["x"]
    assert _ops(out)[-1] == "Identity"
    assert compare_models(model, out).ok


def test_export_moves_an_internal_value_that_holds_an_output_name():
    t = TensorType((2, 3))
    graph = Graph([Node("a", "Relu", ("x",), ("y",)), Node("b", "Neg", ("y",), ("z",))], ["x"], ["z"],
                  {"x": t, "y": t, "z": t}, output_names=["y"]).validate()
    out = to_onnx(graph)
    onnx.checker.check_model(out, full_check=True)
    assert [o.name for o in out.graph.output] == ["y"]
    feeds = random_feeds(graph, seed=0)
    (y,) = run_onnx(out, feeds)
    np.testing.assert_array_equal(y, -np.maximum(feeds["x"], 0))


def test_output_that_is_an_input_or_a_weight_exports():
    t = TensorType((2,))
    w = np.arange(2, dtype=np.float32)
    graph = Graph([Node("r", "Relu", ("x",), ("y",))], ["x"], ["y", "x", "w"], {"x": t, "y": t, "w": t},
                  {"w": w}, output_names=["y", "x_copy", "weights"]).validate()
    out = to_onnx(graph)
    onnx.checker.check_model(out, full_check=True)
    feeds = {"x": np.array([-1.0, 2.0], np.float32)}
    y, x, ws = run_onnx(out, feeds)
    np.testing.assert_array_equal(x, feeds["x"])
    np.testing.assert_array_equal(ws, w)


# ----- dtypes, names, odd graphs ---------------------------------------------------------------
def test_float16_and_int64_graphs_round_trip_with_cast_dtype_names():
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Mul", ["h", "two"], ["y"]),
             helper.make_node("Cast", ["h"], ["i"], to=TensorProto.INT64),
             helper.make_node("Add", ["i", "one"], ["z"]),
             helper.make_node("Greater", ["z", "one"], ["mask"])]
    model = _model(nodes, [_vi("x", [3, 4])],
                   [_vi("y", [3, 4], TensorProto.FLOAT16), _vi("z", [3, 4], TensorProto.INT64),
                    _vi("mask", [3, 4], TensorProto.BOOL)],
                   [_w("two", np.array(2, np.float16)), _w("one", np.array(1, np.int64))])
    graph, _ = _round_trip(model)
    casts = sorted(n.attrs["to"] for n in graph.nodes.values() if n.op == "Cast")
    assert casts == ["float16", "int64"]
    assert graph.types["mask"].dtype == "bool" and graph.types["y"].dtype == "float16"


def test_unnamed_and_duplicate_node_names_become_unique_and_deterministic():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="n"), helper.make_node("Relu", ["a"], ["b"], name="n"),
             helper.make_node("Neg", ["b"], ["c"]), helper.make_node("Neg", ["c"], ["d"], name="Neg_0")]
    model = _model(nodes, [_vi("x", [2])], [_vi("d", [2])])
    names = sorted(from_onnx(model).nodes)
    assert names == sorted(from_onnx(model).nodes) == ["Neg_0", "Neg_1", "n", "n_0"]


def test_unsorted_nodes_dropout_mask_and_weights_listed_as_inputs():
    nodes = [helper.make_node("Dropout", ["h", "ratio"], ["y", "mask"]),
             helper.make_node("MatMul", ["x", "w"], ["h"])]
    w = np.ones((3, 2), np.float32)
    model = _model(nodes, [_vi("x", [2, 3]), _vi("w", [3, 2])], [_vi("y", [2, 2])],
                   [_w("w", w), _w("ratio", np.array(0.1, np.float32))], opset=13)
    graph, out = _round_trip(model)
    assert graph.inputs == ("x",) and graph.is_weight("w")
    dropout = next(n for n in graph.nodes.values() if n.op == "Dropout")
    assert dropout.outputs == ("y",)  # the unused mask is gone
    assert [n.op for n in graph.topological_order] == ["MatMul", "Dropout"]


# ----- errors ----------------------------------------------------------------------------------
def _cyclic_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])]
    return _model(nodes, [_vi("x", [2])], [_vi("b", [2])])


def test_bad_files_raise_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        load_onnx(tmp_path / "missing.onnx")
    with pytest.raises(ModelLoadError, match="is a directory"):
        load_onnx(tmp_path)
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a protobuf at all, just some text\n" * 3)
    with pytest.raises(ModelLoadError, match="is not a valid ONNX model"):
        load_onnx(text)
    whole = conv_net().SerializeToString()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ModelLoadError, match="is not a valid ONNX model"):
        load_onnx(cut)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="not a valid ONNX model"):
        load_onnx(empty)


def test_bad_graphs_raise(tmp_path):
    with pytest.raises(InvalidGraphError, match="cycle"):
        from_onnx(_cyclic_model())
    with pytest.raises(ModelLoadError, match="empty"):
        from_onnx(_model([], [_vi("x", [2])], [_vi("x", [2])]))
    dangling = _model([helper.make_node("Add", ["x", "nowhere"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(InvalidGraphError, match="'nowhere', which nothing defines"):
        from_onnx(dangling)
    data_dependent = _model([helper.make_node("NonZero", ["x"], ["nz"])], [_vi("x", [4])],
                            [_vi("nz", None, TensorProto.INT64)])
    with pytest.raises(DynamicShapeError, match="'nz'"):
        from_onnx(data_dependent)


def test_control_flow_is_refused_with_a_clear_message():
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "branch", [], [_vi("o", [2])])
    model = _model([helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
                   [_vi("x", [2]), _vi("c", [], TensorProto.BOOL)], [_vi("y", [2])])
    with pytest.raises(ModelLoadError, match=r"'If_0' \(If\) has a GRAPH attribute .* not supported"):
        from_onnx(model)


def test_dynamic_input_shape_error_names_the_input_and_the_fix(tmp_path):
    path = tmp_path / "convnet.onnx"
    save_onnx(conv_net(), path)
    with pytest.raises(DynamicShapeError) as err:
        load_onnx(path)
    msg = str(err.value)
    assert "'x' has dynamic shape (batch, 3, 16, 16)" in msg and "--input-shape x=1,3,16,16" in msg
    assert "\n" not in msg
    graph = load_onnx(path, {"x": [3, 3, 16, 16]})
    assert graph.name == "convnet" and graph.types["logits"] == TensorType((3, 10))
    stale = conv_net()  # an output declared for batch 1 does not outvote the pinned batch
    stale.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 1
    assert from_onnx(stale, {"x": (2, 3, 16, 16)}).types["logits"] == TensorType((2, 10))


@pytest.mark.parametrize("shapes,pattern", [
    ({"nope": (1, 3, 16, 16)}, r"'nope', which is not an input .*inputs: x"),
    ({"x": (1, 3, 16)}, "has rank 3, but input 'x' .* has rank 4"),
    ({"x": (1, 4, 16, 16)}, "sets dim 1 to 4, but .* fixes it to 3"),
])
def test_bad_input_shapes_raise_config_error(shapes, pattern):
    with pytest.raises(ConfigError, match=pattern):
        from_onnx(conv_net(), shapes)


def test_every_error_is_one_line_xrl_error(tmp_path):
    for bad in (lambda: load_onnx(tmp_path / "x.onnx"), lambda: from_onnx(_cyclic_model()),
                lambda: from_onnx(conv_net())):
        with pytest.raises(XrlError) as err:
            bad()
        assert "\n" not in str(err.value)


# ----- saving ----------------------------------------------------------------------------------
def test_save_is_atomic_and_round_trips(tmp_path, monkeypatch):
    model = conv_net()
    path = save_onnx(model, tmp_path / "m.onnx")
    assert onnx.load(str(path)) == model and os.listdir(tmp_path) == ["m.onnx"]
    with pytest.raises(OutputPathError, match="is a directory"):
        save_onnx(model, tmp_path)
    with pytest.raises(OutputPathError, match="does not exist"):
        save_onnx(model, tmp_path / "no" / "m.onnx")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(onnx_write.os, "replace", broken_replace)
    with pytest.raises(OutputPathError, match="No space left"):
        save_onnx(model, tmp_path / "other.onnx")
    assert os.listdir(tmp_path) == ["m.onnx"]  # no partial or temporary file left behind


def test_big_models_go_to_external_data(tmp_path, monkeypatch):
    model = conv_net()
    before = model.SerializeToString()
    monkeypatch.setattr(onnx_write, "EXTERNAL_DATA_THRESHOLD", 100)
    monkeypatch.setattr(onnx_write, "EXTERNAL_MIN_TENSOR", 256)  # only w1 (864 bytes) and fc (320) move
    path = save_onnx(model, tmp_path / "big.onnx")
    assert model.SerializeToString() == before  # the caller's model keeps its weights inline
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 2 and names[0] == "big.onnx" and re.fullmatch(r"big\.onnx\.[0-9a-f]{12}\.data", names[1])
    assert os.path.getsize(tmp_path / names[1]) == 864 + 320
    assert os.path.getsize(tmp_path / "big.onnx") < len(before) - 1000
    graph = load_onnx(path, {"x": (1, 3, 16, 16)})
    np.testing.assert_array_equal(graph.initializers["w1"], numpy_helper.to_array(model.graph.initializer[0]))
    assert compare_models(onnx.load(str(path)), to_onnx(graph)).ok


# ----- verification ----------------------------------------------------------------------------
def test_random_feeds_are_seeded_and_respect_index_ranges():
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
             helper.make_node("Where", ["flag", "emb", "emb"], ["y"])]
    model = _model(nodes, [_vi("ids", [4, 50], TensorProto.INT64), _vi("flag", [4, 50, 1], TensorProto.BOOL)],
                   [_vi("y", [4, 50, 3])], [_w("table", np.zeros((7, 3), np.float32))])
    a, b, c = random_feeds(model, 0), random_feeds(model, 0), random_feeds(model, 1)
    assert a.keys() == {"ids", "flag"}
    np.testing.assert_array_equal(a["ids"], b["ids"])
    assert not np.array_equal(a["ids"], c["ids"])
    assert a["ids"].dtype == np.int64 and a["ids"].min() >= 0 and a["ids"].max() == 6
    assert a["flag"].dtype == np.bool_ and 0 < a["flag"].mean() < 1
    scalars = _model([helper.make_node("Where", ["c", "s", "s"], ["o"])],
                     [_vi("c", [], TensorProto.BOOL), _vi("s", [])], [_vi("o", [])])
    feeds = random_feeds(scalars, 3)
    assert all(isinstance(v, np.ndarray) and v.shape == () for v in feeds.values())
    assert run_onnx(scalars, feeds)[0] == feeds["s"]
    graph_feeds = random_feeds(from_onnx(model), 0)
    assert graph_feeds["ids"].max() == 6
    floats = random_feeds(from_onnx(conv_net(), {"x": (64, 3, 16, 16)}), 0)["x"]
    assert floats.dtype == np.float32 and abs(floats.mean()) < 0.05 and abs(floats.std() - 1) < 0.05


def test_compare_models_catches_wrong_results_and_tolerates_rounding():
    model = conv_net()
    graph = from_onnx(model, {"x": (2, 3, 16, 16)})
    w = graph.initializers["fcb"]
    for delta, ok in ((1e-7, True), (1e-2, False)):
        changed = graph.replace(new_weights={"fcb": (w + delta).astype(np.float32)})
        res = compare_models(model, to_onnx(changed))
        assert res.ok is ok, res.detail
        assert res.trials == (2 if ok else 1)
    assert "output 0 ('logits')" in res.detail and "tolerance" in res.detail
    other_inputs = _model([helper.make_node("Relu", ["z"], ["logits"])], [_vi("z", [2, 10])], [_vi("logits", [2, 10])])
    res = compare_models(model, other_inputs)
    assert not res.ok and "inputs differ" in res.detail


# ----- torch -----------------------------------------------------------------------------------
def test_torch_exported_module_loads(tmp_path):
    torch = pytest.importorskip("torch")

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.fc = torch.nn.Linear(4 * 8 * 8, 5)

        def forward(self, x):
            h = torch.relu(self.conv(x))
            return self.fc(h.reshape(x.shape[0], -1))  # exported as a Shape -> Gather -> Concat chain

    torch.manual_seed(0)
    module = Tiny().eval()
    x = torch.randn(2, 3, 8, 8)
    path = tmp_path / "tiny.onnx"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=17, input_names=["x"],
                              output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    except Exception as e:  # neither exporter usable in this torch build
        pytest.skip(f"torch.onnx.export unavailable: {e}")
    graph = load_onnx(path, {"x": (2, 3, 8, 8)})
    assert "Shape" not in graph.op_histogram() and graph.types["y"] == TensorType((2, 5))
    out = to_onnx(graph)
    onnx.checker.check_model(out, full_check=True)
    (y,) = run_onnx(out, {"x": x.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(y, module(x).numpy(), rtol=1e-4, atol=1e-5)


# ----- scale -----------------------------------------------------------------------------------
def big_mlp(blocks: int = 100, width: int = 704, batch: int = 4) -> onnx.ModelProto:
    """~500 nodes and ~50M parameters: blocks of MatMul, Add, Relu, Mul and a residual Add."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    h = "x"
    for i in range(blocks):
        inits += [_w(f"w{i}", (rng.standard_normal((width, width)) / math.sqrt(width)).astype(np.float32)),
                  _w(f"b{i}", np.zeros(width, np.float32)), _w(f"s{i}", np.array(0.5, np.float32))]
        nodes += [helper.make_node("MatMul", [h, f"w{i}"], [f"mm{i}"]),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"ba{i}"]),
                  helper.make_node("Relu", [f"ba{i}"], [f"r{i}"]),
                  helper.make_node("Mul", [f"r{i}", f"s{i}"], [f"sc{i}"]),
                  helper.make_node("Add", [f"sc{i}", h], [f"h{i}"])]
        h = f"h{i}"
    return _model(nodes, [_vi("x", ["batch", width])], [_vi(h, ["batch", width])], inits, name="big_mlp")


@pytest.mark.slow
def test_500_node_50m_parameter_model_imports_and_exports(tmp_path):
    model = big_mlp()
    path = tmp_path / "big.onnx"
    save_onnx(model, path)
    t0 = time.perf_counter()
    graph = load_onnx(path, {"x": (4, 704)})
    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = to_onnx(graph)
    t_export = time.perf_counter() - t0
    assert len(graph) == 500 and graph.num_parameters == 100 * (704 * 704 + 705)
    print(f"\nimport {t_import:.2f}s, export {t_export:.2f}s for {len(graph)} nodes, "
          f"{graph.num_parameters / 1e6:.1f}M parameters")
    assert t_import < 30 and t_export < 30
    res = compare_models(model, out, trials=1)
    assert res.ok, res.detail


def test_compare_arrays_rules():
    from xrl.frontends.verify import compare_arrays

    ref = np.array([1.0, np.nan, np.inf, -2.0], np.float32)
    assert compare_arrays(ref, ref.copy(), rtol=1e-3, atol=0)[0] == ""  # NaN and inf where the reference has them
    assert "NaN" in compare_arrays(ref, np.array([1, 0, np.inf, -2], np.float32), rtol=1e-3, atol=0)[0]
    close = compare_arrays(ref, ref + np.float32(1e-3), rtol=1e-3, atol=0)  # 1e-3 <= 1e-3 * max|ref| (2)
    assert close[0] == "" and close[1] == pytest.approx(1e-3, rel=1e-3) and close[2] == pytest.approx(5e-4, rel=1e-3)
    assert "tolerance" in compare_arrays(ref, ref + np.float32(3e-3), rtol=1e-3, atol=0)[0]
    ints = np.arange(4)
    assert "exact match" in compare_arrays(ints, ints + 1, rtol=1.0, atol=10.0)[0]
    assert "shape" in compare_arrays(ints, ints[:3], rtol=1e-3, atol=1e-4)[0]
    assert "dtype" in compare_arrays(ints, ints.astype(np.int32), rtol=1e-3, atol=1e-4)[0]


def test_non_contiguous_and_scalar_weights_export_in_c_order():
    w = np.arange(6, dtype=np.float32).reshape(3, 2).T  # a transposed view, as a rewrite may leave it
    s = np.array(2.0, np.float32)
    graph = Graph([Node("mm", "MatMul", ("x", "w"), ("h",)), Node("mul", "Mul", ("h", "s"), ("y",))], ["x"], ["y"],
                  {"x": TensorType((4, 2)), "w": TensorType((2, 3)), "s": TensorType(()), "y": TensorType((4, 3)),
                   "h": TensorType((4, 3))}, {"w": w, "s": s}).validate()
    feeds = random_feeds(graph, seed=0)
    (y,) = run_onnx(to_onnx(graph), feeds)
    np.testing.assert_allclose(y, feeds["x"] @ w * 2, rtol=1e-6)
