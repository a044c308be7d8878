"""ReduceProd, Not, And, Or in the IR (shape inference, FLOPs, the numpy and torch executors, ONNX
import/export checked against onnxruntime), their HLO lowerings (multiply reductions, pred logic,
reduce-window sums), and non-default-domain opset versions kept through import, rewrites and export."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from xrl.cost.torch_exec import TorchExecutor
from xrl.errors import ShapeInferenceError
from xrl.frontends.hlo import XLA_DOMAIN, parse_hlo
from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.ir import Graph, Node, TensorType
from xrl.ir.execute import execute
from xrl.ir.ops import infer_types, node_flops, op_kind

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


# ----- helpers ---------------------------------------------------------------------------------
def make_model(nodes, inputs: dict[str, tuple[int, tuple[int, ...]]], outputs: dict[str, tuple[int, tuple | None]],
               inits: dict[str, np.ndarray] | None = None, opset: int = 17, extra_opsets=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(k, e, s) for k, (e, s) in inputs.items()],
                          [helper.make_tensor_value_info(k, e, s) for k, (e, s) in outputs.items()],
                          [numpy_helper.from_array(np.asarray(a), k) for k, a in (inits or {}).items()])
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    return helper.make_model(g, opset_imports=opsets, ir_version=8)


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def random_feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Floats in [0.5, 1.5) with random signs (products stay finite), small ints, random bools."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in graph.inputs:
        t = graph.type_of(v)
        if t.dtype == "bool":
            feeds[v] = rng.random(t.shape) < 0.5
        elif t.dtype.startswith("int"):
            feeds[v] = rng.integers(-3, 4, t.shape).astype(t.dtype)
        else:
            mag = rng.random(t.shape) + 0.5
            feeds[v] = (mag * rng.choice([-1.0, 1.0], t.shape)).astype(t.dtype)
    return feeds


def assert_same(got, want, what: str, rtol: float = 1e-5) -> None:
    assert len(got) == len(want), what
    for j, (a, b) in enumerate(zip(got, want, strict=True)):
        a = np.asarray(a)
        assert a.shape == b.shape, (what, j, a.shape, b.shape)
        if b.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6, err_msg=f"{what} output {j}")
        else:
            assert a.dtype == b.dtype, (what, j, a.dtype, b.dtype)
            np.testing.assert_array_equal(a, b, err_msg=f"{what} output {j}")


def check_executors(graph: Graph, model: onnx.ModelProto | None = None, seed: int = 0) -> list[np.ndarray]:
    """The graph's export, the numpy reference and the torch executor all compute what onnxruntime
    computes on `model` (default: the export). Returns onnxruntime's outputs."""
    feeds = random_feeds(graph, seed)
    exported = to_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    want = ort_run(model if model is not None else exported, feeds)
    if model is not None:
        assert_same(ort_run(exported, feeds), want, "export under onnxruntime")
    ref = [np.asarray(a).astype(w.dtype) for a, w in zip(execute(graph, feeds), want, strict=True)]
    assert_same(ref, want, "numpy reference executor")
    assert_same([t.numpy() for t in TorchExecutor(graph).run(feeds)], want, "torch executor")
    return want


# ----- the ops through ONNX --------------------------------------------------------------------
@dataclass
class Case:
    name: str
    nodes: list
    inputs: dict
    outputs: dict  # name -> (elem, shape): the declared output types, which import must infer
    inits: dict = field(default_factory=dict)
    opset: int = 17
    ir_attrs: dict | None = None  # the canonical attributes of the (single) new-op node


