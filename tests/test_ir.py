"""The IR: shape inference, FLOPs, validation, topological order, canonical hashing (incremental too)."""

from __future__ import annotations

import numpy as np
import pytest

from xrl.errors import InvalidGraphError, ShapeInferenceError
from xrl.ir import Graph, Node, TensorType
from xrl.ir.ops import graph_flops, infer_types, node_bytes, node_flops, op_kind

T = TensorType


def infer(op: str, ins: list[TensorType], consts=None, n_out: int = 1, **attrs) -> list[TensorType]:
    node = Node("n", op, tuple(f"i{k}" for k in range(len(ins))), tuple(f"o{k}" for k in range(n_out)), attrs)
    return infer_types(node, ins, consts or [None] * len(ins))


def shapes(outs: list[TensorType]) -> list[tuple[int, ...]]:
    return [o.shape for o in outs]


@pytest.mark.parametrize(("ins", "attrs", "expected"), [
    ([(1, 3, 224, 224), (64, 3, 7, 7)], dict(strides=(2, 2), pads=(3, 3, 3, 3)), (1, 64, 112, 112)),
    ([(1, 64, 56, 56), (128, 2, 3, 3)], dict(group=32, pads=(1, 1, 1, 1)), (1, 128, 56, 56)),
    ([(1, 8, 32, 32), (8, 8, 3, 3)], dict(dilations=(2, 2), pads=(2, 2, 2, 2)), (1, 8, 32, 32)),
    ([(2, 8, 17, 17), (4, 8, 1, 7)], dict(pads=(0, 3, 0, 3)), (2, 4, 17, 17)),
    ([(1, 3, 299, 299), (32, 3, 3, 3)], dict(strides=(2, 2), auto_pad="VALID"), (1, 32, 149, 149)),
])
def test_conv_shapes(ins, attrs, expected):
    assert shapes(infer("Conv", [T(s) for s in ins], **attrs)) == [expected]


def test_conv_errors():
    with pytest.raises(ShapeInferenceError, match="input channels"):
        infer("Conv", [T((1, 3, 8, 8)), T((4, 2, 3, 3))])
    with pytest.raises(ShapeInferenceError, match="does not fit"):
        infer("Conv", [T((1, 3, 2, 2)), T((4, 3, 3, 3))])
    with pytest.raises(ShapeInferenceError, match="fused activation"):
        infer("Conv", [T((1, 3, 8, 8)), T((4, 3, 3, 3))], activation="Softmax")


@pytest.mark.parametrize(("a", "b", "out"), [
    ((4, 8), (8, 16), (4, 16)), ((2, 3, 4, 8), (8, 5), (2, 3, 4, 5)), ((2, 1, 4, 8), (3, 8, 5), (2, 3, 4, 5)),
    ((8,), (8, 5), (5,)), ((4, 8), (8,), (4,)),
])
def test_matmul_shapes(a, b, out):
    assert shapes(infer("MatMul", [T(a), T(b)])) == [out]
    with pytest.raises(ShapeInferenceError, match="inner"):
        infer("MatMul", [T((4, 7)), T((8, 5))])


def test_gemm_and_broadcast():
    assert shapes(infer("Gemm", [T((4, 8)), T((16, 8)), T((16,))], transB=1)) == [(4, 16)]
    assert shapes(infer("Add", [T((2, 1, 5)), T((3, 1))])) == [(2, 3, 5)]
    assert infer("Equal", [T((3,)), T((3,))])[0].dtype == "bool"
    with pytest.raises(ShapeInferenceError, match="broadcast"):
        infer("Mul", [T((2, 3)), T((4,))])


