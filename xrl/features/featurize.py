"""Graph -> `torch_geometric.data.Data`: typed node, edge and graph-level feature tensors.

Nodes (rows of `x`), in this order: one per graph input (op "Input"), one per weight (op "Weight"),
then every operator in `graph.topological_order`. Source nodes give every edge a producer (the
TASO / X-RLflow convention).

    x          [N, NODE_DIM]   op one-hot (OP_VOCAB) | op-kind one-hot (KIND_VOCAB) | kernel h, w |
                               stride h, w | dilation h, w | padding h, w | log2 groups | axis |
                               fused-activation one-hot | log FLOPs | log bytes | is-graph-output
    edge_index [2, E]          producer row -> consumer row, one per (value, consumer input slot) use
    edge_attr  [E, EDGE_DIM]   shape (right-aligned in 6 dims, log) | rank | log numel |
                               dtype one-hot (DTYPE_VOCAB) | is-weight | consumer input slot
    u          [1, GLOBAL_DIM] log total FLOPs | log total bytes | log node count | log edge count

Every feature is scaled into roughly [0, 1] (logs divided by the log of a large reference value),
so no feature dominates a GNN's first layer. Spatial attributes use the last two spatial dims: a
1-d kernel k reads as (1, k). `axis` is (non-negative axis + 1) / 6 (ONNX defaults filled in), 0 for
ops without one.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:  # imported where used: release-mode policies featurise without torch_geometric
    from torch_geometric.data import Data

from xrl.errors import InvalidGraphError
from xrl.ir import Graph, Node, TensorType
from xrl.ir.ops import FUSABLE_ACTIVATIONS, node_bytes, node_flops, op_kind

# Frozen on purpose: a trained policy's input layout must not move when an op is registered.
# Ops registered after it was frozen are in OPS_AFTER_VOCAB and featurize as "other" (their kind
# one-hot still tells a reduction from an elementwise op); moving them into OP_VOCAB changes
# NODE_DIM, so every shipped and trained policy must then be retrained. tests/test_features.py
# checks that the two together are exactly xrl.ir.ops.OPS.
OP_VOCAB: tuple[str, ...] = (
    "Abs", "Add", "AveragePool", "BatchNormalization", "Cast", "Clip", "Concat", "Constant", "Conv", "Div",
    "Dropout", "Equal", "Erf", "Exp", "Expand", "Flatten", "Gelu", "Gemm", "GlobalAveragePool", "GlobalMaxPool",
    "Greater", "HardSigmoid", "Identity", "LayerNormalization", "LeakyRelu", "Less", "Log", "MatMul", "Max",
    "MaxPool", "Min", "Mul", "Neg", "Pad", "Pow", "Reciprocal", "ReduceMax", "ReduceMean", "ReduceMin",
    "ReduceSum", "Relu", "Reshape", "Sigmoid", "Slice", "Softmax", "Softplus", "Split", "Sqrt", "Squeeze", "Sub",
    "Tanh", "Transpose", "Unsqueeze", "Where",
    "Input", "Weight", "other",
)
OPS_AFTER_VOCAB: tuple[str, ...] = ("And", "Not", "Or", "ReduceProd", "SimplifiedLayerNormalization",
                                     "SkipSimplifiedLayerNormalization", "RotaryEmbedding",
                                     "MultiHeadAttention", "IsNaN", "GroupQueryAttention")
KIND_VOCAB: tuple[str, ...] = ("compute", "elementwise", "reduction", "memory", "view", "opaque")
DTYPE_VOCAB: tuple[str, ...] = (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
)
MAX_RANK = 6
MAX_SLOT = 7  # input slots beyond this (long Concats) share the last value

_OP_INDEX = {op: i for i, op in enumerate(OP_VOCAB)}
_OTHER = _OP_INDEX["other"]
_KIND_INDEX = {k: i for i, k in enumerate(KIND_VOCAB)}
_DTYPE_INDEX = {d: i for i, d in enumerate(DTYPE_VOCAB)}
_ACT_INDEX = {a: i for i, a in enumerate(FUSABLE_ACTIVATIONS)}

# Reference magnitudes: log1p(x) / log1p(ref) is ~1 at ref.
_FLOPS_REF, _BYTES_REF = 1e12, 1e10  # per node: a huge conv, a 10 GB tensor
_DIM_REF, _NUMEL_REF = 4096.0, 1e9
_TOTAL_FLOPS_REF, _TOTAL_BYTES_REF, _COUNT_REF = 1e13, 1e11, 1e4

N_ATTR = 10  # kernel h, w, stride h, w, dilation h, w, padding h, w, log2 groups, axis
_OP_OFF = 0
_KIND_OFF = _OP_OFF + len(OP_VOCAB)
_ATTR_OFF = _KIND_OFF + len(KIND_VOCAB)
_ACT_OFF = _ATTR_OFF + N_ATTR
_COST_OFF = _ACT_OFF + len(FUSABLE_ACTIVATIONS)  # log FLOPs, log bytes
_OUT_FLAG = _COST_OFF + 2
NODE_DIM = _OUT_FLAG + 1

_TYPE_DIM = MAX_RANK + 2 + len(DTYPE_VOCAB)  # shape, rank, numel, dtype
EDGE_DIM = _TYPE_DIM + 2  # + is-weight, slot
GLOBAL_DIM = 4

_NO_ATTRS = (0.0,) * N_ATTR
# ONNX defaults of an omitted `axis`, so that spelling the default out changes no feature.
_AXIS_DEFAULTS = {"Softmax": -1, "LayerNormalization": -1, "Flatten": 1, "Split": 0}


def _log_scale(x: float, ref: float) -> float:
    return math.log1p(x) / math.log1p(ref)


def _last2(values: tuple | list | None, default: int) -> tuple[int, int]:
    """The last two spatial entries of a per-dim attribute, a 1-d one read as (default, v)."""
    if not values:
        return default, default
    if len(values) == 1:
        return default, int(values[0])
    return int(values[-2]), int(values[-1])


def _attr_features(node: Node, graph: Graph) -> tuple[float, ...]:
    """Normalised kernel, stride, dilation, padding, groups and axis of one operator."""
    attrs = node.attrs
    if not attrs and node.op not in ("Conv", *_AXIS_DEFAULTS):
        return _NO_ATTRS
    kernel = attrs.get("kernel_shape")
    if kernel is None and node.op == "Conv" and len(node.inputs) > 1:
        kernel = graph.type_of(node.inputs[1]).shape[2:]  # ONNX Conv may leave kernel_shape to the weight
    kh, kw = _last2(kernel, 1)
    sh, sw = _last2(attrs.get("strides"), 1)
    dh, dw = _last2(attrs.get("dilations"), 1)
    pads = attrs.get("pads")
    ph = pw = 0
    if pads and len(pads) % 2 == 0:
        half = len(pads) // 2
        totals = [int(pads[i]) + int(pads[i + half]) for i in range(half)]
        ph, pw = _last2(totals, 0)
    groups = int(attrs.get("group", 1))
    axis_feature = 0.0
    axis = attrs.get("axis", _AXIS_DEFAULTS.get(node.op))
    if isinstance(axis, int) and node.inputs and node.inputs[0]:
        a = axis + graph.type_of(node.inputs[0]).rank if axis < 0 else axis  # Flatten's axis may equal the rank
        axis_feature = (min(max(a, 0), MAX_RANK - 1) + 1) / MAX_RANK
    return (math.log2(max(kh, 1)) / 4, math.log2(max(kw, 1)) / 4, math.log2(max(sh, 1)) / 2,
            math.log2(max(sw, 1)) / 2, math.log2(max(dh, 1)) / 3, math.log2(max(dw, 1)) / 3,
            _log_scale(ph, 15), _log_scale(pw, 15), math.log2(max(groups, 1)) / 10, axis_feature)


def _op_row(node: Node, graph: Graph) -> tuple[int, int, int, tuple[float, ...], int, int]:
    """(op index, kind index, activation index or -1, attribute features, FLOPs, bytes) of one operator."""
    known = node.domain in ("", "ai.onnx")
    op = _OP_INDEX.get(node.op, _OTHER) if known else _OTHER
    if op >= _OP_INDEX["Input"]:  # "Input"/"Weight" are reserved for source nodes
        op = _OTHER
    kind = _KIND_INDEX[op_kind(node.op) if known else "opaque"]
    act = _ACT_INDEX.get(node.attrs.get("activation"), -1)
    return op, kind, act, _attr_features(node, graph), node_flops(node, graph), node_bytes(node, graph)


# Rows of operators seen before, by node identity. Candidates share almost every Node with their
# parent graph, so most rows are found here. A row depends only on the node and the types around
# it; the entry keeps those types (checked on every hit) and the node itself, so an id is never
# reused while its entry lives. Cleared when full rather than evicted piecemeal: simple and bounded.
_ROW_CACHE: dict[int, tuple[Node, tuple[TensorType, ...], tuple]] = {}
_ROW_CACHE_SIZE = 1 << 16


def _cached_op_row(node: Node, graph: Graph) -> tuple:
    types = graph.types
    around = tuple(types[v] for v in node.inputs if v) + tuple(types[v] for v in node.outputs)
    hit = _ROW_CACHE.get(id(node))
    if hit is not None and hit[0] is node and hit[1] == around:
        return hit[2]
    row = _op_row(node, graph)
    if len(_ROW_CACHE) >= _ROW_CACHE_SIZE:
        _ROW_CACHE.clear()
    _ROW_CACHE[id(node)] = (node, around, row)
    return row


def _type_features(t: TensorType) -> list[float]:
    shape = list(t.shape)
    if len(shape) > MAX_RANK:  # fold leading dims so the trailing ones keep their slots
        shape = [math.prod(shape[: len(shape) - MAX_RANK + 1]), *shape[len(shape) - MAX_RANK + 1:]]
    row = [0.0] * _TYPE_DIM
    off = MAX_RANK - len(shape)
    for i, d in enumerate(shape):
        row[off + i] = _log_scale(d, _DIM_REF)
    row[MAX_RANK] = min(t.rank, MAX_RANK) / MAX_RANK
    row[MAX_RANK + 1] = _log_scale(t.numel, _NUMEL_REF)
    row[MAX_RANK + 2 + _DTYPE_INDEX[t.dtype]] = 1.0
    return row


def featurize(graph: Graph) -> Data:
    """The graph's feature tensors (see the module docstring for the layout)."""
    from torch_geometric.data import Data

    x, edge_index, edge_attr, u = feature_arrays(graph)
    return Data(x=torch.from_numpy(x), edge_index=torch.from_numpy(edge_index),
                edge_attr=torch.from_numpy(edge_attr), u=torch.from_numpy(u), num_nodes=x.shape[0])


