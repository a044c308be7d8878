"""ONNX-level clean-up before a model becomes the IR: order, static shapes, constant folding.

Exported models compute much of their own shape arithmetic at run time (torch.onnx's
Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains). Once the input shapes are pinned, all of
that is constant: `simplify` alternates ONNX shape inference with folding every node whose inputs
are all known, until nothing changes. The IR then sees only static shapes and constant
shape-like inputs, as it requires.

Everything here works on plain ONNX protos and numpy arrays; `onnx_io` turns the result into a Graph.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import AttributeProto, NodeProto, TensorProto, TypeProto, ValueInfoProto, helper, numpy_helper

from xrl.errors import ConfigError, DynamicShapeError, InvalidGraphError, ModelLoadError
from xrl.limits import check_elements, check_shape, elements

DEFAULT_DOMAINS = ("", "ai.onnx")

# ONNX element types the IR has a dtype for (numpy spelling, as xrl.ir.types spells them).
ONNX_TO_DTYPE: dict[int, str] = {
    TensorProto.FLOAT: "float32",
    TensorProto.DOUBLE: "float64",
    TensorProto.FLOAT16: "float16",
    TensorProto.BFLOAT16: "bfloat16",
    TensorProto.INT64: "int64",
    TensorProto.INT32: "int32",
    TensorProto.INT16: "int16",
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "uint8",
    TensorProto.BOOL: "bool",
}
DTYPE_TO_ONNX: dict[str, int] = {v: k for k, v in ONNX_TO_DTYPE.items()}

# Ops whose value is not a function of their inputs, or that hold subgraphs: never folded.
_NEVER_FOLD = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
    "If", "Loop", "Scan", "Dropout",
})
# Ops whose outputs after the first are optional: unused ones are dropped (the IR types only what is used).
_OPTIONAL_TAIL_OUTPUTS = frozenset({"Dropout", "BatchNormalization", "LayerNormalization", "MaxPool"})
# Weights above this many elements go to shape inference as typed inputs, not data: inference only
# needs the values of small shape-like tensors, and copying big weights into it costs seconds.
_INFER_CONST_LIMIT = 4096
# A fold that would materialise more than this, and more than twice its inputs, stays a node
# (ConstantOfShape/Expand/Tile can blow a few bytes up into a huge weight).
_MAX_FOLD_BYTES = 64 << 20
_MAX_ROUNDS = 8


@dataclass
class OnnxWork:
    """The graph being imported, as plain ONNX pieces (copies: the caller's model is never mutated)."""

    nodes: list[NodeProto]  # kept in topological order
    inputs: list[ValueInfoProto]  # activation inputs (not weights), in order
    outputs: list[ValueInfoProto]
    consts: dict[str, np.ndarray]  # weights, Constant nodes and folded values
    value_info: list[ValueInfoProto]  # declared intermediate types: the only ones custom-domain ops have
    opset: int  # default-domain opset
    opsets: dict[str, int] = field(default_factory=dict)  # every domain -> version

    @staticmethod
    def from_model(model: onnx.ModelProto, label: str) -> OnnxWork:
        g = model.graph
        if g.sparse_initializer:
            raise ModelLoadError(f"{label}: sparse initializers are not supported; densify them before import "
                                 f"(e.g. onnx.numpy_helper) or re-export the model")
        if not g.node:
            raise ModelLoadError(f"{label}: the model's graph is empty (no nodes); nothing to optimise")
        if not g.output:
            raise ModelLoadError(f"{label}: the model's graph has no outputs")
        consts: dict[str, np.ndarray] = {}
        for t in g.initializer:
            consts[t.name] = _tensor_to_array(t, label)
        nodes: list[NodeProto] = []
        for n in g.node:
            if n.op_type == "Constant" and n.domain in DEFAULT_DOMAINS:
                consts[n.output[0]] = _constant_value(n, label)
                continue
            copy = NodeProto()
            copy.CopyFrom(n)
            nodes.append(copy)
        inputs = [_copy(v) for v in g.input if v.name not in consts]
        opsets = {("" if d.domain == "ai.onnx" else d.domain): d.version for d in model.opset_import}
        work = OnnxWork(nodes, inputs, [_copy(v) for v in g.output], consts, [_copy(v) for v in g.value_info],
                        opsets.get("", 0), opsets)
        work.nodes = topological_sort(work.nodes, {v.name for v in inputs} | set(consts), label)
        defined = {v.name for v in inputs} | set(consts) | {v for n in work.nodes for v in n.output}
        for v in work.outputs:
            if v.name not in defined:
                raise InvalidGraphError(f"{label}: graph output {v.name!r} is not computed by anything")
        _prune_optional_outputs(work)
        return work

    def infer_model(self) -> onnx.ModelProto:
        """The graph as a model for shape inference (big weights as typed inputs, not data)."""
        g = onnx.GraphProto(name="xrl_infer")
        g.node.extend(self.nodes)
        g.input.extend(self.inputs)
        g.output.extend(self.outputs)
        produced = {v for n in self.nodes for v in n.output}
        g.value_info.extend(v for v in self.value_info if v.name in produced)  # not the folded ones
        for name, arr in self.consts.items():
            if arr.size <= _INFER_CONST_LIMIT:
                g.initializer.append(numpy_helper.from_array(arr, name))
            else:
                g.input.append(helper.make_tensor_value_info(name, _onnx_elem_type(arr.dtype), arr.shape))
        opsets = [helper.make_opsetid(d, v) for d, v in sorted(self.opsets.items())]
        return helper.make_model(g, opset_imports=opsets,
                                 ir_version=helper.find_min_ir_version_for(opsets, ignore_unknown=True))


def _copy(v: ValueInfoProto) -> ValueInfoProto:
    out = ValueInfoProto()
    out.CopyFrom(v)
    return out


def _onnx_elem_type(dtype: np.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _tensor_to_array(t: TensorProto, label: str) -> np.ndarray:
    try:
        return numpy_helper.to_array(t)
    except Exception as e:  # a bad tensor: missing external data, unknown type, wrong byte count
        raise ModelLoadError(f"{label}: cannot read tensor {t.name!r} ({type(e).__name__}: {e}); "
                             f"keep external data files next to the model") from e


def _constant_value(node: NodeProto, label: str) -> np.ndarray:
    for a in node.attribute:
        if a.name == "value":
            return _tensor_to_array(a.t, label)
        if a.name == "value_float":
            return np.array(a.f, dtype=np.float32)
        if a.name == "value_floats":
            return np.array(list(a.floats), dtype=np.float32)
        if a.name == "value_int":
            return np.array(a.i, dtype=np.int64)
        if a.name == "value_ints":
            return np.array(list(a.ints), dtype=np.int64)
    raise ModelLoadError(f"{label}: Constant node {node.name!r} has no value xrl can read "
                         f"(sparse and string constants are not supported)")


def node_label(node: NodeProto, index: int | None = None) -> str:
    name = node.name or (f"#{index}" if index is not None else "<unnamed>")
    return f"{name!r} ({node.op_type})"


def topological_sort(nodes: Sequence[NodeProto], defined: set[str], label: str) -> list[NodeProto]:
    """Nodes in a dependency order (Kahn, ties in file order); InvalidGraphError on a cycle or a
    value read but never defined, so those never reach shape inference."""
    producer: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for v in n.output:
            if not v:
                continue
            if v in producer or v in defined:
                raise InvalidGraphError(f"{label}: value {v!r} is defined twice (node {node_label(n, i)})")
            producer[v] = i
    users: list[list[int]] = [[] for _ in nodes]
    indeg = [0] * len(nodes)
    for i, n in enumerate(nodes):
        deps = set()
        for v in n.input:
            if not v or v in defined:
                continue
            if v not in producer:
                raise InvalidGraphError(f"{label}: node {node_label(n, i)} reads {v!r}, which nothing defines")
            deps.add(producer[v])
        indeg[i] = len(deps)
        for d in deps:
            users[d].append(i)
    ready = [i for i in range(len(nodes)) if indeg[i] == 0]
    order: list[int] = []
    while ready:
        ready.sort(reverse=True)  # pop the earliest in file order: a stable, deterministic order
        i = ready.pop()
        order.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    if len(order) != len(nodes):
        stuck = next(i for i in range(len(nodes)) if indeg[i] > 0)
        raise InvalidGraphError(f"{label}: the graph has a cycle through node {node_label(nodes[stuck], stuck)}")
    return [nodes[i] for i in order]


def _prune_optional_outputs(work: OnnxWork) -> None:
    """Drop unused optional outputs (Dropout's mask, BatchNormalization's running stats...) and name
    the omitted ("") ones that remain, so every output is a real value with an inferred type."""
    used = {v for n in work.nodes for v in n.input} | {v.name for v in work.outputs}
    taken = used | {v for n in work.nodes for v in n.output} | set(work.consts) | {v.name for v in work.inputs}
    for n in work.nodes:
        optional_tail = n.op_type in _OPTIONAL_TAIL_OUTPUTS and n.domain in DEFAULT_DOMAINS
        keep = len(n.output)
        while keep > 1 and (not n.output[keep - 1] or (optional_tail and n.output[keep - 1] not in used)):
            keep -= 1
        del n.output[keep:]
        for i, v in enumerate(n.output):
            if not v:
                k = 0
                while f"{n.name or n.op_type}_unused{i}_{k}" in taken:
                    k += 1
                n.output[i] = f"{n.name or n.op_type}_unused{i}_{k}"
                taken.add(n.output[i])


# ----- static shapes ---------------------------------------------------------------------------
def dims_of(tp: TypeProto) -> list[int | str] | None:
    """A tensor type's dims: ints where fixed, the symbol (or "?") where not; None without a shape."""
    if tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tp.tensor_type.shape.dim]


def static_shape(tp: TypeProto | None) -> tuple[int, ...] | None:
    dims = dims_of(tp) if tp is not None else None
    if dims is None or not all(isinstance(d, int) for d in dims):
        return None
    return tuple(dims)  # type: ignore[arg-type]


def _set_dims(tp: TypeProto, dims: Sequence[int | None]) -> None:
    shape = tp.tensor_type.shape
    shape.ClearField("dim")
    for d in dims:
        dim = shape.dim.add()
        if d is not None:
            dim.dim_value = d


def pin_input_shapes(work: OnnxWork, input_shapes: Mapping[str, Sequence[int]] | None, label: str) -> None:
    """Fix every graph input's dims (from the model or `input_shapes`); DynamicShapeError naming every
    input left dynamic, with the --input-shape option that fixes it."""
    given = {k: tuple(v) for k, v in (input_shapes or {}).items()}
    names = [v.name for v in work.inputs]
    for k, shape in given.items():
        if k not in names:
            raise ConfigError(f"input shape given for {k!r}, which is not an input of {label} "
                              f"(inputs: {', '.join(names) or 'none'})")
        if not all(isinstance(d, int | np.integer) and d >= 0 for d in shape):
            raise ConfigError(f"input shape {k}={','.join(map(str, shape))} must be non-negative integers")
        check_shape(shape, f"input {k!r} of {label} (--input-shape)")  # before anything holds the dims
    dynamic: list[str] = []
    for v in work.inputs:
        if v.type.WhichOneof("value") != "tensor_type":
            raise ModelLoadError(f"{label}: input {v.name!r} is not a tensor (sequences and maps are not supported)")
        dims = dims_of(v.type)
        if v.name in given:
            shape = given[v.name]
            if dims is not None and len(dims) != len(shape):
                raise ConfigError(f"input shape {v.name}={','.join(map(str, shape))} has rank {len(shape)}, but "
                                  f"input {v.name!r} of {label} has rank {len(dims)} ({_fmt_dims(dims)})")
            for i, (d, s) in enumerate(zip(dims or (), shape)):
                if isinstance(d, int) and d != s:
                    raise ConfigError(f"input shape {v.name}={','.join(map(str, shape))} sets dim {i} to {s}, "
                                      f"but {label} fixes it to {d} ({_fmt_dims(dims)})")
            _set_dims(v.type, [int(s) for s in shape])
        elif dims is None or not all(isinstance(d, int) for d in dims):
            dynamic.append(v.name)
        else:
            check_shape(dims, f"input {v.name!r} of {label}")  # type: ignore[arg-type]
    if dynamic:
        parts, fixes = [], []
        for v in work.inputs:
            if v.name in dynamic:
                dims = dims_of(v.type)
                parts.append(f"{v.name!r} has dynamic shape ({_fmt_dims(dims)})" if dims is not None
                             else f"{v.name!r} has no shape")
                fix = ",".join(str(d) if isinstance(d, int) else "1" for d in dims) if dims else "D1,D2,..."
                fixes.append(f"--input-shape {v.name}={fix}")
        raise DynamicShapeError(f"{label}: input {'; input '.join(parts)}; pass {' '.join(fixes)} "
                                f"(input_shapes= in Python) with the sizes you will run")
    # Dims declared on computed values would shadow, or contradict, what inference derives from the
    # pinned inputs: forget them, except the fixed dims of custom-domain ops, which nothing else types.
    custom = {v for n in work.nodes if n.domain not in DEFAULT_DOMAINS or not onnx.defs.has(n.op_type, n.domain)
              for v in n.output}  # (onnxruntime registers SimplifiedLayerNormalization in the default domain)
    for v in (*work.outputs, *work.value_info):
        dims = dims_of(v.type)
        if dims is not None:
            _set_dims(v.type, [d if isinstance(d, int) and v.name in custom else None for d in dims])


def _fmt_dims(dims: Sequence[int | str] | None) -> str:
    return ", ".join(map(str, dims or ()))


def infer_types(work: OnnxWork, label: str) -> dict[str, TypeProto]:
    """ONNX shape inference (non-strict, with data propagation) over the current graph."""
    try:
        inferred = onnx.shape_inference.infer_shapes(work.infer_model(), strict_mode=False, data_prop=True)
    except Exception as e:  # inference rejects malformed models even in non-strict mode
        raise ModelLoadError(f"{label}: ONNX shape inference failed ({type(e).__name__}: {e}); "
                             f"check the model with onnx.checker.check_model") from e
    g = inferred.graph
    types = {v.name: v.type for v in (*g.input, *g.value_info, *g.output)}
    # Keep declared types inference could not reproduce (custom-domain ops).
    for v in work.value_info:
        if static_shape(types.get(v.name)) is None and static_shape(v.type) is not None:
            types[v.name] = v.type
    return types


# ----- constant folding ------------------------------------------------------------------------
def fold_constants(work: OnnxWork, types: Mapping[str, TypeProto], label: str = "model") -> int:
    """Evaluate every node whose inputs are all constant (and Shape/Size of static values); their
    outputs become weights. Returns the number of nodes folded."""
    kept: list[NodeProto] = []
    folded = 0
    for node in work.nodes:
        values = _try_fold(node, work.consts, types, work.opset, label)
        if values is None:
            kept.append(node)
            continue
        for name, arr in zip(node.output, values):
            work.consts[name] = arr
        folded += 1
    work.nodes = kept
    return folded


def remove_dead(work: OnnxWork) -> None:
    """Drop nodes and weights nothing reads (ONNX ops have no side effects)."""
    live = {v.name for v in work.outputs}
    kept: list[NodeProto] = []
    for node in reversed(work.nodes):
        if any(v in live for v in node.output):
            kept.append(node)
            live.update(v for v in node.input if v)
    work.nodes = kept[::-1]
    work.consts = {k: v for k, v in work.consts.items() if k in live}


def simplify(work: OnnxWork, label: str) -> dict[str, TypeProto]:
    """Shape inference and constant folding to a fixed point, then channel pads (`fold_channel_pads`);
    returns the final value types."""
    remove_dead(work)
    for _ in range(_MAX_ROUNDS):
        types = infer_types(work, label)
        if not fold_constants(work, types, label):
            break
        remove_dead(work)
    else:
        types = infer_types(work, label)
    if fold_channel_pads(work, types):
        remove_dead(work)
        types = infer_types(work, label)
    return types


# ----- pads with a per-channel value -----------------------------------------------------------
# A constant Pad whose border is then overwritten with one value per channel by slice assignments
# (Diverse Branch Block's BNAndPadLayer: `out = F.pad(x); out[:, :, 0:p, :] = v; ...`), which both torch
# exporters write as ScatterNDs with constant indices and updates (dynamo between Transposes). ScatterND
# is opaque to the IR; the chain computes Pad(x - v) + v with v of shape (1, C, 1, ...) (up to the rounding of
# (x - v) + v inside, 2^-24 relative), which is what import writes instead, so that rules can reason about the
# pad (rewrite_rules/reparam_dbb.rules, tests/test_dbb.py).
_CHAIN_OPS = frozenset({"Transpose", "Identity", "ScatterND"})
_MAX_CHAIN = 16
_MAX_CHANNEL_PAD = 1 << 23  # elements of a padded tensor the check evaluates (three float64 copies)


def _chain_step(node: NodeProto, arr: np.ndarray, consts: Mapping[str, np.ndarray], nan_updates: bool) -> np.ndarray:
    if node.op_type == "Identity":
        return arr
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Transpose":
        return np.transpose(arr, attrs.get("perm"))
    idx, upd = consts[node.input[1]].astype(np.int64), consts[node.input[2]]
    out = arr.copy()
    out[tuple(np.moveaxis(idx, -1, 0))] = np.full(upd.shape, np.nan) if nan_updates else upd
    return out


def _channel_pad(pad: NodeProto, chain: list[NodeProto], shape: tuple[int, ...], pads: np.ndarray,
                 consts: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """The per-channel border values (shape (1, C, 1, ...)) when Pad then `chain` computes Pad(x) with its
    whole border, and only its border, overwritten by one value per channel; else None."""
    rank = len(shape)
    padded = tuple(int(d + pads[i] + pads[i + rank]) for i, d in enumerate(shape))
    n = math.prod(padded)
    if n > _MAX_CHANNEL_PAD:
        return None
    ids = np.arange(n, dtype=np.float64).reshape(padded)
    src, val = ids, np.zeros(padded)
    try:
        for node in chain:
            src = _chain_step(node, src, consts, True)
            val = _chain_step(node, val, consts, False)
    except (ValueError, IndexError, TypeError):
        return None
    if src.shape != padded:
        return None
    written = np.isnan(src)
    border = np.ones(padded, bool)
    border[tuple(slice(int(pads[i]), padded[i] - int(pads[i + rank])) for i in range(rank))] = False
    if not border.any() or not np.array_equal(written, border) or not np.array_equal(src[~written], ids[~written]):
        return None
    per_channel = np.moveaxis(np.where(border, val, np.nan), 1, 0).reshape(padded[1], -1)
    v = np.nanmax(per_channel, axis=1)
    if not np.array_equal(np.nanmin(per_channel, axis=1), v):
        return None
    return v.reshape((1, padded[1]) + (1,) * (rank - 2))


def fold_channel_pads(work: OnnxWork, types: Mapping[str, TypeProto]) -> int:
    """Write every Pad whose border a chain of constant ScatterNDs (through Transposes and Identities)
    overwrites with one value per channel as Pad(x - v) + v (or Pad(x, value) where every channel's value
    is the same). Returns how many were rewritten."""
    consumers: dict[str, list[NodeProto]] = {}
    for node in work.nodes:
        for v in node.input:
            consumers.setdefault(v, []).append(node)
    outputs = {v.name for v in work.outputs}
    replace: dict[int, list[NodeProto]] = {}  # id of a chain's last node -> its replacement
    drop: set[int] = set()
    for pad in work.nodes:
        if pad.op_type != "Pad" or pad.domain not in DEFAULT_DOMAINS or len(pad.input) > 3:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in pad.attribute}
        shape = static_shape(types.get(pad.input[0]))
        if attrs.get("mode", b"constant") not in (b"constant", "constant") or shape is None or len(shape) < 3:
            continue
        if len(pad.input) < 2 or pad.input[1] not in work.consts:
            continue
        if len(pad.input) == 3 and pad.input[2] and pad.input[2] not in work.consts:
            continue
        pads = work.consts[pad.input[1]].astype(np.int64).reshape(-1)
        rank = len(shape)
        if pads.size != 2 * rank or pads.min() < 0 or pads[[0, 1, rank, rank + 1]].any():
            continue
        chain: list[NodeProto] = []
        cur = pad.output[0]
        while len(chain) < _MAX_CHAIN and cur not in outputs and len(consumers.get(cur, ())) == 1:
            node = consumers[cur][0]
            if node.op_type not in _CHAIN_OPS or node.domain not in DEFAULT_DOMAINS or node.input[0] != cur:
                break
            if node.op_type == "ScatterND" and (len(node.input) != 3 or node.input[1] not in work.consts
                                                or node.input[2] not in work.consts or any(
                                                    a.name == "reduction" and a.s not in (b"", b"none")
                                                    for a in node.attribute)):
                break
            chain.append(node)
            cur = node.output[0]
        while chain and not _identity_layout(chain):
            chain.pop()  # end where the layout is the Pad's again
        if not any(n.op_type == "ScatterND" for n in chain):
            continue
        v = _channel_pad(pad, chain, shape, pads, work.consts)
        if v is None:
            continue
        elem = types.get(pad.input[0])
        dtype = helper.tensor_dtype_to_np_dtype(elem.tensor_type.elem_type) if elem is not None else np.float32
        out, base = chain[-1].output[0], pad.output[0]
        if np.all(v == v.flat[0]):
            value = _fresh(work, base + "_channel_value", np.array(v.flat[0], dtype=dtype))
            new = [helper.make_node("Pad", [pad.input[0], pad.input[1], value], [out], mode="constant")]
        else:
            value = _fresh(work, base + "_channel_value", v.astype(dtype))
            shifted, padded = base + "_shifted", base + "_zero_padded"
            new = [helper.make_node("Sub", [pad.input[0], value], [shifted]),
                   helper.make_node("Pad", [shifted, pad.input[1]], [padded], mode="constant"),
                   helper.make_node("Add", [padded, value], [out])]
        replace[id(chain[-1])] = new
        drop.update(id(n) for n in [pad, *chain[:-1]])
    if not replace:
        return 0
    nodes: list[NodeProto] = []
    for node in work.nodes:
        if id(node) in replace:
            nodes.extend(replace[id(node)])
        elif id(node) not in drop:
            nodes.append(node)
    work.nodes = nodes
    return len(replace)


def _identity_layout(chain: Sequence[NodeProto]) -> bool:
    """Whether the Transposes of `chain` compose to no permutation."""
    perm: list[int] | None = None
    for node in chain:
        if node.op_type == "Transpose":
            p = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            if p is None:
                return False
            perm = p if perm is None else [perm[i] for i in p]
    return perm is None or perm == sorted(perm)


def _fresh(work: OnnxWork, name: str, value: np.ndarray) -> str:
    k, out = 0, name
    while out in work.consts:
        k += 1
        out = f"{name}_{k}"
    work.consts[out] = value
    return out


def _try_fold(node: NodeProto, consts: Mapping[str, np.ndarray], types: Mapping[str, TypeProto],
              opset: int, label: str = "model") -> list[np.ndarray] | None:
    if node.domain not in DEFAULT_DOMAINS or node.op_type in _NEVER_FOLD:
        return None
    if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
        return None
    if node.op_type in ("Shape", "Size"):
        x = node.input[0]
        shape = consts[x].shape if x in consts else static_shape(types.get(x))
        if shape is None:
            return None
        if node.op_type == "Size":
            return [np.array(math.prod(shape), dtype=np.int64)]
        attrs = {a.name: a.i for a in node.attribute}
        rank = len(shape)
        start, end = attrs.get("start", 0), attrs.get("end", rank)
        start, end = (min(max(s + rank if s < 0 else s, 0), rank) for s in (start, end))
        return [np.array(shape[start:end], dtype=np.int64)]
    args = [v for v in node.input]
    if not any(args) or any(v and v not in consts for v in args):
        return None
    in_bytes = sum(consts[v].nbytes for v in args if v)
    # Sizes are checked before anything is evaluated: a few bytes of ConstantOfShape/Expand/Tile
    # input can ask for terabytes.
    out_elems = _output_elements(node, consts, types)
    if out_elems is None:
        return None  # an output size xrl cannot bound: leave the node alone
    for v, n in zip(node.output, out_elems):
        check_elements(n, f"{label}: value {v!r} (output of node {node_label(node)}, folded as a constant)")
    out_bytes = sum(out_elems) * 8
    if out_bytes > _MAX_FOLD_BYTES and out_bytes > 2 * in_bytes:
        return None
    try:
        values = _evaluate(node, [consts[v] if v else None for v in args], opset)
    except Exception:  # an op the evaluator cannot run stays a node: folding is only an optimisation
        return None
    if len(values) != len(node.output) or sum(v.nbytes for v in values) > max(_MAX_FOLD_BYTES, 2 * in_bytes):
        return None
    out = []
    for name, v in zip(node.output, values):
        tp = types.get(name)
        if tp is not None and tp.WhichOneof("value") == "tensor_type" and tp.tensor_type.elem_type:
            want = helper.tensor_dtype_to_np_dtype(tp.tensor_type.elem_type)
            if v.dtype != want:  # the reference evaluator sometimes widens scalars
                v = v.astype(want)
        out.append(v)
    return out


# Ops whose every output has at most as many elements as all their inputs together.
_NON_GROWING = frozenset({
    "Identity", "Cast", "CastLike", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Transpose", "Slice",
    "Split", "Abs", "Neg", "Sqrt", "Exp", "Log", "Floor", "Ceil", "Round", "Sign", "Not", "IsNaN", "Relu", "Sigmoid",
    "Tanh", "Erf", "Reciprocal", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ArgMax", "ArgMin",
    "NonZero", "Softmax", "LogSoftmax",
})
_BROADCASTING = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Min", "Max", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "And", "Or", "Xor", "Where", "Sum", "Mean", "BitShift",
})