CASES = [
    Case("reduceprod_attr_axes", [helper.make_node("ReduceProd", ["x"], ["y"], axes=[0, 2], keepdims=0)],
         {"x": (F32, (3, 4, 5))}, {"y": (F32, (4,))}, ir_attrs={"axes": (0, 2), "keepdims": 0}),
    Case("reduceprod_input_axes", [helper.make_node("ReduceProd", ["x", "ax"], ["y"])],
         {"x": (F32, (2, 3, 4))}, {"y": (F32, (2, 1, 1))}, {"ax": np.array([-1, 1], np.int64)}, opset=18,
         ir_attrs={"axes": (-1, 1)}),
    Case("reduceprod_all_axes", [helper.make_node("ReduceProd", ["x"], ["y"], keepdims=0)],
         {"x": (F32, (2, 3))}, {"y": (F32, ())}, opset=13, ir_attrs={"keepdims": 0}),
    Case("reduceprod_int64", [helper.make_node("ReduceProd", ["x", "ax"], ["y"], keepdims=0)],
         {"x": (I64, (3, 5))}, {"y": (I64, (3,))}, {"ax": np.array([1], np.int64)}, opset=18,
         ir_attrs={"axes": (1,), "keepdims": 0}),
    Case("not", [helper.make_node("Not", ["x"], ["y"])], {"x": (BOOL, (2, 3, 4))}, {"y": (BOOL, (2, 3, 4))},
         ir_attrs={}),
    Case("and_broadcast", [helper.make_node("And", ["x", "z"], ["y"])], {"x": (BOOL, (2, 3, 4)), "z": (BOOL, (3, 1))},
         {"y": (BOOL, (2, 3, 4))}, ir_attrs={}),
    Case("or_broadcast", [helper.make_node("Or", ["x", "z"], ["y"])], {"x": (BOOL, (4, 1)), "z": (BOOL, (5,))},
         {"y": (BOOL, (4, 5))}, ir_attrs={}),
    Case("logic_chain_from_compare",
         [helper.make_node("Greater", ["a", "b"], ["g"]), helper.make_node("Less", ["a", "c"], ["l"]),
          helper.make_node("And", ["g", "l"], ["both"]), helper.make_node("Not", ["both"], ["n"]),
          helper.make_node("Or", ["n", "g"], ["y"]), helper.make_node("Where", ["y", "a", "b"], ["w"]),
          helper.make_node("ReduceProd", ["w"], ["p"], axes=[1], keepdims=1)],
         {"a": (F32, (3, 4)), "b": (F32, (3, 4))}, {"y": (BOOL, (3, 4)), "p": (F32, (3, 1))},
         {"c": np.full((4,), 0.25, np.float32)}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_new_op_imports_infers_exports_and_runs(case: Case) -> None:
    model = make_model(case.nodes, case.inputs, case.outputs, case.inits, case.opset)
    onnx.checker.check_model(model, full_check=True)
    g = from_onnx(model)
    assert not [n for n in g.nodes.values() if n.domain], "nothing may stay opaque"
    new = [n for n in g.nodes.values() if n.op in ("ReduceProd", "Not", "And", "Or")]
    assert new and all(op_kind(n.op) != "opaque" for n in new)
    for v, (elem, shape) in case.outputs.items():
        assert g.types[v] == TensorType(shape, {F32: "float32", I64: "int64", BOOL: "bool"}[elem]), v
    assert all(node_flops(n, g) > 0 for n in new)
    if case.ir_attrs is not None:
        (node,) = new
        assert dict(node.attrs) == case.ir_attrs and len(node.inputs) == (2 if node.op in ("And", "Or") else 1)
    check_executors(g, model)


def test_reduceprod_axes_follow_the_export_opset() -> None:
    model = make_model([helper.make_node("ReduceProd", ["x"], ["y"], axes=[1], keepdims=0)],
                       {"x": (F32, (2, 3, 4))}, {"y": (F32, (2, 4))})
    g = from_onnx(model)
    x = random_feeds(g)
    for opset, n_inputs in ((17, 1), (18, 2)):
        out = to_onnx(g, opset=opset)
        onnx.checker.check_model(out, full_check=True)
        (node,) = [n for n in out.graph.node if n.op_type == "ReduceProd"]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert len(node.input) == n_inputs
        assert attrs == ({"axes": [1], "keepdims": 0} if opset == 17 else {"keepdims": 0})
        assert_same(ort_run(out, x), [np.prod(x["x"], axis=1)], f"opset {opset}")


def test_logical_ops_reject_non_bool_inputs_and_wrong_arity() -> None:
    f, b = TensorType((2, 3)), TensorType((2, 3), "bool")
    assert infer_types(Node("n", "And", ("a", "b"), ("y",)), [b, TensorType((3,), "bool")], [None, None]) == [b]
    assert infer_types(Node("n", "Not", ("a",), ("y",)), [b], [None]) == [b]
    with pytest.raises(ShapeInferenceError, match="bool"):
        infer_types(Node("n", "Or", ("a", "b"), ("y",)), [f, b], [None, None])
    with pytest.raises(ShapeInferenceError, match="bool"):
        infer_types(Node("n", "Not", ("a",), ("y",)), [f], [None])
    with pytest.raises(ShapeInferenceError, match="2 inputs"):
        infer_types(Node("n", "And", ("a",), ("y",)), [b], [None])
    with pytest.raises(ShapeInferenceError, match="1 input"):
        infer_types(Node("n", "Not", ("a", "b"), ("y",)), [b, b], [None, None])


def test_reduceprod_flops_and_int32_keeps_its_width() -> None:
    x = TensorType((4, 6), "int32")
    node = Node("p", "ReduceProd", ("x",), ("y",), {"axes": (1,), "keepdims": 0})
    (y,) = infer_types(node, [x], [None])
    assert y == TensorType((4,), "int32")
    g = Graph([node], ["x"], ["y"], {"x": x, "y": y}).validate()
    assert node_flops(node, g) == 24
    feeds = {"x": np.arange(1, 25, dtype=np.int32).reshape(4, 6) % 5 + 1}
    (ref,) = execute(g, feeds)
    (got,) = TorchExecutor(g).run(feeds)
    assert ref.dtype == np.int32 and got.numpy().dtype == np.int32
    np.testing.assert_array_equal(ref, np.prod(feeds["x"], axis=1))
    np.testing.assert_array_equal(got.numpy(), ref)


# ----- HLO lowering ----------------------------------------------------------------------------
def hlo(body: str) -> Graph:
    return parse_hlo(f"HloModule m\n\n{body}", name="snippet")


def opaque(g: Graph) -> list[Node]:
    return [n for n in g.nodes.values() if n.domain == XLA_DOMAIN]


def check_hlo(g: Graph, inputs: list[np.ndarray], want: list[np.ndarray]) -> None:
    """Reference executor, onnxruntime (on the export) and torch executor against numpy `want`."""
    feeds = dict(zip(g.inputs, inputs, strict=True))
    got = [np.asarray(a).astype(w.dtype) for a, w in zip(execute(g, feeds), want, strict=True)]
    assert_same(got, want, "numpy reference executor")
    exported = to_onnx(g)
    onnx.checker.check_model(exported, full_check=True)
    assert_same(ort_run(exported, feeds), want, "onnxruntime")
    assert_same([t.numpy() for t in TorchExecutor(g).run(feeds)], want, "torch executor")


_MUL = """
mul {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] multiply(a, b)
}
"""


def test_hlo_multiply_reduce_is_reduceprod():
    g = hlo(_MUL + """
ENTRY main {
  x = f32[3,4,5] parameter(0)
  one = f32[] constant(1)
  two = f32[] constant(2)
  p = f32[3] reduce(x, one), dimensions={1,2}, to_apply=mul
  q = f32[4] reduce(x, two), dimensions={2,0}, to_apply=mul
  ROOT t = (f32[3], f32[4]) tuple(p, q)
}""")
    assert not opaque(g)
    prods = sorted(n.attrs["axes"] for n in g.nodes.values() if n.op == "ReduceProd")
    assert prods == [(0, 2), (1, 2)]
    assert g.op_histogram().get("Mul") == 1  # the init 2 folds in once; 1 is neutral
    x = random_feeds(g)["x"]
    check_hlo(g, [x], [np.prod(x, axis=(1, 2)), 2 * np.prod(x, axis=(0, 2))])


def test_hlo_pred_logic_lowers_to_not_and_or():
    g = hlo("""
ENTRY main {
  a = f32[3,4] parameter(0)
  b = f32[3,4] parameter(1)
  m = pred[4] parameter(2)
  gt = pred[3,4] compare(a, b), direction=GT
  lt = pred[3,4] compare(a, b), direction=LT
  mb = pred[3,4] broadcast(m), dimensions={1}
  both = pred[3,4] and(gt, mb)
  either = pred[3,4] or(lt, mb)
  neither = pred[3,4] not(either)
  nm = pred[3,4] not(mb)
  x = pred[3,4] xor(gt, mb)
  ROOT t = (pred[3,4], pred[3,4], pred[3,4], pred[3,4], pred[3,4]) tuple(both, either, neither, nm, x)
}""")
    assert not opaque(g)
    hist = g.op_histogram()
    assert (hist["And"], hist["Or"], hist["Not"]) == (1, 1, 3)  # xor: Not(Equal)
    and_node = next(n for n in g.nodes.values() if n.op == "And")
    assert and_node.inputs[1] == "m"  # the broadcast mask is read numpy-style, not expanded
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    m = np.array([True, False, True, False])
    gt, lt = a > b, a < b
    check_hlo(g, [a, b, m], [gt & m, lt | m, ~(lt | m), np.broadcast_to(~m, (3, 4)), gt ^ m])


def test_hlo_integer_bitwise_logic_stays_opaque():
    g = hlo("""
ENTRY main {
  a = s32[5] parameter(0)
  b = s32[5] parameter(1)
  x = s32[5] and(a, b)
  y = s32[5] or(x, b)
  ROOT z = s32[5] not(y)
}""")
    assert sorted(n.op for n in opaque(g)) == ["and", "not", "or"]
    assert g.types[g.outputs[0]] == TensorType((5,), "int32")


_ADD = """
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""


def window_sum_nhwc(x: np.ndarray, k: int, s: int, pad: int) -> np.ndarray:
    xp = np.pad(x, [(0, 0), (pad, pad), (pad, pad), (0, 0)])
    n, h, w, c = xp.shape
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    out = np.zeros((n, oh, ow, c), x.dtype)
    for i in range(oh):
        for j in range(ow):
            out[:, i, j] = xp[:, i * s:i * s + k, j * s:j * s + k].sum(axis=(1, 2))
    return out


def test_hlo_reduce_window_sum_is_average_pool_times_window():
    g = hlo(_ADD + """
ENTRY main {
  x = f32[2,7,7,3] parameter(0)
  zero = f32[] constant(0)
  ROOT s = f32[2,4,4,3] reduce-window(x, zero), window={size=1x3x3x1 stride=1x2x2x1 pad=0_0x1_1x1_1x0_0}, to_apply=add
}""")
    assert not opaque(g)
    (pool,) = [n for n in g.nodes.values() if n.op == "AveragePool"]
    assert pool.attrs == {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "count_include_pad": 1}
    assert g.op_histogram() == {"Transpose": 2, "AveragePool": 1, "Mul": 1}  # NHWC in and out
    x = random_feeds(g)["x"]
    check_hlo(g, [x], [window_sum_nhwc(x, 3, 2, 1)])


def test_hlo_reduce_window_sum_divided_by_its_size_is_just_average_pool():
    # flax's avg_pool: a window sum over the window size (padding counted)
    g = hlo(_ADD + """
ENTRY main {
  x = f32[1,3,6,6] parameter(0)
  zero = f32[] constant(0)
  s = f32[1,3,3,3] reduce-window(x, zero), window={size=1x1x2x2 stride=1x1x2x2}, to_apply=add
  four = f32[] constant(4)
  fb = f32[1,3,3,3] broadcast(four), dimensions={}
  ROOT avg = f32[1,3,3,3] divide(s, fb)
}""")
    assert g.op_histogram() == {"AveragePool": 1}
    x = random_feeds(g)["x"]
    check_hlo(g, [x], [x.reshape(1, 3, 3, 2, 3, 2).mean(axis=(3, 5))])


def test_hlo_reduce_window_cumulative_sum_reshapes_to_one_channel():
    # jax's cumsum on CPU: a window as long as the axis, padded on the left
    g = hlo(_ADD + """
ENTRY main {
  x = f32[6] parameter(0)
  y = f32[3,5] parameter(1)
  zero = f32[] constant(0)
  c = f32[6] reduce-window(x, zero), window={size=6 pad=5_0}, to_apply=add
  d = f32[3,5] reduce-window(y, zero), window={size=3x1 pad=2_0x0_0}, to_apply=add
  ROOT t = (f32[6], f32[3,5]) tuple(c, d)
}""")
    assert not opaque(g)
    assert g.op_histogram()["AveragePool"] == 2
    feeds = random_feeds(g)
    x, y = feeds["x"], feeds["y"]
    check_hlo(g, [x, y], [np.cumsum(x), np.cumsum(y, axis=0)])


@pytest.mark.parametrize("window, shape", [
    ("size=1x2x2x1 rhs_dilate=1x2x2x1", "f32[1,6,6,3]"),  # window dilation: no dilated AveragePool in torch
    ("size=1x2x2x1 lhs_dilate=1x2x2x1", "f32[1,14,14,3]"),  # base dilation
    ("size=1x2x2x1 pad=0_0x2_2x0_0x0_0", "f32[1,11,7,3]"),  # a pad as wide as the window: onnxruntime refuses it
    ("size=2x2x2x2", "f32[1,7,7,2]"),  # 4 pooled dims
])
def test_hlo_reduce_window_sum_without_an_onnx_form_stays_opaque(window: str, shape: str):
    g = hlo(_ADD + f"""
ENTRY main {{
  x = f32[1,8,8,3] parameter(0)
  zero = f32[] constant(0)
  ROOT s = {shape} reduce-window(x, zero), window={{{window}}}, to_apply=add
}}""")
    assert [n.op for n in opaque(g)] == ["reduce-window"]


def test_hlo_reduce_window_max_is_unchanged():
    g = hlo("""
max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}

ENTRY main {
  x = f32[1,4,4,2] parameter(0)
  ninf = f32[] constant(-inf)
  ROOT m = f32[1,2,2,2] reduce-window(x, ninf), window={size=1x2x2x1 stride=1x2x2x1}, to_apply=max
}""")
    assert g.op_histogram() == {"Transpose": 2, "MaxPool": 1}
    x = random_feeds(g)["x"]
    check_hlo(g, [x], [x.reshape(1, 2, 2, 2, 2, 2).max(axis=(2, 4))])


# ----- non-default domains keep their opset versions ---------------------------------------------
def test_com_microsoft_op_round_trips_with_its_opset_and_runs():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Gelu", ["h"], ["g"], domain="com.microsoft"),
             helper.make_node("Relu", ["g"], ["y"])]
    w = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    model = make_model(nodes, {"x": (F32, (2, 8))}, {"y": (F32, (2, 6))}, {"w": w},
                       extra_opsets=[("com.microsoft", 1)])
    model.graph.value_info.append(helper.make_tensor_value_info("g", F32, (2, 6)))  # onnx cannot infer contrib ops
    g = from_onnx(model)
    (gelu,) = [n for n in g.nodes.values() if n.op == "Gelu"]
    assert gelu.domain == "com.microsoft"  # opaque: not the IR's (default-domain) Gelu
    assert g.domain_opsets == {"com.microsoft": 1}
    out = to_onnx(g)
    assert {d.domain: d.version for d in out.opset_import} == {d.domain: d.version for d in model.opset_import}
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)}
    assert_same(ort_run(out, feeds), ort_run(model, feeds), "com.microsoft round trip")


def test_made_up_domain_version_survives_import_rewrites_and_export():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Thing", ["r"], ["t"], domain="custom.x", alpha=0.5),
             helper.make_node("Neg", ["t"], ["y"])]
    model = make_model(nodes, {"x": (F32, (2, 3))}, {"y": (F32, (2, 3))},
                       extra_opsets=[("custom.x", 7), ("unused.y", 3)])
    model.graph.value_info.append(helper.make_tensor_value_info("t", F32, (2, 3)))
    g = from_onnx(model)
    assert g.domain_opsets == {"custom.x": 7, "unused.y": 3}
    relu = next(n for n in g.nodes.values() if n.op == "Relu")
    rewritten = g.replace(remove=[relu.name], add=[Node("relu2", "Relu", relu.inputs, ("r2",))],
                          rename={"r": "r2"}, new_types={"r2": g.types["r"]})
    assert "relu2" in rewritten.nodes and rewritten.domain_opsets == g.domain_opsets
    assert rewritten.canonical_hash == g.canonical_hash  # metadata, not structure
    for graph in (g, rewritten):
        out = to_onnx(graph)
        # only domains a node uses are declared, each at the version the source model imported
        assert {d.domain: d.version for d in out.opset_import} == {"": 17, "custom.x": 7}
        (thing,) = [n for n in out.graph.node if n.op_type == "Thing"]
        assert thing.domain == "custom.x"


def test_graph_without_recorded_domain_versions_falls_back_to_onnx_registry():
    g = Graph([Node("t", "Thing", ("x",), ("y",), {}, "custom.x")], ["x"], ["y"],
              {"x": TensorType((2,)), "y": TensorType((2,))}).validate()
    assert g.domain_opsets == {}
    assert {d.domain: d.version for d in to_onnx(g).opset_import} == {"": 17, "custom.x": 1}
    pinned = Graph(g.nodes.values(), g.inputs, g.outputs, g.types, domain_opsets={"custom.x": 4, "": 99})
    assert pinned.domain_opsets == {"custom.x": 4}  # the default domain's version is the export's choice
    assert {d.domain: d.version for d in to_onnx(pinned).opset_import} == {"": 17, "custom.x": 4}
