"""The operator set: shape inference and FLOP/byte counts for every op the IR knows.

Ops use ONNX names and ONNX attribute semantics, so ONNX import/export is nearly one-to-one and
the HLO front end maps onto the same vocabulary. One extension: Conv, MatMul and Gemm may carry
`activation` ("Relu", "Sigmoid", "Tanh" or "Gelu"), a fused activation (TASO's conv-relu fusion);
export lowers it to a separate ONNX node. Any other op is *opaque*: it keeps the types its front
end recorded and passes through every stage unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from xrl.errors import ShapeInferenceError
from xrl.ir.types import TensorType

if TYPE_CHECKING:
    from xrl.ir.graph import Graph, Node

Consts = Sequence["np.ndarray | None"]
InferFn = Callable[["Node", list[TensorType], Consts], list[TensorType]]
FlopFn = Callable[["Node", list[TensorType], list[TensorType]], int]

FUSABLE_ACTIVATIONS = ("Relu", "Sigmoid", "Tanh", "Gelu")
Arity = tuple[int, int | None, int | tuple[int, ...] | None]


@dataclass(frozen=True)
class OpSpec:
    """What the IR knows of one op type.

    kind: "compute" (conv/matmul: FLOP-bound), "elementwise", "reduction" (softmax, norms, pools,
    reduces), "memory" (moves data: concat, split, slice, transpose, pad) or "view" (reshape-like:
    no data moves, no kernel runs).
    """

    name: str
    kind: str
    infer: InferFn
    flops: FlopFn
    # Where the op is not standard ONNX: the ONNX domain it is written in ("" for onnxruntime's contrib
    # ops it registers in the default domain) and the runtime that runs it. In the IR every known op has
    # domain "", so rules match and build it like any other; the ONNX front end maps the domain.
    onnx_domain: str = ""
    runtime: str | None = None  # None: every runtime; "onnxruntime": its contrib ops only
    # (fewest inputs, most inputs or None for variadic, outputs: a count, the allowed counts, or None for
    # any number). The rule compiler checks every op a rule names against it.
    arity: Arity = (1, 1, 1)


OPS: dict[str, OpSpec] = {}


def _register(name: str, kind: str, infer: InferFn, flops: FlopFn | None = None, *, onnx_domain: str = "",
              runtime: str | None = None, arity: Arity = (1, 1, 1)) -> None:
    OPS[name] = OpSpec(name, kind, infer, flops or (lambda n, i, o: 0), onnx_domain, runtime, arity)


def is_known(op: str, domain: str = "") -> bool:
    """Whether the IR knows node (op, domain). The importer marks a default-domain op that shares its name
    with a contrib op of another domain (ONNX 23's RotaryEmbedding) "ai.onnx": it stays opaque."""
    spec = OPS.get(op)
    return spec is not None and (domain == "" or (domain == "ai.onnx" and not spec.onnx_domain))


def ir_op(op: str, domain: str) -> bool:
    """Whether an ONNX node (op, domain) is an op of the IR: a standard op, or a contrib op the IR
    knows, in the domain onnxruntime registers it in."""
    spec = OPS.get(op)
    return spec is not None and (domain in ("", "ai.onnx") if not spec.onnx_domain else domain == spec.onnx_domain)


def onnx_domain(op: str) -> str:
    """The ONNX domain an IR op is written in ("" for standard ONNX)."""
    spec = OPS.get(op)
    return spec.onnx_domain if spec else ""


def op_runtime(op: str) -> str | None:
    """The only runtime that runs `op` (None: every runtime does)."""
    spec = OPS.get(op)
    return spec.runtime if spec else None


def op_kind(op: str) -> str:
    spec = OPS.get(op)
    return spec.kind if spec else "opaque"


def _fail(node: Node, msg: str) -> ShapeInferenceError:
    return ShapeInferenceError(f"node {node.name!r} ({node.op}): {msg}")


# ----- helpers ---------------------------------------------------------------------------------
def broadcast_shapes(node: Node, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise _fail(node, f"shapes {', '.join(map(str, shapes))} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _axis(node: Node, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise _fail(node, f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def _const_ints(node: Node, consts: Consts, i: int, what: str) -> list[int] | None:
    if i >= len(consts) or not node.inputs[i]:
        return None
    c = consts[i]
    if c is None:
        raise _fail(node, f"{what} (input {i}) must be a constant; xrl needs static shapes")
    return [int(x) for x in np.asarray(c).reshape(-1)]


def _act_flops(node: Node, out: TensorType) -> int:
    act = node.attr("activation")
    return ELEMENTWISE_COST.get(act, 1) * out.numel if act else 0


# ----- elementwise -----------------------------------------------------------------------------
# FLOPs per output element, counting a transcendental as several (as roofline models do).
ELEMENTWISE_COST = {
    "Add": 1, "Sub": 1, "Mul": 1, "Div": 1, "Max": 1, "Min": 1, "Pow": 4, "Relu": 1, "Neg": 1,
    "Abs": 1, "Sigmoid": 4, "Tanh": 4, "Gelu": 8, "Erf": 4, "Exp": 4, "Log": 4, "Sqrt": 2,
    "Reciprocal": 1, "Cast": 0, "Equal": 1, "Less": 1, "Greater": 1, "Where": 1, "Clip": 2,
    "LeakyRelu": 2, "HardSigmoid": 2, "Softplus": 4, "Identity": 0, "Dropout": 0, "Expand": 0,
    "Not": 1, "And": 1, "Or": 1, "IsNaN": 1,
}
LOGICAL_OPS = ("Not", "And", "Or")  # bool in, bool out (ONNX defines them on bool only)


def _infer_broadcast(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    shape = broadcast_shapes(node, *(t.shape for t in ins))
    dtype = ins[0].dtype if node.op != "Where" else ins[1].dtype
    if node.op in ("Equal", "Less", "Greater"):
        dtype = "bool"
    return [TensorType(shape, dtype)]


def _infer_unary(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    return [ins[0]]


def _infer_isnan(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    if len(ins) != 1 or not ins[0].dtype.startswith(("float", "bfloat")):
        raise _fail(node, f"IsNaN takes one floating-point tensor, got {', '.join(map(str, ins))}")
    return [TensorType(ins[0].shape, "bool")]


def _infer_logical(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    arity = 1 if node.op == "Not" else 2
    if len(ins) != arity:
        raise _fail(node, f"{node.op} takes {arity} input{'s' if arity > 1 else ''}, got {len(ins)}")
    bad = [str(t) for t in ins if t.dtype != "bool"]
    if bad:
        raise _fail(node, f"{node.op} takes bool tensors, got {', '.join(bad)}")
    return [TensorType(broadcast_shapes(node, *(t.shape for t in ins)), "bool")]


def _elementwise_flops(node: Node, ins: list[TensorType], outs: list[TensorType]) -> int:
    return ELEMENTWISE_COST.get(node.op, 1) * outs[0].numel


for _op in ("Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater"):
    _register(_op, "elementwise", _infer_broadcast, _elementwise_flops, arity=(2, 2, 1))
for _op in ("Max", "Min"):  # variadic in ONNX
    _register(_op, "elementwise", _infer_broadcast, _elementwise_flops, arity=(1, None, 1))
_register("Where", "elementwise", _infer_broadcast, _elementwise_flops, arity=(3, 3, 1))
for _op in ("Relu", "Sigmoid", "Tanh", "Gelu", "Erf", "Exp", "Log", "Sqrt", "Reciprocal", "Neg",
            "Abs", "LeakyRelu", "HardSigmoid", "Softplus"):
    _register(_op, "elementwise", _infer_unary, _elementwise_flops)
for _op in LOGICAL_OPS:
    _register(_op, "elementwise", _infer_logical, _elementwise_flops, arity=(1, 1, 1) if _op == "Not" else (2, 2, 1))
# IsNaN: the guard torch's SDPA export puts after a masked softmax (a fully masked row is NaN, then zeroed)
_register("IsNaN", "elementwise", _infer_isnan, _elementwise_flops)


def _infer_clip(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    return [ins[0]]


_register("Clip", "elementwise", _infer_clip, _elementwise_flops, arity=(1, 3, 1))


def _infer_cast(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    to = node.attr("to")
    if not isinstance(to, str):
        raise _fail(node, "Cast needs a 'to' dtype name")
    return [TensorType(ins[0].shape, to)]


_register("Cast", "elementwise", _infer_cast, _elementwise_flops)


def _infer_dropout(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    outs = [ins[0]]
    if len(node.outputs) > 1:
        outs.append(TensorType(ins[0].shape, "bool"))
    return outs


_register("Identity", "view", _infer_unary)
_register("Dropout", "view", _infer_dropout, arity=(1, 3, (1, 2)))  # inference mode: the identity


def _infer_constant(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    value = node.attr("value")
    if not isinstance(value, np.ndarray):
        raise _fail(node, "Constant needs an ndarray 'value'")
    return [TensorType.of(value)]


_register("Constant", "view", _infer_constant, arity=(0, 0, 1))


# ----- compute ---------------------------------------------------------------------------------
def conv_output_hw(node: Node, spatial: Sequence[int], kernel: Sequence[int]) -> list[int]:
    k = len(kernel)
    strides = node.attr("strides", (1,) * k)
    dil = node.attr("dilations", (1,) * k)
    pads = list(node.attr("pads", (0,) * (2 * k)))
    auto_pad = node.attr("auto_pad", "NOTSET")
    out = []
    for i in range(k):
        eff = (kernel[i] - 1) * dil[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(math.ceil(spatial[i] / strides[i]))
        elif auto_pad == "VALID":
            out.append((spatial[i] - eff) // strides[i] + 1)
        else:
            out.append((spatial[i] + pads[i] + pads[i + k] - eff) // strides[i] + 1)
    if any(o <= 0 for o in out):
        raise _fail(node, f"kernel {tuple(kernel)} does not fit input {tuple(spatial)}")
    return out


def _infer_conv(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    x, w = ins[0], ins[1]
    if x.rank < 3 or w.rank != x.rank:
        raise _fail(node, f"input {x} and weight {w} ranks do not fit a convolution")
    group = node.attr("group", 1)
    if x.shape[1] != w.shape[1] * group:
        raise _fail(node, f"input channels {x.shape[1]} != weight in-channels {w.shape[1]} x group {group}")
    if w.shape[0] % group:
        raise _fail(node, f"output channels {w.shape[0]} not divisible by group {group}")
    if len(ins) > 2 and ins[2].shape != (w.shape[0],):
        raise _fail(node, f"bias {ins[2]} does not match {w.shape[0]} output channels")
    ks = node.attr("kernel_shape", w.shape[2:])
    if tuple(ks) != tuple(w.shape[2:]):
        raise _fail(node, f"kernel_shape {tuple(ks)} != weight's {w.shape[2:]}")
    hw = conv_output_hw(node, x.shape[2:], w.shape[2:])
    return [TensorType((x.shape[0], w.shape[0], *hw), x.dtype)]


def _conv_flops(node: Node, ins: list[TensorType], outs: list[TensorType]) -> int:
    w = ins[1]
    per_out = 2 * int(np.prod(w.shape[1:]))
    bias = outs[0].numel if len(ins) > 2 else 0
    return per_out * outs[0].numel + bias + _act_flops(node, outs[0])


_register("Conv", "compute", _infer_conv, _conv_flops, arity=(2, 3, 1))


def matmul_shape(node: Node, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if not a or not b:
        raise _fail(node, "MatMul operands must have rank >= 1")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise _fail(node, f"inner dimensions differ: {a} x {b}")
    batch = broadcast_shapes(node, a2[:-2], b2[:-2])
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _infer_matmul(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    return [TensorType(matmul_shape(node, ins[0].shape, ins[1].shape), ins[0].dtype)]


def _matmul_flops(node: Node, ins: list[TensorType], outs: list[TensorType]) -> int:
    k = ins[0].shape[-1]
    return 2 * k * outs[0].numel + _act_flops(node, outs[0])


_register("MatMul", "compute", _infer_matmul, _matmul_flops, arity=(2, 2, 1))


def _infer_gemm(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    a, b = ins[0].shape, ins[1].shape
    if len(a) != 2 or len(b) != 2:
        raise _fail(node, "Gemm operands must be matrices")
    if node.attr("transA", 0):
        a = a[::-1]
    if node.attr("transB", 0):
        b = b[::-1]
    if a[1] != b[0]:
        raise _fail(node, f"inner dimensions differ: {a} x {b}")
    out = (a[0], b[1])
    if len(ins) > 2 and ins[2] is not None and node.inputs[2]:
        broadcast_shapes(node, out, ins[2].shape)
    return [TensorType(out, ins[0].dtype)]


def _gemm_flops(node: Node, ins: list[TensorType], outs: list[TensorType]) -> int:
    a = ins[0].shape
    k = a[0] if node.attr("transA", 0) else a[1]
    bias = outs[0].numel if len(ins) > 2 else 0
    return 2 * k * outs[0].numel + bias + _act_flops(node, outs[0])


_register("Gemm", "compute", _infer_gemm, _gemm_flops, arity=(2, 3, 1))


# ----- normalisation, softmax, pooling, reductions ----------------------------------------------
def _infer_softmax(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    _axis(node, node.attr("axis", -1), ins[0].rank)
    return [ins[0]]


_register("Softmax", "reduction", _infer_softmax, lambda n, i, o: 5 * o[0].numel)


def _infer_layernorm(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    x = ins[0]
    axis = _axis(node, node.attr("axis", -1), x.rank)
    norm_shape = x.shape[axis:]
    for t in ins[1:]:
        broadcast_shapes(node, norm_shape, t.shape)
    outs = [x]
    stat = TensorType(x.shape[:axis] + (1,) * (x.rank - axis), "float32")
    outs += [stat] * (len(node.outputs) - 1)
    return outs


_register("LayerNormalization", "reduction", _infer_layernorm, lambda n, i, o: 8 * o[0].numel, arity=(2, 3, (1, 2, 3)))


def _infer_batchnorm(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    x = ins[0]
    c = x.shape[1] if x.rank > 1 else 1
    for t in ins[1:5]:
        if t.shape != (c,):
            raise _fail(node, f"BatchNormalization parameter {t} does not match {c} channels")
    if len(node.outputs) > 1:
        raise _fail(node, "only inference-mode BatchNormalization (one output) is supported")
    return [x]


_register("BatchNormalization", "elementwise", _infer_batchnorm, lambda n, i, o: 2 * o[0].numel, arity=(5, 5, 1))


def _infer_pool(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    x = ins[0]
    ks = node.attr("kernel_shape")
    if ks is None or len(ks) != x.rank - 2:
        raise _fail(node, f"kernel_shape {ks} does not fit input {x}")
    hw = conv_output_hw(node, x.shape[2:], ks) if not node.attr("ceil_mode", 0) else _ceil_pool(node, x, ks)
    outs = [TensorType((*x.shape[:2], *hw), x.dtype)]
    if len(node.outputs) > 1:
        outs.append(TensorType(outs[0].shape, "int64"))
    return outs


def _ceil_pool(node: Node, x: TensorType, ks: Sequence[int]) -> list[int]:
    k = len(ks)
    strides = node.attr("strides", (1,) * k)
    pads = node.attr("pads", (0,) * (2 * k))
    dil = node.attr("dilations", (1,) * k)
    out = []
    for i in range(k):
        eff = (ks[i] - 1) * dil[i] + 1
        o = math.ceil((x.shape[2 + i] + pads[i] + pads[i + k] - eff) / strides[i]) + 1
        if (o - 1) * strides[i] >= x.shape[2 + i] + pads[i]:
            o -= 1  # the last window must start inside the input or its left padding
        out.append(o)
    return out


def _pool_flops(node: Node, ins: list[TensorType], outs: list[TensorType]) -> int:
    return int(np.prod(node.attr("kernel_shape"))) * outs[0].numel


_register("MaxPool", "reduction", _infer_pool, _pool_flops, arity=(1, 1, (1, 2)))
_register("AveragePool", "reduction", _infer_pool, _pool_flops)


def _infer_global_pool(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    x = ins[0]
    return [TensorType((*x.shape[:2], *([1] * (x.rank - 2))), x.dtype)]


_register("GlobalAveragePool", "reduction", _infer_global_pool, lambda n, i, o: i[0].numel)
_register("GlobalMaxPool", "reduction", _infer_global_pool, lambda n, i, o: i[0].numel)


def _infer_reduce(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    x = ins[0]
    axes = node.attr("axes")
    if axes is None:
        axes = _const_ints(node, consts, 1, "axes")
    keep = node.attr("keepdims", 1)
    if axes is None or len(axes) == 0:
        if node.attr("noop_with_empty_axes", 0):
            return [x]
        axes = list(range(x.rank))
    axes = sorted({_axis(node, a, x.rank) for a in axes})
    shape = [1 if i in axes else d for i, d in enumerate(x.shape)] if keep else \
        [d for i, d in enumerate(x.shape) if i not in axes]
    return [TensorType(tuple(shape), x.dtype)]


for _op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"):
    _register(_op, "reduction", _infer_reduce, lambda n, i, o: i[0].numel, arity=(1, 2, 1))


# ----- onnxruntime's contrib normalisations (RMSNorm) -----------------------------------------------
# SimplifiedLayerNormalization (RMSNorm: x / sqrt(mean(x^2) + epsilon) * scale over the axes from `axis`)
# is registered by onnxruntime in the default ONNX domain; SkipSimplifiedLayerNormalization (the same of
# input + skip (+ bias), also returning that sum) in com.microsoft. Their statistics outputs are float32
# with the normalised axes kept as 1 (SkipSimplified's `mean` is written as zeros: an RMSNorm has none).
def _stat_type(x: TensorType, axis: int) -> TensorType:
    return TensorType(x.shape[:axis] + (1,) * (x.rank - axis), "float32")


def _infer_simplified_layernorm(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    x = ins[0]
    if len(ins) != 2:
        raise _fail(node, f"takes X and scale, got {len(ins)} inputs")
    axis = _axis(node, node.attr("axis", -1), x.rank)
    if broadcast_shapes(node, x.shape[axis:], ins[1].shape) != x.shape[axis:]:
        raise _fail(node, f"scale {ins[1]} does not fit the normalised shape {x.shape[axis:]}")
    if len(node.outputs) > 2:
        raise _fail(node, f"has {len(node.outputs)} outputs; the op defines Y and inv_std_var")
    return [x, _stat_type(x, axis)][: len(node.outputs)]


def _infer_skip_simplified_layernorm(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    if not 3 <= len(ins) <= 4:
        raise _fail(node, f"takes input, skip, gamma and an optional bias, got {len(ins)} inputs")
    x, skip, gamma = ins[:3]
    hidden = x.shape[-1:] if x.rank else ()
    if x.rank not in (2, 3) or skip.shape != x.shape:
        raise _fail(node, f"input {x} and skip {skip} must have one 2-D or 3-D shape")
    if any(t.shape != hidden for t in ins[2:]):
        raise _fail(node, f"gamma and bias must be {hidden}, got {', '.join(str(t) for t in ins[2:])}")
    if len(node.outputs) > 4:
        raise _fail(node, f"has {len(node.outputs)} outputs; the op defines 4")
    stat = _stat_type(x, x.rank - 1)
    return [x, stat, stat, x][: len(node.outputs)]


def _rmsnorm_flops(node: Node, ins: list[TensorType], outs: list[TensorType]) -> int:
    return 4 * ins[0].numel + (ins[0].numel if node.op.startswith("Skip") else 0)


_register("SimplifiedLayerNormalization", "reduction", _infer_simplified_layernorm, _rmsnorm_flops,
          runtime="onnxruntime", arity=(2, 2, (1, 2)))
_register("SkipSimplifiedLayerNormalization", "reduction", _infer_skip_simplified_layernorm, _rmsnorm_flops,
          onnx_domain="com.microsoft", runtime="onnxruntime", arity=(3, 4, (1, 2, 3, 4)))


def _infer_rotary(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    if len(ins) != 4:
        raise _fail(node, f"takes input, position_ids, cos_cache and sin_cache, got {len(ins)} inputs")
    x, pos, cos, sin = ins
    if x.rank != 4:  # (batch, heads, sequence, head size): the layout the rules write
        raise _fail(node, f"input {x} must be (batch, heads, sequence, head size)")
    half = (node.attr("rotary_embedding_dim", 0) or x.shape[3]) // 2
    if cos.rank != 2 or cos != sin or cos.shape[1] != half or cos.shape[0] < x.shape[2]:
        raise _fail(node, f"cos/sin caches {cos}, {sin} must be (>= {x.shape[2]}, {half})")
    if pos.dtype != "int64" or pos.shape not in ((1,), (x.shape[0], x.shape[2])):
        raise _fail(node, f"position_ids {pos} must be int64 (1,) or (batch, sequence)")
    if node.attr("rotary_embedding_dim", 0) not in (0, x.shape[3]) or node.attr("is_packed_batching", 0) \
            or node.attr("scale", 1.0) != 1.0:
        raise _fail(node, "only a full-width, unpacked, unscaled rotary embedding is supported")
    return [x]


# RotaryEmbedding (com.microsoft): rotary position embeddings of x (batch, heads, sequence, head size) by the
# rows of the cos/sin caches at position_ids ((1,): an offset to 0..sequence-1), rotate-half (interleaved=0)
# or interleaved pairs (interleaved=1).
_register("RotaryEmbedding", "elementwise", _infer_rotary, lambda n, i, o: 3 * o[0].numel,
          onnx_domain="com.microsoft", runtime="onnxruntime", arity=(4, 4, 1))


def _infer_mha(node: Node, ins: list[TensorType | None], consts: Consts) -> list[TensorType]:
    if not 3 <= len(ins) <= 6:
        raise _fail(node, f"takes query, key, value, bias, key_padding_mask and attention_bias (no past), got "
                          f"{len(ins)} inputs")
    q, k, v = ins[:3]
    bias, pad, extra = (list(ins[3:]) + [None] * 3)[:3]
    heads = node.attr("num_heads", 0)
    if q is None or k is None or v is None:
        raise _fail(node, "query, key and value must all be given (packed forms are not supported)")
    if q.rank != 3 or k.rank != 3 or v.rank != 3 or k.shape[:2] != v.shape[:2] or q.shape[0] != k.shape[0]:
        raise _fail(node, f"query {q}, key {k} and value {v} must be (batch, sequence, hidden)")
    if heads < 1 or q.shape[2] != k.shape[2] or q.shape[2] % heads or v.shape[2] % heads:
        raise _fail(node, f"num_heads {heads} must divide the hidden sizes of query {q}, key {k} and value {v}")
    b, s, kv = q.shape[0], q.shape[1], k.shape[1]
    if bias is not None and bias.shape != (2 * q.shape[2] + v.shape[2],):
        raise _fail(node, f"bias {bias} must be ({2 * q.shape[2] + v.shape[2]},): q, k and v biases")
    if pad is not None and (pad.shape != (b, kv) or pad.dtype != "int32"):
        raise _fail(node, f"key_padding_mask {pad} must be int32 (batch, key sequence)")
    if extra is not None and (extra.rank != 4 or extra.shape[2:] != (s, kv) or extra.shape[0] not in (1, b)
                              or extra.shape[1] not in (1, heads)):
        raise _fail(node, f"attention_bias {extra} must be (1 or batch, 1 or heads, {s}, {kv})")
    if node.attr("unidirectional", 0) and s != kv:
        raise _fail(node, "unidirectional attention needs query and key of one sequence length")
    if len(node.outputs) != 1:
        raise _fail(node, "only the output is supported (no present key/value)")
    return [TensorType((b, s, v.shape[2]), q.dtype)]


# MultiHeadAttention (com.microsoft): softmax(Q K^T * scale + attention_bias (+ mask_filter_value where the
# key_padding_mask is 0) (+ causal mask)) V per head, with query, key and value (batch, sequence, hidden) split
# into num_heads heads, plus their bias; scale defaults to 1 / sqrt(head size); unidirectional=1 masks the keys
# after each query. Packed query/key/value and past key/values are not supported here.
_register("MultiHeadAttention", "compute", _infer_mha,
          lambda n, i, o: 2 * i[0].shape[0] * i[0].shape[1] * i[1].shape[1] * (i[0].shape[2] + i[2].shape[2]),
          onnx_domain="com.microsoft", runtime="onnxruntime", arity=(3, 6, 1))


def _infer_gqa(node: Node, ins: list[TensorType | None], consts: Consts) -> list[TensorType]:
    if len(ins) != 7:
        raise _fail(node, f"takes query, key, value, past_key, past_value, seqlens_k and total_sequence_length, got "
                          f"{len(ins)} inputs (cos/sin caches, position_ids and attention_bias are not supported)")
    q, k, v, pk, pv, seqlens, total = ins
    heads, kv_heads = node.attr("num_heads", 0), node.attr("kv_num_heads", 0)
    if q is None or k is None or v is None:
        raise _fail(node, "query, key and value must all be given (packed QKV is not supported)")
    if q.rank != 3 or k.rank != 3 or k.shape != v.shape or k.shape[:2] != q.shape[:2]:
        raise _fail(node, f"query {q}, key {k} and value {v} must be (batch, sequence, hidden) of one batch and "
                          f"sequence, key and value of one shape")
    if kv_heads < 1 or heads < 1 or heads % kv_heads or q.shape[2] % heads or k.shape[2] % kv_heads \
            or q.shape[2] // heads != k.shape[2] // kv_heads:
        raise _fail(node, f"num_heads {heads} and kv_num_heads {kv_heads} must split query {q} and key {k} into "
                          f"heads of one size, num_heads a multiple of kv_num_heads")
    b, s, size = q.shape[0], q.shape[1], q.shape[2] // heads
    if size % 8:  # onnxruntime's CPU kernel refuses other head sizes
        raise _fail(node, f"head size {size} must be a multiple of 8")
    empty_past = (b, kv_heads, 0, size)
    if (pk is None) != (pv is None) or (pk is not None and (pk.shape != empty_past or pv.shape != empty_past)):
        raise _fail(node, f"past_key and past_value must both be empty or {empty_past}: only a prompt without past "
                          f"key/values is supported")
    if seqlens is None or seqlens.dtype != "int32" or seqlens.shape != (b,):
        raise _fail(node, f"seqlens_k {seqlens} must be int32 ({b},)")
    if total is None or total.dtype != "int32" or total.numel != 1 or total.rank > 1:
        raise _fail(node, f"total_sequence_length {total} must be an int32 scalar")
    lens, tot = _const_ints(node, consts, 5, "seqlens_k"), _const_ints(node, consts, 6, "total_sequence_length")
    if lens != [s - 1] * b or tot != [s]:
        raise _fail(node, f"seqlens_k {lens} and total_sequence_length {tot} must be {s - 1} per batch and {s}: "
                          f"only an unpadded prompt (no past) is supported")
    if node.attr("do_rotary", 0) or node.attr("local_window_size", -1) != -1 or node.attr("softcap", 0.0) \
            or node.attr("smooth_softmax", 0) or node.attr("qk_output", 0):
        raise _fail(node, "do_rotary, local_window_size, softcap, smooth_softmax and qk_output are not supported")
    if len(node.outputs) not in (1, 3):
        raise _fail(node, f"has {len(node.outputs)} outputs; the op defines output, present_key and present_value")
    present = TensorType((b, kv_heads, s, size), k.dtype)
    return [TensorType((b, s, q.shape[2]), q.dtype), present, present][: len(node.outputs)]


# GroupQueryAttention (com.microsoft): causal softmax(Q K^T * scale) V per head, query (batch, sequence,
# num_heads * head size) and key/value (batch, sequence, kv_num_heads * head size), each group of
# num_heads / kv_num_heads query heads reading one key/value head; scale defaults to 1 / sqrt(head size).
# present_key / present_value are the key and value heads (batch, kv_num_heads, sequence, head size). Only a
# prompt is supported: no past (empty inputs or zero-length tensors), seqlens_k all sequence - 1 and
# total_sequence_length the sequence, no rotary, window, softcap; onnxruntime's CPU kernel needs head size % 8.
_register("GroupQueryAttention", "compute", _infer_gqa,
          lambda n, i, o: 2 * i[0].shape[0] * i[0].shape[1] * i[1].shape[1] * 2 * i[0].shape[2],
          onnx_domain="com.microsoft", runtime="onnxruntime", arity=(7, 7, (1, 3)))


# ----- data movement ---------------------------------------------------------------------------
def _infer_concat(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    first = ins[0]
    axis = _axis(node, node.attr("axis"), first.rank)
    total = 0
    for t in ins:
        if t.rank != first.rank or any(t.shape[i] != first.shape[i] for i in range(t.rank) if i != axis):
            raise _fail(node, f"cannot concatenate {first} and {t} on axis {axis}")
        total += t.shape[axis]
    shape = list(first.shape)
    shape[axis] = total
    return [first.with_shape(shape)]


_register("Concat", "memory", _infer_concat, arity=(1, None, 1))


def _infer_split(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    x = ins[0]
    axis = _axis(node, node.attr("axis", 0), x.rank)
    sizes = node.attr("split")
    if sizes is None:
        sizes = _const_ints(node, consts, 1, "split")
    n = len(node.outputs)
    if sizes is None:
        size = x.shape[axis]
        chunk = -(-size // n)
        sizes = [min(chunk, size - i * chunk) for i in range(n)]
    if len(sizes) != n or sum(sizes) != x.shape[axis] or min(sizes) < 0:
        raise _fail(node, f"split sizes {list(sizes)} do not cover axis {axis} of {x} in {n} outputs")
    outs = []
    for s in sizes:
        shape = list(x.shape)
        shape[axis] = s
        outs.append(x.with_shape(shape))
    return outs


_register("Split", "memory", _infer_split, arity=(1, 2, None))


def slice_bounds(node: Node, shape: tuple[int, ...], starts, ends, axes, steps) -> list[tuple[int, int, int, int]]:
    """(axis, start, stop, step) per sliced axis, clamped as ONNX clamps them."""
    rank = len(shape)
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = list(steps) if steps is not None else [1] * len(starts)
    out = []
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _axis(node, a, rank)
        if st == 0:
            raise _fail(node, "slice step 0")
        start, stop, step = slice(s, e, st).indices(shape[a])
        out.append((a, start, stop, step))
    return out


def _infer_slice(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    x = ins[0]
    starts = _const_ints(node, consts, 1, "starts")
    ends = _const_ints(node, consts, 2, "ends")
    if starts is None or ends is None:
        raise _fail(node, "Slice needs starts and ends")
    axes = _const_ints(node, consts, 3, "axes")
    steps = _const_ints(node, consts, 4, "steps")
    shape = list(x.shape)
    for a, start, stop, step in slice_bounds(node, x.shape, starts, ends, axes, steps):
        shape[a] = len(range(start, stop, step))
    return [x.with_shape(shape)]


_register("Slice", "memory", _infer_slice, arity=(3, 5, 1))


def reshape_target(node: Node, in_shape: tuple[int, ...], target: list[int]) -> tuple[int, ...]:
    allowzero = node.attr("allowzero", 0)
    out = [in_shape[i] if (d == 0 and not allowzero) else d for i, d in enumerate(target)]
    numel = int(np.prod(in_shape))
    if out.count(-1) > 1:
        raise _fail(node, f"reshape target {target} has more than one -1")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        if known == 0 or numel % known:
            raise _fail(node, f"cannot reshape {in_shape} to {target}")
        out[out.index(-1)] = numel // known
    if int(np.prod(out)) != numel:
        raise _fail(node, f"cannot reshape {in_shape} ({numel} elements) to {tuple(out)}")
    return tuple(out)


def _infer_reshape(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    target = _const_ints(node, consts, 1, "shape")
    if target is None:
        raise _fail(node, "Reshape needs a shape input")
    return [ins[0].with_shape(reshape_target(node, ins[0].shape, target))]


_register("Reshape", "view", _infer_reshape, arity=(2, 2, 1))


def _infer_flatten(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    x = ins[0]
    axis = node.attr("axis", 1)
    axis = axis % x.rank if x.rank and axis < 0 else axis
    if not 0 <= axis <= x.rank:
        raise _fail(node, f"axis {axis} out of range for {x}")
    return [x.with_shape((int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))))]


_register("Flatten", "view", _infer_flatten)


def _infer_squeeze(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    x = ins[0]
    axes = node.attr("axes")
    if axes is None:
        axes = _const_ints(node, consts, 1, "axes")
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = {_axis(node, a, x.rank) for a in axes}
    if any(x.shape[a] != 1 for a in axes):
        raise _fail(node, f"cannot squeeze axes {sorted(axes)} of {x}")
    return [x.with_shape([d for i, d in enumerate(x.shape) if i not in axes])]


def _infer_unsqueeze(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    x = ins[0]
    axes = node.attr("axes")
    if axes is None:
        axes = _const_ints(node, consts, 1, "axes")
    if axes is None:
        raise _fail(node, "Unsqueeze needs axes")
    rank = x.rank + len(axes)
    axes = sorted({_axis(node, a, rank) for a in axes})
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return [x.with_shape(shape)]


_register("Squeeze", "view", _infer_squeeze, arity=(1, 2, 1))
_register("Unsqueeze", "view", _infer_unsqueeze, arity=(1, 2, 1))


def _infer_transpose(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    x = ins[0]
    perm = node.attr("perm")
    if perm is None:
        perm = tuple(reversed(range(x.rank)))
    if sorted(perm) != list(range(x.rank)):
        raise _fail(node, f"perm {tuple(perm)} is not a permutation of {x.rank} axes")
    return [x.with_shape([x.shape[p] for p in perm])]


_register("Transpose", "memory", _infer_transpose)


def _infer_pad(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    x = ins[0]
    pads = node.attr("pads") or _const_ints(node, consts, 1, "pads")
    if pads is None:
        raise _fail(node, "Pad needs pads")
    axes = _const_ints(node, consts, 3, "axes")
    axes = [_axis(node, a, x.rank) for a in axes] if axes is not None else list(range(x.rank))
    if len(pads) != 2 * len(axes):
        raise _fail(node, f"pads {pads} do not fit {len(axes)} axes")
    shape = list(x.shape)
    for i, a in enumerate(axes):
        shape[a] += pads[i] + pads[i + len(axes)]
    if min(shape) < 0:
        raise _fail(node, f"pads {pads} crop {x} below zero")
    return [x.with_shape(shape)]


_register("Pad", "memory", _infer_pad, arity=(2, 4, 1))


def _infer_expand(node: Node, ins: list[TensorType], consts: Consts) -> list[TensorType]:
    target = _const_ints(node, consts, 1, "shape")
    if target is None:
        raise _fail(node, "Expand needs a shape")
    return [ins[0].with_shape(broadcast_shapes(node, ins[0].shape, tuple(target)))]


_register("Expand", "memory", _infer_expand, arity=(2, 2, 1))


# ----- the entry points ------------------------------------------------------------------------
def infer_node(node: Node, graph: Graph) -> list[TensorType] | None:
    """Output types of `node` from its inputs' types in `graph`; None for an opaque op."""
    if not is_known(node.op, node.domain):
        return None
    ins = [graph.type_of(v) if v else None for v in node.inputs]
    consts = [graph.const_value(v) if v else None for v in node.inputs]
    return infer_types(node, ins, consts)


def infer_types(node: Node, ins: Sequence[TensorType | None], consts: Consts) -> list[TensorType]:
    spec = OPS[node.op]
    act = node.attr("activation")
    if act and (node.op not in ("Conv", "MatMul", "Gemm") or act not in FUSABLE_ACTIVATIONS):
        raise _fail(node, f"fused activation {act!r} is not supported here")
    present = [t for t in ins if t is not None]
    if not present and node.op != "Constant":
        raise _fail(node, "no inputs")
    try:
        outs = spec.infer(node, list(ins) if None not in ins else _fill(ins), consts)
    except (IndexError, KeyError, TypeError) as e:
        raise _fail(node, f"malformed node ({type(e).__name__}: {e})") from e
    if len(outs) != len(node.outputs):
        raise _fail(node, f"has {len(node.outputs)} outputs but the op defines {len(outs)}")
    return outs


def _fill(ins: Sequence[TensorType | None]) -> list[TensorType]:
    # Optional inputs left out ("") sit at the end for every op that uses them here.
    out = list(ins)
    while out and out[-1] is None:
        out.pop()
    return out  # type: ignore[return-value]


def node_flops(node: Node, graph: Graph) -> int:
    """Floating-point operations of one node (0 for views, data movement and opaque ops)."""
    if not is_known(node.op, node.domain):
        return 0
    spec = OPS[node.op]
    ins = [graph.type_of(v) for v in node.inputs if v]
    outs = [graph.type_of(v) for v in node.outputs]
    return int(spec.flops(node, ins, outs))


def node_bytes(node: Node, graph: Graph) -> int:
    """Bytes a kernel for this node reads and writes (0 for views, which run no kernel)."""
    if is_known(node.op, node.domain) and op_kind(node.op) == "view":
        return 0
    total = sum(graph.type_of(v).nbytes for v in dict.fromkeys(node.inputs) if v)
    return total + sum(graph.type_of(v).nbytes for v in node.outputs)


def graph_flops(graph: Graph) -> int:
    return sum(node_flops(n, graph) for n in graph.nodes.values())


def graph_bytes(graph: Graph) -> int:
    return sum(node_bytes(n, graph) for n in graph.nodes.values())