def feature_arrays(graph: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`featurize` as numpy arrays (x, edge_index, edge_attr, u), for runners without torch_geometric."""
    types = graph.types
    weights = graph.initializers
    order = graph.topological_order
    n_src = len(graph.inputs) + len(weights)
    n = n_src + len(order)

    row_of: dict[str, int] = {v: i for i, v in enumerate(graph.inputs)}
    row_of.update((v, len(graph.inputs) + i) for i, v in enumerate(weights))
    src_bytes = [types[v].nbytes for v in row_of]

    # One pass over the operators: their rows, and their incoming edges.
    op_rows = []
    src: list[int] = []
    dst: list[int] = []
    slots: list[int] = []
    type_ids: list[int] = []
    is_weight: list[bool] = []
    type_index: dict[TensorType, int] = {}
    for k, node in enumerate(order):
        row = n_src + k
        op_rows.append(_cached_op_row(node, graph))
        for s, v in enumerate(node.inputs):
            if not v:
                continue
            try:
                src.append(row_of[v])
            except KeyError:
                raise InvalidGraphError(f"node {node.name!r} ({node.op}) reads {v!r}, which nothing defines") from None
            dst.append(row)
            slots.append(s)
            type_ids.append(type_index.setdefault(types[v], len(type_index)))
            is_weight.append(v in weights)
        for v in node.outputs:
            row_of[v] = row

    x = np.zeros((n, NODE_DIM), dtype=np.float32)
    x[: len(graph.inputs), _OP_INDEX["Input"]] = 1.0
    x[len(graph.inputs): n_src, _OP_INDEX["Weight"]] = 1.0
    x[:n_src, _COST_OFF + 1] = [_log_scale(b, _BYTES_REF) for b in src_bytes]
    total_flops = total_bytes = 0
    if op_rows:
        ops, kinds, acts, attrs, flops, nbytes = zip(*op_rows)
        rows = np.arange(n_src, n)
        x[rows, np.asarray(ops)] = 1.0
        x[rows, _KIND_OFF + np.asarray(kinds)] = 1.0
        x[n_src:, _ATTR_OFF:_ATTR_OFF + N_ATTR] = attrs
        acts_arr = np.asarray(acts)
        fused = acts_arr >= 0
        x[rows[fused], _ACT_OFF + acts_arr[fused]] = 1.0
        flops_arr = np.asarray(flops, dtype=np.float64)
        bytes_arr = np.asarray(nbytes, dtype=np.float64)
        x[n_src:, _COST_OFF] = np.log1p(flops_arr) / math.log1p(_FLOPS_REF)
        x[n_src:, _COST_OFF + 1] = np.log1p(bytes_arr) / math.log1p(_BYTES_REF)
        total_flops, total_bytes = int(sum(flops)), int(sum(nbytes))
    out_rows = [row_of[v] for v in graph.outputs if v in row_of]
    x[out_rows, _OUT_FLAG] = 1.0

    e = len(src)
    edge_attr = np.zeros((e, EDGE_DIM), dtype=np.float32)
    if e:
        distinct = np.array([_type_features(t) for t in type_index], dtype=np.float32)
        edge_attr[:, :_TYPE_DIM] = distinct[np.asarray(type_ids)]
        edge_attr[:, _TYPE_DIM] = is_weight
        edge_attr[:, _TYPE_DIM + 1] = np.minimum(np.asarray(slots), MAX_SLOT) / MAX_SLOT
    edge_index = np.array([src, dst], dtype=np.int64).reshape(2, e)

    u = np.array([[_log_scale(total_flops, _TOTAL_FLOPS_REF), _log_scale(total_bytes, _TOTAL_BYTES_REF),
                   _log_scale(n, _COUNT_REF), _log_scale(e, _COUNT_REF)]], dtype=np.float32)
    return x, edge_index, edge_attr, u
