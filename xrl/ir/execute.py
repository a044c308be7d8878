"""A numpy reference executor: runs a Graph in float64 with ONNX semantics, for checking rewrites.

Correctness first, then reasonable speed: convolutions and pools use strided window views (an
im2col without the copy) and one einsum, so a tiny CNN runs in milliseconds. Every op in
`xrl.ir.ops.OPS` is implemented; an opaque op raises `ExecutionError`.

Floating-point tensors (inputs and weights) are cast to `dtype` (float64 by default, so that two
graphs that compute the same function agree to ~1e-12); integer and bool tensors keep their type.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from xrl.errors import XrlError
from xrl.ir.graph import Graph, Node
from xrl.ir.ops import FUSABLE_ACTIVATIONS, OPS, is_known, reshape_target, slice_bounds

_ERF: list[Callable[[np.ndarray], np.ndarray]] = []


def _erf(x: np.ndarray) -> np.ndarray:
    """scipy's vectorised erf when scipy is installed (imported on first use: it is slow to import),
    else math.erf element by element (exact too, only slower)."""
    if not _ERF:
        try:
            from scipy.special import erf
        except ImportError:  # pragma: no cover - scipy is optional
            erf = np.vectorize(math.erf, otypes=[np.float64])
        _ERF.append(erf)
    return _ERF[0](x)


class ExecutionError(XrlError):
    """The reference executor cannot run a node (an opaque op or an unsupported attribute)."""


Arrays = list[np.ndarray]
Kernel = Callable[[Node, Arrays, np.dtype], Arrays]
KERNELS: dict[str, Kernel] = {}


def kernel(*ops: str) -> Callable[[Kernel], Kernel]:
    def register(fn: Kernel) -> Kernel:
        for op in ops:
            KERNELS[op] = fn
        return fn

    return register


def execute(graph: Graph, feeds: Mapping[str, np.ndarray], *, dtype: type | np.dtype = np.float64) -> list[np.ndarray]:
    """The values of `graph.outputs` for activation inputs `feeds` (name -> array)."""
    dt = np.dtype(dtype)
    env: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        if name not in feeds:
            raise ExecutionError(f"no value fed for graph input {name!r}")
        env[name] = _cast_float(np.asarray(feeds[name]), dt)
    for name, w in graph.initializers.items():
        env[name] = _cast_float(w, dt)
    for node in graph.topological_order:
        outs = run_node(node, [env[v] if v else None for v in node.inputs], dtype=dt)
        for v, a in zip(node.outputs, outs):
            env[v] = a
    return [env[v] for v in graph.outputs]


def run_node(node: Node, inputs: Sequence[np.ndarray | None], *,
             dtype: type | np.dtype = np.float64) -> list[np.ndarray]:
    """One node's outputs from its input arrays (None for an omitted optional input)."""
    dt = np.dtype(dtype)
    fn = KERNELS.get(node.op) if is_known(node.op, node.domain) else None
    if fn is None:
        raise ExecutionError(f"node {node.name!r}: the reference executor cannot run op {node.op!r} "
                             f"(domain {node.domain!r}); it is opaque to xrl")
    outs = fn(node, [None if a is None else _cast_float(np.asarray(a), dt) for a in inputs], dt)
    act = node.attr("activation")
    if act:
        outs = [ACTIVATIONS[act](outs[0], dt)]
    if len(outs) < len(node.outputs):
        raise ExecutionError(f"node {node.name!r} ({node.op}): {len(node.outputs)} outputs are not supported")
    return outs[: len(node.outputs)]


def _cast_float(a: np.ndarray, dt: np.dtype) -> np.ndarray:
    return a.astype(dt) if a.dtype.kind == "f" else a


def _ints(a: np.ndarray | None) -> list[int] | None:
    return None if a is None else [int(v) for v in np.asarray(a).reshape(-1)]


# ----- elementwise -----------------------------------------------------------------------------
def _gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -x))  # stable for large |x|


ACTIVATIONS: dict[str, Callable[[np.ndarray, np.dtype], np.ndarray]] = {
    "Relu": lambda x, dt: np.maximum(x, 0).astype(x.dtype),
    "Sigmoid": lambda x, dt: _sigmoid(x).astype(x.dtype),
    "Tanh": lambda x, dt: np.tanh(x),
    "Gelu": lambda x, dt: _gelu(x).astype(x.dtype),
}
assert set(ACTIVATIONS) == set(FUSABLE_ACTIVATIONS)