def _output_elements(node: NodeProto, consts: Mapping[str, np.ndarray],
                     types: Mapping[str, TypeProto]) -> list[int] | None:
    """An upper bound on each output's element count, from inferred types or the constant inputs,
    computed without allocating; None where no bound is known."""
    shapes = [static_shape(types.get(v)) for v in node.output]
    if all(s is not None for s in shapes):
        return [elements(s) for s in shapes]  # type: ignore[arg-type]
    args = [consts[v] if v else None for v in node.input]
    op = node.op_type
    try:
        if op in _NON_GROWING:
            bound = sum(a.size for a in args if a is not None)
        elif op in _BROADCASTING:
            bound = elements(_broadcast([a.shape for a in args if a is not None]))
        elif op == "ConstantOfShape":
            bound = elements(args[0].reshape(-1))
        elif op == "Expand":
            bound = elements(_broadcast([args[0].shape, tuple(int(d) for d in args[1].reshape(-1))]))
        elif op == "Tile":
            bound = elements(d * int(r) for d, r in zip(args[0].shape, args[1].reshape(-1)))
        elif op == "Range":
            start, limit, delta = (float(a.reshape(-1)[0]) for a in args[:3])
            bound = max(0, math.ceil((limit - start) / delta)) if delta else 0
        elif op == "Gather":
            data, idx = args[0], args[1]
            axis = {a.name: a.i for a in node.attribute}.get("axis", 0)
            bound = data.size // max(data.shape[axis], 1) * idx.size
        else:
            return None
    except (ValueError, TypeError, IndexError, OverflowError, ZeroDivisionError, AttributeError):
        return None  # malformed inputs: the evaluator would fail anyway
    return [max(bound, 0)] * len(node.output)


