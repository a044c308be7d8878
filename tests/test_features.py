"""Featurizer: layout, counts, name/order invariance, the frozen vocabularies, batching and speed."""

from __future__ import annotations

import importlib
import random
import time

import numpy as np
import pytest
import torch
from graph_helpers import build
from torch_geometric.data import Batch

from xrl.features import DTYPE_VOCAB, EDGE_DIM, GLOBAL_DIM, KIND_VOCAB, NODE_DIM, OP_VOCAB, featurize
from xrl.ir import Graph, Node, TensorType
from xrl.ir.ops import OPS
from xrl.ir.types import DTYPE_SIZES

# The module itself: `xrl.features.featurize` the attribute is the function.
featurize_module = importlib.import_module("xrl.features.featurize")
OPS_AFTER_VOCAB = featurize_module.OPS_AFTER_VOCAB


def const(shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
    """A weight of this shape that costs no memory (featurizing reads only its type)."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def transformer(layers: int, seq: int = 128, hidden: int = 768, heads: int = 12, prefix: str = "") -> Graph:
    """A BERT-style encoder: 29 ops a layer (QKV projections, attention, FFN, two LayerNorms)."""
    weights = {f"{prefix}split": np.array([1, seq, heads, hidden // heads], np.int64),
               f"{prefix}merge": np.array([1, seq, hidden], np.int64)}
    nodes: list[Node] = []

    def op(kind: str, ins: list[str], **attrs: object) -> str:
        name = f"{prefix}n{len(nodes)}"
        nodes.append(Node(name, kind, tuple(ins), (f"{name}_out",), attrs))
        return f"{name}_out"

    def w(name: str, shape: tuple[int, ...]) -> str:
        weights[prefix + name] = const(shape)
        return prefix + name

    def linear(x: str, din: int, dout: int, tag: str) -> str:
        return op("Add", [op("MatMul", [x, w(f"{tag}_w", (din, dout))]), w(f"{tag}_b", (dout,))])

    x = prefix + "x"
    for i in range(layers):
        q, k, v = (op("Transpose", [op("Reshape", [linear(x, hidden, hidden, f"l{i}{t}"), prefix + "split"])],
                      perm=(0, 2, 3, 1) if t == "k" else (0, 2, 1, 3)) for t in "qkv")
        s = op("Softmax", [op("Div", [op("MatMul", [q, k]), w(f"l{i}scale", ())])], axis=-1)
        ctx = op("Reshape", [op("Transpose", [op("MatMul", [s, v])], perm=(0, 2, 1, 3)), prefix + "merge"])
        h = op("Add", [linear(ctx, hidden, hidden, f"l{i}o"), x])
        h = op("LayerNormalization", [h, w(f"l{i}g1", (hidden,)), w(f"l{i}b1", (hidden,))], axis=-1)
        f = linear(op("Gelu", [linear(h, hidden, 4 * hidden, f"l{i}f1")]), 4 * hidden, hidden, f"l{i}f2")
        x = op("LayerNormalization", [op("Add", [f, h]), w(f"l{i}g2", (hidden,)), w(f"l{i}b2", (hidden,))], axis=-1)
    return build({prefix + "x": (1, seq, hidden)}, weights, nodes, [x])


def convnet() -> Graph:
    """Convs with strides, groups, a fused activation and padding; a pool; an opaque op; a Gemm head."""
    weights = {"w1": const((16, 3, 3, 3)), "b1": const((16,)), "w2": const((16, 4, 5, 5)),
               "wf": const((10, 16)), "bf": const((10,))}
    nodes = [
        Node("c1", "Conv", ("img", "w1", "b1"), ("a",),
             {"strides": (2, 2), "pads": (1, 1, 1, 1), "activation": "Relu"}),
        Node("c2", "Conv", ("a", "w2", ""), ("b",), {"group": 4, "pads": (2, 2, 2, 2), "dilations": (1, 1)}),
        Node("odd", "FancyNorm", ("b",), ("c",), domain="com.example"),
        Node("gap", "GlobalAveragePool", ("c",), ("p",)),
        Node("flat", "Flatten", ("p",), ("f",), {"axis": 1}),
        Node("fc", "Gemm", ("f", "wf", "bf"), ("y",), {"transB": 1}),
        Node("sq", "Mul", ("y", "y"), ("z",)),  # one value read twice: two edges
    ]
    return build({"img": (2, 3, 32, 32)}, weights, nodes, ["z"], extra_types={"c": TensorType((2, 16, 16, 16))})


def renamed(g: Graph, seed: int) -> Graph:
    """The same computation with every node and value renamed and nodes stored in another order."""
    names = {v: f"v{i}" for i, v in enumerate(g.types)}
    nodes = [Node(f"node{random.Random(seed).random()}_{i}", n.op, tuple(names.get(v, v) for v in n.inputs),
                  tuple(names[v] for v in n.outputs), n.attrs, n.domain) for i, n in enumerate(g.nodes.values())]
    random.Random(seed).shuffle(nodes)
    return Graph(nodes, [names[v] for v in g.inputs], [names[v] for v in g.outputs],
                 {names[v]: t for v, t in g.types.items()},
                 {names[v]: w for v, w in g.initializers.items()}).validate()


def uses(g: Graph) -> int:
    return sum(1 for n in g.nodes.values() for v in n.inputs if v)


def sorted_rows(t: torch.Tensor) -> np.ndarray:
    a = t.numpy()
    return a[np.lexsort(a.T[::-1])]


@pytest.mark.parametrize("make", [convnet, lambda: transformer(2)], ids=["convnet", "transformer"])
def test_shapes_counts_and_finite(make) -> None:
    g = make()
    d = featurize(g)
    n = len(g.nodes) + len(g.inputs) + len(g.initializers)
    assert d.num_nodes == n and d.x.shape == (n, NODE_DIM) and d.x.dtype == torch.float32
    assert d.edge_index.shape == (2, uses(g)) and d.edge_index.dtype == torch.int64
    assert d.edge_attr.shape == (uses(g), EDGE_DIM) and d.u.shape == (1, GLOBAL_DIM)
    for t in (d.x, d.edge_attr, d.u):
        assert torch.isfinite(t).all()
        assert t.min() >= 0 and t.max() <= 1.5  # scaled near [0, 1]
    assert (d.x[:, : len(OP_VOCAB)].sum(1) == 1).all()  # exactly one op type per node
    assert d.edge_index.max() < n and (d.edge_index[0] != d.edge_index[1]).all()


def test_source_nodes_and_edges_point_from_producer_to_consumer() -> None:
    g = convnet()
    d = featurize(g)
    op_of = [OP_VOCAB[i] for i in d.x[:, : len(OP_VOCAB)].argmax(1).tolist()]
    assert op_of[:1] == ["Input"] and op_of[1:6] == ["Weight"] * 5
    assert op_of[6:] == [n.op if n.op in OP_VOCAB else "other" for n in g.topological_order]
    # The Gemm (row 11) reads the Flatten (row 10) at slot 0 and weights wf, bf (rows 4, 5) at slots 1, 2.
    into_fc = d.edge_index[1] == 11
    assert d.edge_index[0, into_fc].tolist() == [10, 4, 5]
    slot = d.edge_attr[into_fc, -1] * featurize_module.MAX_SLOT
    weight_flag = d.edge_attr[into_fc, -2]
    assert slot.round().tolist() == [0, 1, 2] and weight_flag.tolist() == [0, 1, 1]
    # c2's empty bias slot makes no edge; Mul reading y twice makes two.
    assert (d.edge_index[1] == 7).sum() == 2 and (d.edge_index[1] == 12).sum() == 2


def test_attribute_features_of_a_conv() -> None:
    d = featurize(convnet())
    f = featurize_module
    c1, c2 = d.x[6], d.x[7]
    attrs = c1[f._ATTR_OFF:f._ATTR_OFF + f.N_ATTR]
    expected = [np.log2(3) / 4] * 2 + [0.5, 0.5] + [0.0, 0.0] + [np.log1p(2) / np.log1p(15)] * 2 + [0.0, 0.0]
    assert attrs.tolist() == pytest.approx(expected)
    assert c1[f._KIND_OFF + KIND_VOCAB.index("compute")] == 1
    assert c1[f._ACT_OFF:f._ACT_OFF + 4].tolist() == [1, 0, 0, 0]  # Relu
    assert c2[f._ACT_OFF:f._ACT_OFF + 4].sum() == 0
    assert c2[f._ATTR_OFF + 8] == pytest.approx(np.log2(4) / 10)  # groups
    assert c2[f._ATTR_OFF] == pytest.approx(np.log2(5) / 4)  # kernel from the weight: no kernel_shape attr
    assert d.x[:, f._OUT_FLAG].nonzero().flatten().tolist() == [12]


def test_an_omitted_axis_reads_as_its_onnx_default() -> None:
    def softmax(**attrs: object) -> torch.Tensor:
        return featurize(build({"a": (2, 3, 4)}, {}, [Node("s", "Softmax", ("a",), ("b",), attrs)], ["b"])).x[1]

    axis = featurize_module._ATTR_OFF + 9
    assert torch.equal(softmax(), softmax(axis=-1)) and torch.equal(softmax(axis=2), softmax(axis=-1))
    assert softmax()[axis] == pytest.approx(3 / 6) and softmax(axis=0)[axis] == pytest.approx(1 / 6)


def test_opaque_op_is_other() -> None:
    g = convnet()
    d = featurize(g)
    odd = 6 + [n.name for n in g.topological_order].index("odd")
    assert d.x[odd, OP_VOCAB.index("other")] == 1
    assert d.x[odd, featurize_module._KIND_OFF + KIND_VOCAB.index("opaque")] == 1
    # An op named like a source node is not one.
    g2 = build({"a": (2,)}, {}, [Node("n", "Input", ("a",), ("b",))], ["b"], extra_types={"b": TensorType((2,))})
    assert featurize(g2).x[1, OP_VOCAB.index("other")] == 1


@pytest.mark.parametrize("make", [convnet, lambda: transformer(2)], ids=["convnet", "transformer"])
def test_names_and_node_order_do_not_matter(make) -> None:
    g = make()
    h = renamed(g, seed=3)
    assert g.canonical_hash == h.canonical_hash
    a, b = featurize(g), featurize(h)
    assert torch.equal(a.u, b.u)
    assert np.array_equal(sorted_rows(a.x), sorted_rows(b.x))

    def edges(d) -> torch.Tensor:
        return torch.cat([d.x[d.edge_index[0]], d.x[d.edge_index[1]], d.edge_attr], dim=1)

    assert np.array_equal(sorted_rows(edges(a)), sorted_rows(edges(b)))


def test_row_cache_agrees_with_a_fresh_computation_after_a_rewrite() -> None:
    g = convnet()
    featurize(g)  # fills the cache with g's nodes
    c1 = g.nodes["c1"]
    unfused = [Node("c1", "Conv", c1.inputs, ("a0",), {k: v for k, v in c1.attrs.items() if k != "activation"}),
               Node("r", "Relu", ("a0",), ("a",))]
    h = g.replace(remove=["c1"], add=unfused, new_types={"a0": g.type_of("a")}).validate()
    cached = featurize(h)
    featurize_module._ROW_CACHE.clear()
    fresh = featurize(h)
    for key in ("x", "edge_index", "edge_attr", "u"):
        assert torch.equal(cached[key], fresh[key]), key


def test_vocabularies_are_frozen_and_match_the_ir() -> None:
    # If this fails, an op was added to xrl.ir.ops: add it to OPS_AFTER_VOCAB (it featurizes as
    # "other"), or to OP_VOCAB in sorted place, which changes NODE_DIM: trained checkpoints must then
    # be retrained.
    named = OP_VOCAB[:-3]
    assert OP_VOCAB[-3:] == ("Input", "Weight", "other") and named == tuple(sorted(named))
    assert not set(named) & set(OPS_AFTER_VOCAB)
    assert set(named) | set(OPS_AFTER_VOCAB) == set(OPS)


def test_an_op_newer_than_the_vocabulary_is_other_with_its_kind() -> None:
    g = build({"a": (2, 3)}, {}, [Node("p", "ReduceProd", ("a",), ("o",), {"axes": (1,), "keepdims": 0})], ["o"])
    x = featurize(g).x
    row = x[1]  # the input is node 0
    assert row[OP_VOCAB.index("other")] == 1 and row[: len(OP_VOCAB)].sum() == 1
    assert row[len(OP_VOCAB) + KIND_VOCAB.index("reduction")] == 1
    assert set(DTYPE_VOCAB) == set(DTYPE_SIZES)
    assert NODE_DIM == len(OP_VOCAB) + len(KIND_VOCAB) + featurize_module.N_ATTR + 4 + 2 + 1
    assert EDGE_DIM == 6 + 2 + len(DTYPE_VOCAB) + 2


def test_edge_type_features() -> None:
    g = build({"a": (2, 3)}, {"i": np.array([1, 2], np.int64)},
              [Node("c", "Cast", ("a",), ("b",), {"to": "float16"}), Node("e", "Unsqueeze", ("b", "i"), ("o",))],
              ["o"])
    d = featurize(g)
    by_slot = {int(round(float(r[-1]) * 7)): r for r in d.edge_attr[d.edge_index[1] == 3]}
    shape_part = by_slot[0][:6]
    assert shape_part[:4].tolist() == [0, 0, 0, 0] and shape_part[4] > 0 and shape_part[5] > shape_part[4]
    assert by_slot[0][6] == pytest.approx(2 / 6)  # rank
    assert by_slot[0][8 + DTYPE_VOCAB.index("float16")] == 1
    assert by_slot[1][8 + DTYPE_VOCAB.index("int64")] == 1 and by_slot[1][-2] == 1


def test_batching_several_graphs() -> None:
    graphs = [convnet(), transformer(1), renamed(convnet(), seed=1)]
    datas = [featurize(g) for g in graphs]
    batch = Batch.from_data_list(datas)
    assert batch.num_graphs == 3 and batch.u.shape == (3, GLOBAL_DIM)
    assert batch.x.shape[0] == sum(d.num_nodes for d in datas)
    second = batch.batch == 1
    assert torch.equal(batch.x[second], datas[1].x)
    in_second = batch.batch[batch.edge_index[0]] == 1
    assert torch.equal(batch.edge_index[:, in_second], datas[1].edge_index + datas[0].num_nodes)
    assert torch.equal(batch.get_example(2).edge_attr, datas[2].edge_attr)


def test_featurize_speed_on_a_bert_sized_graph() -> None:
    g = transformer(10)  # 290 operators + 1 input + 182 weights
    assert 280 <= len(g) <= 320

    def best_of(k: int, *, clear: bool) -> float:
        times = []
        for _ in range(k):
            if clear:
                featurize_module._ROW_CACHE.clear()
            t0 = time.perf_counter()
            featurize(g)
            times.append(time.perf_counter() - t0)
        return min(times)

    cold = best_of(5, clear=True)
    warm = best_of(10, clear=False)
    print(f"\nfeaturize {len(g)} ops / {featurize(g).num_nodes} nodes: cold {cold * 1e3:.2f} ms, "
          f"warm (row cache) {warm * 1e3:.2f} ms")
    assert warm < 0.05  # ~1 ms here; the bound only catches a pathological slowdown