_UNARY: dict[str, Callable[[np.ndarray, Node], np.ndarray]] = {
    "Relu": lambda x, n: np.maximum(x, 0).astype(x.dtype),
    "Sigmoid": lambda x, n: _sigmoid(x).astype(x.dtype),
    "Tanh": lambda x, n: np.tanh(x),
    "Gelu": lambda x, n: _gelu(x, n.attr("approximate", "none")).astype(x.dtype),
    "Erf": lambda x, n: _erf(x).astype(x.dtype),
    "Exp": lambda x, n: np.exp(x),
    "Log": lambda x, n: np.log(x),
    "Sqrt": lambda x, n: np.sqrt(x),
    "Reciprocal": lambda x, n: np.reciprocal(x),
    "Neg": lambda x, n: np.negative(x),
    "Abs": lambda x, n: np.abs(x),
    "LeakyRelu": lambda x, n: np.where(x >= 0, x, n.attr("alpha", 0.01) * x).astype(x.dtype),
    "HardSigmoid": lambda x, n: np.clip(n.attr("alpha", 0.2) * x + n.attr("beta", 0.5), 0, 1).astype(x.dtype),
    "Softplus": lambda x, n: np.logaddexp(0.0, x).astype(x.dtype),
}


@kernel(*_UNARY)
def _unary(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    with np.errstate(all="ignore"):  # log(0), 1/0: ONNX gives inf/nan, so do we
        return [_UNARY[node.op](a[0], node)]


_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Max": np.maximum, "Min": np.minimum,
    "Pow": np.power, "Equal": np.equal, "Less": np.less, "Greater": np.greater,
    "And": np.logical_and, "Or": np.logical_or,
}