def _broadcast(shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """numpy broadcasting of shapes, in Python ints (np.broadcast_shapes would reject huge dims)."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate(s, start=rank - len(s)):
            d = int(d)
            if d != 1:
                if out[i] not in (1, d):
                    raise ValueError("shapes do not broadcast")
                out[i] = d
    return tuple(out)


def _evaluate(node: NodeProto, args: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    fast = _FAST.get(node.op_type)
    if fast is not None:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return [np.asarray(fast(args, attrs))]
    from onnx.reference import ReferenceEvaluator

    names = [f"in{i}" if v is not None else "" for i, v in enumerate(args)]
    one = helper.make_node(node.op_type, names, [f"out{i}" for i in range(len(node.output))],
                           domain=node.domain)
    one.attribute.extend(node.attribute)
    g = helper.make_graph([one], "fold", [helper.make_empty_tensor_value_info(n) for n in names if n],
                          [helper.make_empty_tensor_value_info(o) for o in one.output])
    feeds = {n: a for n, a in zip(names, args) if n}
    return [np.asarray(v) for v in ReferenceEvaluator(g, opsets={"": opset}).run(None, feeds)]


def _reshape(args: list, attrs: dict) -> np.ndarray:
    x, shape = args[0], [int(d) for d in args[1]]
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return x.reshape(shape)


def _squeeze(args: list, attrs: dict) -> np.ndarray:
    axes = args[1] if len(args) > 1 and args[1] is not None else None
    return np.squeeze(args[0], axis=None if axes is None else tuple(int(a) for a in axes))


def _cast(args: list, attrs: dict) -> np.ndarray:
    to = attrs["to"]
    if to not in ONNX_TO_DTYPE or to == TensorProto.BFLOAT16:
        raise NotImplementedError  # the reference evaluator knows the exotic casts
    return args[0].astype(ONNX_TO_DTYPE[to])


# numpy evaluation of the ops that make up exported shape arithmetic: the reference evaluator costs
# about a millisecond a node, and torch exports carry thousands of these.
_FAST = {
    "Identity": lambda a, at: a[0],
    "Gather": lambda a, at: np.take(a[0], a[1].astype(np.int64), axis=at.get("axis", 0)),
    "Unsqueeze": lambda a, at: np.expand_dims(a[0], tuple(int(x) for x in a[1])),
    "Squeeze": _squeeze,
    "Concat": lambda a, at: np.concatenate([x for x in a if x is not None], axis=at["axis"]),
    "Reshape": _reshape,
    "Cast": _cast,
}