def test_data_movement_shapes():
    i64 = np.array
    assert shapes(infer("Concat", [T((1, 2, 4)), T((1, 3, 4))], axis=1)) == [(1, 5, 4)]
    assert shapes(infer("Split", [T((6, 4))], n_out=2, axis=0, split=(2, 4))) == [(2, 4), (4, 4)]
    assert shapes(infer("Split", [T((6, 4))], n_out=3, axis=0)) == [(2, 4)] * 3
    assert shapes(infer("Reshape", [T((2, 3, 4)), T((2,), "int64")], [None, i64([0, -1])])) == [(2, 12)]
    assert shapes(infer("Transpose", [T((2, 3, 4))], perm=(2, 0, 1))) == [(4, 2, 3)]
    assert shapes(infer("Flatten", [T((2, 3, 4, 5))], axis=2)) == [(6, 20)]
    assert shapes(infer("Squeeze", [T((1, 3, 1))], axes=(0,))) == [(3, 1)]
    assert shapes(infer("Unsqueeze", [T((3, 4))], axes=(0, -1))) == [(1, 3, 4, 1)]
    sl = infer("Slice", [T((10, 8)), T((1,), "int64"), T((1,), "int64"), T((1,), "int64"), T((1,), "int64")],
               [None, i64([1]), i64([100]), i64([1]), i64([2])])
    assert shapes(sl) == [(10, 4)]
    assert shapes(infer("Pad", [T((1, 2, 3, 3)), T((8,), "int64")], [None, i64([0, 0, 1, 1, 0, 0, 1, 1])])) \
        == [(1, 2, 5, 5)]
    assert shapes(infer("ReduceMean", [T((2, 3, 4))], axes=(-1,), keepdims=1)) == [(2, 3, 1)]
    assert shapes(infer("ReduceSum", [T((2, 3, 4))], axes=(0, 2), keepdims=0)) == [(3,)]
    assert shapes(infer("MaxPool", [T((1, 64, 112, 112))], kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))) \
        == [(1, 64, 56, 56)]
    assert shapes(infer("MaxPool", [T((1, 96, 55, 55))], kernel_shape=(3, 3), strides=(2, 2), ceil_mode=1)) \
        == [(1, 96, 27, 27)]
    assert shapes(infer("GlobalAveragePool", [T((1, 2048, 7, 7))])) == [(1, 2048, 1, 1)]
    assert shapes(infer("LayerNormalization", [T((1, 64, 1024)), T((1024,)), T((1024,))], axis=-1)) == [(1, 64, 1024)]
    with pytest.raises(ShapeInferenceError, match="split sizes"):
        infer("Split", [T((6, 4))], n_out=2, axis=0, split=(2, 3))
    with pytest.raises(ShapeInferenceError, match="reshape"):
        infer("Reshape", [T((2, 3)), T((1,), "int64")], [None, i64([4])])
    with pytest.raises(ShapeInferenceError, match="must be a constant"):
        infer("Reshape", [T((2, 3)), T((1,), "int64")], [None, None])


def mlp_graph(names: tuple[str, ...] = ("x", "w1", "w2", "h", "r", "y"), reverse: bool = False) -> Graph:
    x, w1, w2, h, r, y = names
    rng = np.random.default_rng(0)
    nodes = [Node("mm1", "MatMul", (x, w1), (h,)), Node("relu", "Relu", (h,), (r,)),
             Node("mm2", "MatMul", (r, w2), (y,))]
    if reverse:
        nodes = nodes[::-1]
    types = {x: T((4, 8)), w1: T((8, 16)), h: T((4, 16)), r: T((4, 16)), w2: T((16, 2)), y: T((4, 2))}
    weights = {w1: rng.standard_normal((8, 16)).astype(np.float32), w2: rng.standard_normal((16, 2)).astype(np.float32)}
    return Graph(nodes, [x], [y], types, weights).validate()


def test_flops_and_bytes():
    g = mlp_graph()
    assert node_flops(g.nodes["mm1"], g) == 2 * 4 * 8 * 16
    assert graph_flops(g) == 2 * 4 * 8 * 16 + 4 * 16 + 2 * 4 * 16 * 2
    assert node_bytes(g.nodes["relu"], g) == 2 * 4 * 16 * 4
    assert op_kind("Reshape") == "view" and op_kind("FooBar") == "opaque"


def test_topological_order_and_weights_read_only():
    g = mlp_graph(reverse=True)
    assert [n.name for n in g.topological_order] == ["mm1", "relu", "mm2"]
    with pytest.raises(ValueError):
        g.initializers["w1"][0, 0] = 1.0