@kernel(*_BINARY)
def _binary(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    fn = _BINARY[node.op]
    out = a[0]
    for b in a[1:]:  # Max and Min are variadic in ONNX
        out = fn(out, b)
    return [np.asarray(out)]


@kernel("Div")
def _div(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    x, y = a
    if x.dtype.kind in "iu" and y.dtype.kind in "iu":
        return [np.trunc(x / y).astype(x.dtype)]  # ONNX integer Div truncates
    with np.errstate(all="ignore"):
        return [np.asarray(x / y)]


@kernel("Not")
def _not(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    return [np.logical_not(a[0])]


@kernel("IsNaN")
def _isnan(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    return [np.isnan(a[0])]


@kernel("Where")
def _where(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    return [np.where(a[0], a[1], a[2])]


@kernel("Clip")
def _clip(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    x = a[0]
    lo = a[1] if len(a) > 1 and a[1] is not None else node.attr("min")
    hi = a[2] if len(a) > 2 and a[2] is not None else node.attr("max")
    if lo is not None:
        x = np.maximum(x, lo)
    if hi is not None:
        x = np.minimum(x, hi)
    return [np.asarray(x).astype(a[0].dtype)]


@kernel("Cast")
def _cast(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    to = np.dtype(node.attr("to"))
    return [a[0].astype(dt if to.kind == "f" else to)]  # float targets keep the reference precision


@kernel("Identity")
def _identity(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    return [a[0]]


@kernel("Dropout")
def _dropout(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    return [a[0], np.ones(a[0].shape, bool)]  # inference mode: the identity, mask all kept


@kernel("Constant")
def _constant(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    return [_cast_float(np.asarray(node.attr("value")), dt)]


# ----- compute ---------------------------------------------------------------------------------
def _window_params(node: Node, spatial: Sequence[int], kernel_shape: Sequence[int]) -> tuple[list, list, list]:
    """(strides, dilations, pads as (begin, end) per axis), resolving auto_pad as ONNX does."""
    k = len(kernel_shape)
    strides = list(node.attr("strides", (1,) * k))
    dil = list(node.attr("dilations", (1,) * k))
    pads = list(node.attr("pads", (0,) * (2 * k)))
    auto_pad = node.attr("auto_pad", "NOTSET")
    pairs = [(pads[i], pads[i + k]) for i in range(k)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pairs = []
        for i in range(k):
            out = -(-spatial[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel_shape[i] - 1) * dil[i] + 1 - spatial[i])
            small, big = total // 2, total - total // 2
            pairs.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
    elif auto_pad == "VALID":
        pairs = [(0, 0)] * k
    return strides, dil, pairs


def _windows(x: np.ndarray, kernel_shape: Sequence[int], strides: Sequence[int], dil: Sequence[int]) -> np.ndarray:
    """(N, C, *spatial) -> (N, C, *out, *kernel): every window, dilated and strided, as a view."""
    k = len(kernel_shape)
    eff = [(kernel_shape[i] - 1) * dil[i] + 1 for i in range(k)]
    win = sliding_window_view(x, eff, axis=tuple(range(2, 2 + k)))
    idx = (slice(None), slice(None), *(slice(None, None, s) for s in strides), *(slice(None, None, d) for d in dil))
    return win[idx]


@kernel("Conv")
def _conv(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    x, w = a[0], a[1]
    b = a[2] if len(a) > 2 else None
    k = w.ndim - 2
    strides, dil, pairs = _window_params(node, x.shape[2:], w.shape[2:])
    xp = np.pad(x, [(0, 0), (0, 0), *pairs])
    win = _windows(xp, w.shape[2:], strides, dil)  # (N, C, *out, *k)
    n, c = x.shape[:2]
    g = node.attr("group", 1)
    out_sp = win.shape[2:2 + k]
    win = win.reshape(n, g, c // g, *out_sp, *w.shape[2:])
    wg = w.reshape(g, w.shape[0] // g, c // g, *w.shape[2:])
    sp, ks = "hijd"[:k], "pqrs"[:k]
    y = np.einsum(f"ngc{sp}{ks},goc{ks}->ngo{sp}", win, wg, optimize=True)
    y = y.reshape(n, w.shape[0], *out_sp)
    if b is not None:
        y = y + b.reshape(-1, *([1] * k))
    return [y]


@kernel("MatMul")
def _matmul(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    return [np.matmul(a[0], a[1])]


@kernel("Gemm")
def _gemm(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    x = a[0].T if node.attr("transA", 0) else a[0]
    w = a[1].T if node.attr("transB", 0) else a[1]
    y = node.attr("alpha", 1.0) * (x @ w)
    if len(a) > 2 and a[2] is not None:
        y = y + node.attr("beta", 1.0) * a[2]
    return [y]


# ----- normalisation, softmax, pooling, reductions ----------------------------------------------
def _stable_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x) / sum(exp(x)) along `axis`, shifted by the maximum (the attention kernels' too)."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@kernel("Softmax")
def _softmax(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    return [_stable_softmax(a[0], node.attr("axis", -1))]


@kernel("LayerNormalization")
def _layernorm(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    x = a[0]
    axis = node.attr("axis", -1) % x.ndim
    axes = tuple(range(axis, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + node.attr("epsilon", 1e-5))
    y = (x - mean) * inv_std * a[1]
    if len(a) > 2 and a[2] is not None:
        y = y + a[2]
    return [y, mean, inv_std]


def _rms(x: np.ndarray, axis: int, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """x / sqrt(mean(x^2) + eps) over the axes from `axis`, and that 1 / sqrt(...)."""
    axes = tuple(range(axis % x.ndim, x.ndim))
    inv = 1.0 / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps)
    return x * inv, inv


@kernel("SimplifiedLayerNormalization")
def _simplified_layernorm(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    y, inv = _rms(a[0], node.attr("axis", -1), node.attr("epsilon", 1e-5))
    return [y * a[1], inv]


@kernel("SkipSimplifiedLayerNormalization")
def _skip_simplified_layernorm(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    total = a[0] + a[1]
    if len(a) > 3 and a[3] is not None:
        total = total + a[3]
    y, inv = _rms(total, -1, node.attr("epsilon", 1e-12))
    return [y * a[2], np.zeros_like(inv), inv, total]  # onnxruntime writes no mean for an RMSNorm: zeros


@kernel("RotaryEmbedding")
def _rotary(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    x, pos, cos, sin = a
    b, _, s, d = x.shape
    positions = pos.reshape(1, 1) + np.arange(s) if pos.size == 1 else pos  # (1 or batch, sequence)
    c = cos[positions][:, None]  # (batch, 1, sequence, head size / 2)
    n = sin[positions][:, None]
    if node.attr("interleaved", 0):
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return [np.stack([x1 * c - x2 * n, x2 * c + x1 * n], axis=-1).reshape(x.shape)]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return [np.concatenate([x1 * c - x2 * n, x2 * c + x1 * n], axis=-1)]


@kernel("MultiHeadAttention")
def _mha(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    q, k, v = a[:3]
    if len(a) > 3 and a[3] is not None:
        hq = q.shape[2]
        q, k, v = q + a[3][:hq], k + a[3][hq: 2 * hq], v + a[3][2 * hq:]
    heads = node.attr("num_heads")
    split = lambda x: x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(0, 2, 1, 3)  # noqa: E731
    scale = node.attr("scale", 0.0) or 1.0 / np.sqrt(q.shape[2] // heads)
    scores = split(q) @ split(k).transpose(0, 1, 3, 2) * np.asarray(scale, dtype=q.dtype)
    if len(a) > 5 and a[5] is not None:
        scores = scores + a[5]
    if len(a) > 4 and a[4] is not None:  # onnxruntime adds mask_filter_value where the mask is 0
        scores = scores + np.where(a[4][:, None, None, :] == 0, node.attr("mask_filter_value", -10000.0), 0.0)
    if node.attr("unidirectional", 0):
        scores = np.where(np.triu(np.ones(scores.shape[-2:], dtype=bool), 1), -np.inf, scores)
    out = _stable_softmax(scores) @ split(v)
    return [out.transpose(0, 2, 1, 3).reshape(q.shape[0], q.shape[1], -1)]


@kernel("GroupQueryAttention")
def _gqa(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    q, k, v = a[:3]
    heads, kv_heads = node.attr("num_heads"), node.attr("kv_num_heads")
    b, s = q.shape[:2]
    size = q.shape[2] // heads
    split = lambda x, n: x.reshape(b, s, n, size).transpose(0, 2, 1, 3)  # noqa: E731
    kh, vh = split(k, kv_heads), split(v, kv_heads)
    group = heads // kv_heads  # query head h reads key/value head h // group
    scale = node.attr("scale", 0.0) or 1.0 / np.sqrt(size)
    scores = split(q, heads) @ np.repeat(kh, group, axis=1).transpose(0, 1, 3, 2) * np.asarray(scale, dtype=q.dtype)
    scores = np.where(np.triu(np.ones((s, s), dtype=bool), 1), -np.inf, scores)
    out = _stable_softmax(scores) @ np.repeat(vh, group, axis=1)
    return [out.transpose(0, 2, 1, 3).reshape(b, s, -1), kh, vh][: len(node.outputs)]


@kernel("BatchNormalization")
def _batchnorm(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    x, scale, bias, mean, var = a[:5]
    shape = (-1, *([1] * (x.ndim - 2)))
    inv = scale / np.sqrt(var + node.attr("epsilon", 1e-5))
    return [(x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)]


def _pool_pairs(node: Node, x: np.ndarray, ks: Sequence[int]) -> tuple[list, list, list, list]:
    """strides, dilations, explicit pads and the extra end padding ceil_mode needs, per axis."""
    strides, dil, pairs = _window_params(node, x.shape[2:], ks)
    extra = []
    for i, k in enumerate(ks):
        eff = (k - 1) * dil[i] + 1
        span = x.shape[2 + i] + pairs[i][0] + pairs[i][1] - eff
        out = span // strides[i] + 1
        if node.attr("ceil_mode", 0):
            out = -(-span // strides[i]) + 1
            if (out - 1) * strides[i] >= x.shape[2 + i] + pairs[i][0]:
                out -= 1  # the last window must start inside the input or its left padding
        extra.append(max(0, (out - 1) * strides[i] + eff - (x.shape[2 + i] + pairs[i][0] + pairs[i][1])))
    return strides, dil, pairs, extra


@kernel("MaxPool")
def _maxpool(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    if len(node.outputs) > 1:
        raise ExecutionError(f"node {node.name!r}: MaxPool's indices output is not supported")
    x = a[0]
    ks = node.attr("kernel_shape")
    strides, dil, pairs, extra = _pool_pairs(node, x, ks)
    fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    xp = np.pad(x, [(0, 0), (0, 0), *((p0, p1 + e) for (p0, p1), e in zip(pairs, extra))], constant_values=fill)
    win = _windows(xp, ks, strides, dil)
    k = len(ks)
    return [win.max(axis=tuple(range(-k, 0)))]


@kernel("AveragePool")
def _avgpool(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    x = a[0]
    ks = node.attr("kernel_shape")
    strides, dil, pairs, extra = _pool_pairs(node, x, ks)
    k = len(ks)
    full = [(0, 0), (0, 0), *((p0, p1 + e) for (p0, p1), e in zip(pairs, extra))]
    sums = _windows(np.pad(x, full), ks, strides, dil).sum(axis=tuple(range(-k, 0)))
    # The divisor counts the window's cells inside the input, or (count_include_pad) inside the input and
    # its explicit pads; the extra end padding of ceil_mode never counts.
    inside = np.ones((1, 1, *x.shape[2:]), x.dtype)
    if node.attr("count_include_pad", 0):
        inside = np.pad(inside, [(0, 0), (0, 0), *pairs], constant_values=1)
        inside = np.pad(inside, [(0, 0), (0, 0), *((0, e) for e in extra)])
    else:
        inside = np.pad(inside, full)
    counts = _windows(inside, ks, strides, dil).sum(axis=tuple(range(-k, 0)))
    return [sums / counts]


@kernel("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    axes = tuple(range(2, a[0].ndim))
    fn = np.mean if node.op == "GlobalAveragePool" else np.max
    return [fn(a[0], axis=axes, keepdims=True)]


_REDUCE = {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min,
           "ReduceProd": lambda x, **kw: np.prod(x, dtype=x.dtype, **kw)}  # ints keep their width, as in ONNX


@kernel(*_REDUCE)
def _reduce(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    x = a[0]
    axes = node.attr("axes")
    if axes is None:
        axes = _ints(a[1]) if len(a) > 1 else None
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return [x]
        axes = range(x.ndim)
    axes = tuple(sorted({ax % x.ndim for ax in axes}))
    return [np.asarray(_REDUCE[node.op](x, axis=axes, keepdims=bool(node.attr("keepdims", 1))))]


# ----- data movement ---------------------------------------------------------------------------
@kernel("Concat")
def _concat(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    return [np.concatenate(a, axis=node.attr("axis"))]


@kernel("Split")
def _split(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    x = a[0]
    axis = node.attr("axis", 0) % x.ndim
    sizes = node.attr("split")
    if sizes is None and len(a) > 1 and a[1] is not None:
        sizes = _ints(a[1])
    n = len(node.outputs)
    if sizes is None:
        chunk = -(-x.shape[axis] // n)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(n)]
    bounds = np.cumsum([0, *sizes])
    return [np.take(x, np.arange(bounds[i], bounds[i + 1]), axis=axis) for i in range(n)]


@kernel("Slice")
def _slice(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    x = a[0]
    get = lambda i: _ints(a[i]) if len(a) > i else None
    idx = [slice(None)] * x.ndim
    for ax, start, stop, step in slice_bounds(node, x.shape, get(1), get(2), get(3), get(4)):
        idx[ax] = slice(start, stop if stop >= 0 else None, step)
    return [x[tuple(idx)]]


@kernel("Reshape")
def _reshape(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    return [a[0].reshape(reshape_target(node, a[0].shape, _ints(a[1])))]


@kernel("Flatten")
def _flatten(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    x = a[0]
    axis = node.attr("axis", 1) % (x.ndim + 1) if x.ndim else 0
    return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]


@kernel("Squeeze")
def _squeeze(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    x = a[0]
    axes = node.attr("axes")
    if axes is None and len(a) > 1:
        axes = _ints(a[1])
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    return [np.squeeze(x, axis=tuple(ax % x.ndim for ax in axes))]


@kernel("Unsqueeze")
def _unsqueeze(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    x = a[0]
    axes = node.attr("axes")
    if axes is None:
        axes = _ints(a[1])
    rank = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(sorted(ax % rank for ax in axes)))]


@kernel("Transpose")
def _transpose(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    perm = node.attr("perm")
    return [np.transpose(a[0], perm if perm is not None else None)]


@kernel("Pad")
def _pad(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    x = a[0]
    pads = node.attr("pads") or _ints(a[1])
    value = a[2].reshape(()).item() if len(a) > 2 and a[2] is not None and a[2].size else 0
    axes = [ax % x.ndim for ax in _ints(a[3])] if len(a) > 3 and a[3] is not None else list(range(x.ndim))
    k = len(axes)
    width = [(0, 0)] * x.ndim
    for i, ax in enumerate(axes):
        width[ax] = (pads[i], pads[i + k])
    # Negative pads crop: pad by the positive part, then slice the negative part away.
    pos = [(max(0, lo), max(0, hi)) for lo, hi in width]
    crop = tuple(slice(max(0, -lo), x.shape[i] + p0 + p1 - max(0, -hi))
                 for i, ((lo, hi), (p0, p1)) in enumerate(zip(width, pos)))
    mode = node.attr("mode", "constant")
    if mode == "constant":
        y = np.pad(x, pos, mode="constant", constant_values=value)
    elif mode in ("reflect", "edge", "wrap"):
        y = np.pad(x, pos, mode=mode)
    else:
        raise ExecutionError(f"node {node.name!r}: Pad mode {mode!r} is not supported")
    return [y[crop]]


@kernel("Expand")
def _expand(node: Node, a: Arrays, dt: np.dtype) -> Arrays:
    shape = np.broadcast_shapes(a[0].shape, tuple(_ints(a[1])))
    return [np.array(np.broadcast_to(a[0], shape))]


_missing = sorted(set(OPS) - set(KERNELS))
assert not _missing, f"ops without a reference kernel: {_missing}"