def test_hash_ignores_names_and_order_but_not_structure():
    a = mlp_graph()
    b = mlp_graph(("in", "wa", "wb", "t1", "t2", "out"), reverse=True)
    assert a.canonical_hash == b.canonical_hash
    c = a.replace(remove=["relu"], add=[Node("sig", "Sigmoid", ("h",), ("r",))])
    assert c.canonical_hash != a.canonical_hash
    # Different weight values are different graphs.
    w = {"w1": np.ones((8, 16), np.float32)}
    d = Graph(a.nodes.values(), a.inputs, a.outputs, a.types, {**a.initializers, **w})
    assert d.canonical_hash != a.canonical_hash


def test_incremental_hash_matches_full_rehash():
    g = mlp_graph()
    _ = g.canonical_hash
    # Fuse Relu into the first MatMul, then rename downstream uses.
    fused = Node("mm1f", "MatMul", ("x", "w1"), ("hf",), {"activation": "Relu"})
    child = g.replace(remove=["mm1", "relu"], add=[fused], rename={"r": "hf"},
                      new_types={"hf": T((4, 16))})
    child.validate()
    fresh = Graph(child.nodes.values(), child.inputs, child.outputs, child.types, child.initializers)
    assert child.canonical_hash == fresh.canonical_hash
    assert child.value_hashes["y"] == fresh.value_hashes["y"]
    assert child.output_names == ("y",) and child.outputs == ("y",)
    # A grandchild hashes from its child; replacing back gives the original hash.
    back = child.replace(remove=["mm1f"],
                         add=[Node("a", "MatMul", ("x", "w1"), ("h2",)), Node("b", "Relu", ("h2",), ("r2",))],
                         rename={"hf": "r2"}, new_types={"h2": T((4, 16)), "r2": T((4, 16))})
    assert back.canonical_hash == g.canonical_hash


def test_replace_drops_unused_weights_and_keeps_output_names():
    g = mlp_graph()
    child = g.replace(remove=["mm2"], add=[Node("id", "Identity", ("r",), ("y2",))], rename={"y": "y2"},
                      new_types={"y2": T((4, 16))})
    assert "w2" not in child.initializers and "w2" not in child.types
    assert child.outputs == ("y2",) and child.output_names == ("y",)
    assert g.nodes["mm2"] is not None and "w2" in g.initializers  # the parent is untouched


def test_validation_errors():
    g = mlp_graph()
    cyc = Graph([Node("a", "Relu", ("b",), ("a",)), Node("b", "Relu", ("a",), ("b",))], [], ["a"],
                {"a": T((2,)), "b": T((2,))})
    with pytest.raises(InvalidGraphError, match="cycle"):
        cyc.validate()
    with pytest.raises(InvalidGraphError, match="nothing defines"):
        Graph([Node("r", "Relu", ("ghost",), ("y",))], [], ["y"], {"y": T((2,))}).validate()
    wrong = dict(g.types)
    wrong["h"] = T((4, 17))
    with pytest.raises(InvalidGraphError, match="typed"):
        Graph(g.nodes.values(), g.inputs, g.outputs, wrong, g.initializers).validate()
    with pytest.raises(InvalidGraphError, match="used twice"):
        Graph([Node("r", "Relu", ("x",), ("y",)), Node("r", "Relu", ("x",), ("z",))], ["x"], ["y"], {})
    cyc2 = g.replace(remove=["mm1"], add=[Node("mm1", "MatMul", ("y", "w1"), ("h",))])
    with pytest.raises(InvalidGraphError, match="cycle"):
        _ = cyc2.canonical_hash


def test_opaque_node_keeps_recorded_types():
    g = Graph([Node("t", "TopK", ("x", "k"), ("v", "i"), {"axis": -1})], ["x"], ["v", "i"],
              {"x": T((3, 10)), "k": T((1,), "int64"), "v": T((3, 2)), "i": T((3, 2), "int64")},
              {"k": np.array([2], np.int64)})
    g.validate()
    assert graph_flops(g) == 0
