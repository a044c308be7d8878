"""ONNX <-> IR: `load_onnx`/`from_onnx` (import), `to_onnx` (export), `save_onnx` (atomic write).

Import pins the input shapes, folds every weight-only computation (onnx_fold), then maps each node
to the IR's canonical form: axes/split as attributes, Cast.to as a dtype name, shape-like inputs as
weights. Ops the IR does not know stay opaque, with their domain, attributes and inferred types; so
does an onnxruntime contrib op the IR knows in a form it does not (packed or past key/values, partial
rotary, ...): its types are the file's, and the rules never touch it.
Export is the inverse for a chosen opset (17 unless the graph needs newer): canonical attributes go
back to inputs where the opset wants them, and fused activations become their own nodes. Opaque
nodes of other domains (com.microsoft, ...) export under the domain versions the source model
imported (`Graph.domain_opsets`).
"""

from __future__ import annotations

import contextlib
import glob
import math
import os
import weakref
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path

import numpy as np
import onnx
from onnx import AttributeProto, NodeProto, TensorProto, TypeProto, helper, numpy_helper

from xrl.atomic import atomic_write, remove_stale_temporaries, write_atomic
from xrl.errors import ConfigError, DynamicShapeError, InvalidGraphError, ModelLoadError, OutputPathError, XrlError
from xrl.frontends.onnx_fold import (
    DEFAULT_DOMAINS,
    DTYPE_TO_ONNX,
    ONNX_TO_DTYPE,
    OnnxWork,
    dims_of,
    pin_input_shapes,
    simplify,
    static_shape,
)
from xrl.ir import Graph, Node, TensorType
from xrl.ir.ops import FUSABLE_ACTIVATIONS, OPS, infer_types, ir_op, is_known, onnx_domain
from xrl.limits import check_shape

DEFAULT_OPSET = 17
MIN_OPSET = 13  # import converts older models up; export writes nothing older
# Canonical attribute <- the input it came from (index 1) in newer opsets, and the opset that moved it.
_ATTR_FROM_INPUT = {"Split": "split", "Squeeze": "axes", "Unsqueeze": "axes", "ReduceSum": "axes",
                    "ReduceMean": "axes", "ReduceMax": "axes", "ReduceMin": "axes", "ReduceProd": "axes"}
_INPUT_SINCE = {"Split": 13, "Squeeze": 13, "Unsqueeze": 13, "ReduceSum": 13,
                "ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18, "ReduceProd": 18}
# Shape-like inputs the IR reads as constants (xrl.ir.ops): they must be weights.
_CONST_INPUTS = {"Reshape": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3), "Expand": (1,)}
_FUSED_OPS = ("Conv", "MatMul", "Gemm")
# The IR domain of a default-domain contrib op the IR knows (SimplifiedLayerNormalization) kept opaque
# because the IR does not support its form: not known to the IR (so no rule or kernel takes it), written
# back in the default domain. (A contrib op of its own domain, com.microsoft, keeps that domain.)
OPAQUE_DEFAULT_DOMAIN = "ai.onnx.opaque"
# Models whose weights pass this are written with external data: protobuf cannot serialise 2 GiB.
EXTERNAL_DATA_THRESHOLD = int(1.8e9)


def tensor_bytes(t: TensorProto) -> int:
    """A tensor's data bytes from its shape and type: protobuf's ByteSize() walks the message (about 30 ms
    for one VGG weight) and reading raw_data copies it."""
    if t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return t.ByteSize()
    itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    return int(np.prod(t.dims, dtype=np.int64)) * itemsize


def initializer_bytes(model: onnx.ModelProto) -> int:
    return sum(tensor_bytes(t) for t in model.graph.initializer)
_EXTERNAL_MIN_TENSOR = 1024  # bytes: smaller tensors stay inline, as onnx itself does


# ===== import ==================================================================================
def load_onnx(path: str | os.PathLike, input_shapes: Mapping[str, Sequence[int]] | None = None, *,
              name: str | None = None) -> Graph:
    """Read an .onnx file (with any external data beside it) into a validated Graph."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"{p}: no such file; check the path")
    if p.is_dir():
        raise ModelLoadError(f"{p} is a directory, not an ONNX file; pass the path of the .onnx file")
    try:
        model = onnx.load(str(p))
    except OSError as e:  # unreadable file, or external data missing beside it
        raise ModelLoadError(f"cannot read {p} ({brief_error(e)}); check the file's permissions and that its "
                             f"external data files sit beside it") from e
    except Exception as e:  # DecodeError for corrupt or truncated protobuf
        raise ModelLoadError(f"{p} is not a valid ONNX model ({brief_error(e)}); check the file is complete "
                             f"or export it again") from e
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise ModelLoadError(f"{p} is not a valid ONNX model (no IR version or graph); check the file "
                             f"is complete or export it again")
    return _import(model, input_shapes, name or p.stem, str(p))


def from_onnx(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None, *,
              name: str | None = None, external: Mapping[str, np.ndarray] | None = None) -> Graph:
    """An in-memory ModelProto as a validated Graph (the model itself is left unchanged). `external`: the
    arrays of a model exported with `to_onnx(..., external=...)`, taken as they are (no copy)."""
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"from_onnx expects an onnx.ModelProto, got {type(model).__name__}")
    label = name or model.graph.name or "model"
    return _import(model, input_shapes, label, label, external)


def _import(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None, name: str,
            label: str, external: Mapping[str, np.ndarray] | None = None) -> Graph:
    if external:  # the weights kept apart are put in after the model's tensors are read: no bytes copied
        model = _with_placeholders(model, external)
    model = _upgrade_opset(model, label)
    if model.functions:  # model-local functions (the dynamo exporter's modules): inline to plain ops
        import onnx.inliner

        model = onnx.inliner.inline_local_functions(model)
    work = OnnxWork.from_model(model, label)
    for k, arr in (external or {}).items():
        if k in work.consts:
            work.consts[k] = arr
    pin_input_shapes(work, input_shapes, label)
    types = simplify(work, label)
    return _to_graph(work, types, name, label)


def brief_error(e: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    lines = str(e).strip().splitlines()
    msg = lines[0] if lines else ""
    msg = msg if len(msg) <= 200 else msg[:197] + "..."
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _default_opset(model: onnx.ModelProto, label: str) -> int:
    for d in model.opset_import:
        if d.domain in DEFAULT_DOMAINS:
            return d.version
    raise ModelLoadError(f"{label} imports no default-domain opset; it is not a standard ONNX model")


def _upgrade_opset(model: onnx.ModelProto, label: str) -> onnx.ModelProto:
    version = _default_opset(model, label)
    newest = onnx.defs.onnx_opset_version()
    if version > newest:
        raise ModelLoadError(f"{label} uses opset {version}, newer than onnx {onnx.__version__} knows ({newest}); "
                             f"upgrade onnx or export the model with opset <= {newest}")
    if version >= MIN_OPSET:
        return model
    try:
        converted = onnx.version_converter.convert_version(model, DEFAULT_OPSET)
    except Exception as e:
        raise ModelLoadError(f"{label} uses opset {version} and onnx could not convert it to opset {DEFAULT_OPSET} "
                             f"({brief_error(e)}); export the model again with opset {MIN_OPSET} or newer "
                             f"(e.g. torch.onnx.export(..., opset_version={DEFAULT_OPSET}))") from e
    return converted


def _to_graph(work: OnnxWork, types: Mapping[str, TypeProto], name: str, label: str) -> Graph:
    tensor_types: dict[str, TensorType] = {}
    for v in work.inputs:
        tensor_types[v.name] = _tensor_type(v.name, v.type, label, "graph input")
    for k, arr in work.consts.items():
        tensor_types[k] = _array_type(k, arr, label)
    nodes: list[Node] = []
    for onnx_node, node_name in zip(work.nodes, _unique_names(work.nodes)):
        where = f"output of node {node_name!r} ({onnx_node.op_type})"
        inferred = _ir_types(onnx_node, node_name, work.consts, tensor_types, types, label)
        for v in onnx_node.output:
            tensor_types[v] = (inferred or {}).get(v) or _tensor_type(v, types.get(v), label, where)
        nodes.append(_import_node(onnx_node, node_name, work.consts, tensor_types, label, opaque=inferred is None))
    outputs = [v.name for v in work.outputs]
    used = {v for n in nodes for v in n.inputs} | set(outputs)
    # axes/split moved into attributes; a weight equal to one an earlier import holds is that array
    weights = {k: shared_weight(a) for k, a in work.consts.items() if k in used}
    types_used = {k: t for k, t in tensor_types.items() if k not in work.consts or k in weights}
    domain_opsets = {d: v for d, v in work.opsets.items() if d not in DEFAULT_DOMAINS}  # kept for export
    return Graph(nodes, [v.name for v in work.inputs], outputs, types_used, weights, name=name,
                 domain_opsets=domain_opsets).validate()


def _ir_types(n: NodeProto, name: str, consts: Mapping[str, np.ndarray], known: Mapping[str, TensorType],
              types: Mapping[str, TypeProto], label: str) -> dict[str, TensorType] | None:
    """The IR's output types of a node ONNX shape inference left without static ones, where the IR knows
    the op and its inputs' types: onnx's inference knows no onnxruntime contrib op (SimplifiedLayerNormalization,
    which onnxruntime's transformers optimizer writes untyped) and so none of the ops after one. {} when
    every output is typed or the IR cannot say (the caller then reports the untyped value).

    None for a contrib op the IR knows in a form it does not support (its inference fails, or gives types
    other than the file's): the caller keeps that node opaque, typed by the file. A standard op's failure
    is left to the graph's validation: a malformed standard node is an error."""
    if n.op_type not in OPS or not ir_op(n.op_type, n.domain):
        return {}
    contrib = _contrib(n.op_type)
    typed = all(static_shape(types.get(v)) is not None for v in n.output)
    if (typed and not contrib) or any(v and v not in known for v in n.input):
        return {}
    try:
        node = _import_node(n, name, consts, known, label)
        outs = infer_types(node, [known[v] if v else None for v in node.inputs], [consts.get(v) for v in node.inputs])
    except (KeyError, XrlError):
        return None if contrib else {}
    if contrib and any(v and _declared(types.get(v)) not in (None, t) for v, t in zip(node.outputs, outs)):
        return None  # onnxruntime's types for this form are not the IR's
    return {} if typed else dict(zip(node.outputs, outs))


def _contrib(op: str) -> bool:
    """Whether IR op `op` is an onnxruntime contrib op (of com.microsoft, or of the default domain)."""
    spec = OPS[op]
    return bool(spec.onnx_domain or spec.runtime)


def _declared(tp: TypeProto | None) -> TensorType | None:
    """The static tensor type a file declares for a value, None where it declares none xrl can read."""
    shape = static_shape(tp)
    if shape is None or tp.WhichOneof("value") != "tensor_type" or tp.tensor_type.elem_type not in ONNX_TO_DTYPE:
        return None
    return TensorType(tuple(shape), ONNX_TO_DTYPE[tp.tensor_type.elem_type])


# Weights of this size and up are shared between imports (smaller ones cost less than the lookup).
_SHARE_MIN_BYTES = 1 << 16
# (dtype, shape, a sample of its bytes) -> weights live in some imported graph; dropped with the last graph
_shared_weights: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def shared_weight(arr: np.ndarray) -> np.ndarray:
    """`arr`, or an equal read-only weight an earlier import made that is still alive. A model exported and
    imported again (the file a search writes, re-read to cost and time it) then holds no second copy of
    the weights it did not change; the IR never writes into a weight, so sharing is safe."""
    if arr.nbytes < _SHARE_MIN_BYTES or not arr.flags.c_contiguous:
        return arr
    raw = arr.reshape(-1).view(np.uint8)  # bytes, not values: -0.0 is not 0.0, and a NaN equals itself
    key = (arr.dtype.str, arr.shape, raw[:64].tobytes(), raw[-64:].tobytes())
    old = _shared_weights.get(key)
    if old is not None and np.array_equal(old.reshape(-1).view(np.uint8), raw):
        return old
    if arr.flags.writeable:  # what Graph would do; done here so the pooled array is the one graphs hold
        arr = arr.view()
        arr.flags.writeable = False
    _shared_weights[key] = arr
    return arr


def trim_heap() -> None:
    """Give freed heap memory back to the system (glibc's malloc_trim): the arenas keep the space of the
    big transient buffers of an export or a session (serialised models, tensors' bytes) otherwise, and
    the process stays that large for the rest of the run. Elsewhere a no-op."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@cache
def _libc():  # noqa: ANN202 - a ctypes CDLL, or None
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):  # musl and other libcs have no malloc_trim
        return None


def _tensor_type(value: str, tp: TypeProto | None, label: str, where: str) -> TensorType:
    if tp is not None and tp.WhichOneof("value") not in (None, "tensor_type"):
        raise ModelLoadError(f"{label}: value {value!r} ({where}) is a {tp.WhichOneof('value')}, not a tensor; "
                             f"xrl handles tensor graphs only")
    elem = tp.tensor_type.elem_type if tp is not None else 0
    shape = static_shape(tp)
    if shape is None:
        dims = dims_of(tp) if tp is not None else None
        got = f"shape ({', '.join(map(str, dims))})" if dims is not None else "no shape"
        raise DynamicShapeError(f"{label}: value {value!r} ({where}) has {got} after shape inference; xrl needs "
                                f"static shapes: pin every input with --input-shape, and avoid ops whose output "
                                f"shape depends on data")
    if elem not in ONNX_TO_DTYPE:
        raise ModelLoadError(f"{label}: value {value!r} ({where}) has element type "
                             f"{TensorProto.DataType.Name(elem)}, which xrl does not support "
                             f"(supported: {', '.join(sorted(DTYPE_TO_ONNX))})")
    check_shape(shape, f"{label}: value {value!r} ({where})")  # nothing downstream may allocate it
    return TensorType(shape, ONNX_TO_DTYPE[elem])


def _array_type(name: str, arr: np.ndarray, label: str) -> TensorType:
    try:
        return TensorType.of(arr)
    except ValueError:
        raise ModelLoadError(f"{label}: weight {name!r} has dtype {arr.dtype}, which xrl does not support "
                             f"(supported: {', '.join(sorted(DTYPE_TO_ONNX))})") from None


def _unique_names(nodes: Sequence[NodeProto]) -> list[str]:
    """Node names, unique and deterministic: a node keeps its name unless it is empty or taken."""
    taken = {n.name for n in nodes if n.name}
    seen: set[str] = set()
    names: list[str] = []
    counters: dict[str, int] = {}
    for n in nodes:
        name = n.name
        if not name or name in seen:
            base = name or n.op_type
            k = counters.get(base, 0)
            while f"{base}_{k}" in taken or f"{base}_{k}" in seen:
                k += 1
            counters[base] = k + 1
            name = f"{base}_{k}"
        seen.add(name)
        names.append(name)
    return names


def _import_node(n: NodeProto, name: str, consts: Mapping[str, np.ndarray], types: Mapping[str, TensorType],
                 label: str, opaque: bool = False) -> Node:
    """`n` as an IR node; `opaque`: a contrib op of the IR in a form it does not support, kept as it is."""
    op = n.op_type
    if n.domain == OPAQUE_DEFAULT_DOMAIN:
        raise ModelLoadError(f"{label}: node {name!r} ({op}) has domain {n.domain!r}, which xrl reserves")
    if opaque:
        domain = OPAQUE_DEFAULT_DOMAIN if n.domain in DEFAULT_DOMAINS else n.domain
    else:
        domain = "" if n.domain in DEFAULT_DOMAINS or ir_op(op, n.domain) else n.domain
    if domain == "" and not ir_op(op, n.domain) and op in OPS:
        domain = "ai.onnx"  # a standard op named as a contrib op of another domain (RotaryEmbedding): opaque
    attrs = {a.name: _attr_value(a, f"{name!r} ({op})", label) for a in n.attribute}
    inputs = list(n.input)
    if domain == "":
        key = _ATTR_FROM_INPUT.get(op)
        if key is not None and len(inputs) > 1:
            src = inputs[1]
            if src:
                if src not in consts:
                    raise ModelLoadError(f"{label}: node {name!r} ({op}) computes its {key} input {src!r} at run "
                                         f"time; xrl needs it constant")
                values = tuple(int(x) for x in consts[src].reshape(-1))
                if values or key == "split":
                    attrs[key] = values
            inputs = inputs[:1]
        if op == "Split":
            attrs.pop("num_outputs", None)  # opset 18's even split: the sizes say it exactly
            if "split" not in attrs:
                axis = attrs.get("axis", 0)
                attrs["split"] = tuple(types[v].shape[axis] for v in n.output)
        elif op == "Cast":
            attrs["to"] = _dtype_name(attrs["to"], name, label)
        for i in _CONST_INPUTS.get(op, ()):
            if i < len(inputs) and inputs[i] and inputs[i] not in consts:
                raise ModelLoadError(f"{label}: node {name!r} ({op}) computes its input {inputs[i]!r} at run time; "
                                     f"xrl needs shape-like inputs constant (static shapes)")
    while inputs and not inputs[-1]:  # trailing omitted optionals say nothing
        inputs.pop()
    return Node(name, op, tuple(inputs), tuple(n.output), attrs, domain)


def _dtype_name(to: int, node: str, label: str) -> str:
    if to not in ONNX_TO_DTYPE:
        raise ModelLoadError(f"{label}: node {node!r} casts to {TensorProto.DataType.Name(to)}, which xrl does "
                             f"not support")
    return ONNX_TO_DTYPE[to]


def _attr_value(a: AttributeProto, node: str, label: str):
    t = a.type
    if t == AttributeProto.FLOAT:
        return float(a.f)
    if t == AttributeProto.INT:
        return int(a.i)
    if t == AttributeProto.STRING:
        return a.s.decode("utf-8", errors="surrogateescape")
    if t == AttributeProto.TENSOR:
        return numpy_helper.to_array(a.t)
    if t == AttributeProto.FLOATS:
        return tuple(float(x) for x in a.floats)
    if t == AttributeProto.INTS:
        return tuple(int(x) for x in a.ints)
    if t == AttributeProto.STRINGS:
        return tuple(s.decode("utf-8", errors="surrogateescape") for s in a.strings)
    if t == AttributeProto.TENSORS:
        return tuple(numpy_helper.to_array(x) for x in a.tensors)
    kind = AttributeProto.AttributeType.Name(t)
    raise ModelLoadError(f"{label}: node {node} has a {kind} attribute {a.name!r}; subgraphs and "
                         f"control flow are not supported (export the model without If/Loop/Scan)")


# ===== export ==================================================================================
def to_onnx(graph: Graph, *, opset: int | None = None,
            external: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """The graph as an ONNX model at `opset` (default: 17, or the oldest newer one the graph needs).

    Inputs keep their names; outputs get `graph.output_names` (an Identity is added where the value
    computing an output is named differently).

    With `external` (a dict, filled here), weights of _EXTERNAL_MIN_TENSOR bytes and more are not copied
    into the model: their tensors keep dtype and dims and point at MEMORY_LOCATION, and `external` maps
    their names to the graph's own arrays. Such a model (a "head") is what `save_onnx`, `from_onnx`,
    `xrl.frontends.verify` and the onnxruntime cost models take with its `external` arrays: the weights
    are never serialised in memory (a model's worth of bytes per export)."""
    return _Exporter(graph, _export_opset(graph, opset), external).build()


# Where the weights of a head (`to_onnx(..., external=...)`) are: in the caller's arrays, not in a file
MEMORY_LOCATION = "xrl:in-memory"


def _kept_apart(arr: np.ndarray) -> bool:
    """Whether a weight goes to `external`: big enough to matter, of a dtype onnxruntime can wrap."""
    return arr.nbytes >= _EXTERNAL_MIN_TENSOR and arr.dtype.kind in "fiub" and arr.dtype.isnative


def _mark_external(t: TensorProto) -> None:
    t.data_location = TensorProto.EXTERNAL
    entry = t.external_data.add()
    entry.key, entry.value = "location", MEMORY_LOCATION


def in_memory(t: TensorProto) -> bool:
    """Whether `t` is a head's tensor whose bytes are kept apart (`to_onnx(..., external=...)`)."""
    return t.data_location == TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == MEMORY_LOCATION for e in t.external_data)


def split_model(model: onnx.ModelProto, like: Mapping[str, np.ndarray] | None = None
                ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A full model as a head and its big weights apart (see `to_onnx`), leaving `model` unchanged. A
    weight whose bytes equal the array `like` holds under its name (the IR imported from this model) is
    that array; any other is read from the model (one tensor's bytes at a time while comparing)."""
    head = onnx.ModelProto()
    _copy_fields(head, model, skip="graph")
    _copy_fields(head.graph, model.graph, skip="initializer")
    external: dict[str, np.ndarray] = {}
    for t in model.graph.initializer:
        out = head.graph.initializer.add()
        if not t.HasField("raw_data") or t.data_location == TensorProto.EXTERNAL \
                or t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED) or tensor_bytes(t) < _EXTERNAL_MIN_TENSOR:
            out.CopyFrom(t)
            continue
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")
        if dtype.kind not in "fiub" or not dtype.isnative:
            out.CopyFrom(t)
            continue
        raw = t.raw_data
        arr = np.frombuffer(raw, dtype=dtype).reshape(tuple(t.dims))
        known = like.get(t.name) if like is not None else None
        if known is not None and known.dtype == arr.dtype and known.shape == arr.shape and known.flags.c_contiguous \
                and np.array_equal(known.reshape(-1).view(np.uint8), arr.reshape(-1).view(np.uint8)):
            arr = known
        del raw
        _copy_fields(out, t, skip=("raw_data", "data_location", "external_data"))
        _mark_external(out)
        external[t.name] = arr
    return head, external


def materialize(head: onnx.ModelProto, external: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """The full model of a head and its weights (a copy of every weight's bytes)."""
    model = onnx.ModelProto()
    model.CopyFrom(head)
    for t in model.graph.initializer:
        if in_memory(t):
            arr = external[t.name]
            t.ClearField("external_data")
            t.ClearField("data_location")
            t.raw_data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
    return model


def _with_placeholders(head: onnx.ModelProto, external: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of a head (small: no weights) whose kept-apart tensors are empty placeholders the import reads
    without copying anything; `_import` puts the arrays in their place."""
    model = onnx.ModelProto()
    model.CopyFrom(head)
    for t in model.graph.initializer:
        if t.name in external and in_memory(t):
            t.ClearField("external_data")
            t.ClearField("data_location")
            del t.dims[:]
            t.dims.append(0)
    return model


def _export_opset(graph: Graph, opset: int | None) -> int:
    newest = onnx.defs.onnx_opset_version()
    if opset is not None and not MIN_OPSET <= opset <= newest:
        raise ConfigError(f"cannot export with opset {opset}; use an opset from {MIN_OPSET} to {newest}")
    need, who = MIN_OPSET, ""
    for node in sorted(graph.nodes.values(), key=lambda n: n.name):
        v = _node_min_opset(node)
        if v > need:
            need, who = v, f"{node.name!r} ({node.op})"
    if opset is None:
        return max(DEFAULT_OPSET, need)
    if need > opset:
        raise ConfigError(f"node {who} needs opset {need} or newer; export with opset >= {need}")
    return opset


@cache
def _op_versions(op: str, domain: str) -> tuple[int, ...]:
    return tuple(sorted(s.since_version for s in _all_schemas().get((domain, op), ())))


@cache
def _all_schemas() -> dict[tuple[str, str], list[onnx.defs.OpSchema]]:
    out: dict[tuple[str, str], list[onnx.defs.OpSchema]] = {}
    for s in onnx.defs.get_all_schemas_with_history():
        out.setdefault(("" if s.domain == "ai.onnx" else s.domain, s.name), []).append(s)
    return out


@cache
def _schema(op: str, domain: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, opset, domain)
    except onnx.defs.SchemaError:
        return None


@cache
def _domain_version(domain: str) -> int:
    versions = [s.since_version for (d, _), ss in _all_schemas().items() if d == domain for s in ss]
    return max(versions, default=1)


def _node_min_opset(node: Node) -> int:
    """The oldest opset (>= MIN_OPSET) whose schema for this node's op exists and takes its attributes."""
    if node.domain not in ("", "ai.onnx") or (node.domain == "" and node.op in OPS and OPS[node.op].runtime):
        return MIN_OPSET  # a contrib op: not versioned with the default opset
    if node.op == "Gelu":
        return MIN_OPSET  # lowered to Erf arithmetic below opset 20
    versions = _op_versions(node.op, "")
    if not versions:
        raise InvalidGraphError(f"node {node.name!r}: {node.op!r} is not an ONNX operator; ops of other libraries "
                                f"need their domain set")
    first = max(versions[0], MIN_OPSET)
    wanted = set(node.attrs)
    if is_known(node.op):  # canonical attributes: the exporter writes each opset's own form of these
        wanted -= {"activation", _ATTR_FROM_INPUT.get(node.op)}
    for v in (first, *(s for s in versions if s > first)):
        schema = _schema(node.op, "", v)
        if schema is not None and wanted <= set(schema.attributes):
            return v
    return first


class _Exporter:
    """One export: Graph -> ModelProto at a fixed opset."""

    def __init__(self, graph: Graph, opset: int, external: dict[str, np.ndarray] | None = None) -> None:
        self.g = graph
        self.external = external
        self.opset = opset
        self.taken = set(graph.types) | set(graph.initializers) | set(graph.nodes) | set(graph.output_names)
        self.nodes: list[NodeProto] = []
        self.consts: dict[str, np.ndarray] = {}
        self._scalars: dict[tuple[float, str], str] = {}
        self.rename, self.identities = self._plan_outputs()
        self.domains: dict[str, int] = {"": opset}

    def fresh(self, prefix: str) -> str:
        k = 0
        while f"{prefix}_{k}" in self.taken:
            k += 1
        name = f"{prefix}_{k}"
        self.taken.add(name)
        return name

    def r(self, value: str) -> str:
        return self.rename.get(value, value)

    def _plan_outputs(self) -> tuple[dict[str, str], list[tuple[str, str]]]:
        """Which outputs need an Identity (value named differently), and which internal values must
        move aside because an output name is theirs."""
        g = self.g
        direct: set[str] = set()
        identities: list[tuple[str, str]] = []
        for v, name in zip(g.outputs, g.output_names):
            if name in direct or any(name == o for _, o in identities):
                raise InvalidGraphError(f"graph {g.name!r} has two outputs named {name!r}")
            if v == name:
                direct.add(v)
            else:
                identities.append((v, name))
        rename: dict[str, str] = {}
        for _, name in identities:
            if name in g.inputs:
                raise InvalidGraphError(f"graph {g.name!r}: output name {name!r} is also an input name; "
                                        f"rename the output")
            if name in g.types or name in g.initializers:
                rename[name] = self.fresh(name)
        return rename, identities

    # ----- nodes --------------------------------------------------------------------------------
    def emit(self, op: str, inputs: Sequence[str], outputs: Sequence[str], attrs: Mapping, name: str,
             domain: str = "") -> None:
        if domain == "":
            version = self.opset
        elif domain in self.domains:
            version = self.domains[domain]
        else:  # the version the source model imported, else the newest onnx knows (1 for unknown domains)
            version = self.domains[domain] = self.g.domain_opsets.get(domain) or _domain_version(domain)
        schema = _schema(op, domain, version)
        node = helper.make_node(op, list(inputs), list(outputs), name=name, domain=domain or None)
        node.attribute.extend(_make_attr(k, v, schema, name) for k, v in sorted(attrs.items()))
        self.nodes.append(node)

    def const(self, arr: np.ndarray, prefix: str) -> str:
        name = self.fresh(prefix)
        self.consts[name] = arr
        return name

    def scalar(self, value: float, dtype: str) -> str:
        key = (value, dtype)
        if key not in self._scalars:
            self._scalars[key] = self.const(np.array(value, dtype=dtype), "xrl_const")
        return self._scalars[key]

    def export_node(self, n: Node) -> None:
        inputs = [self.r(v) if v else "" for v in n.inputs]
        outputs = [self.r(v) for v in n.outputs]
        attrs = dict(n.attrs)
        if n.domain != "" or onnx_domain(n.op):  # ("ai.onnx": a standard op kept opaque, written as imported)
            self.emit(n.op, inputs, outputs, attrs, n.name, onnx_domain(n.op) if n.domain == "" else
                      "" if n.domain in ("ai.onnx", OPAQUE_DEFAULT_DOMAIN) else n.domain)
            return
        act = attrs.pop("activation", None) if n.op in _FUSED_OPS else None
        if n.op == "Cast":
            attrs["to"] = DTYPE_TO_ONNX[attrs["to"]]
        key = _ATTR_FROM_INPUT.get(n.op)
        if key is not None:
            values = attrs.pop(key, None)
            if key == "axes" and values is not None and len(values) == 0:
                values = None  # an empty axes list means "not given" in every opset
            if self.opset >= _INPUT_SINCE[n.op]:
                if values is not None:
                    inputs = [inputs[0], self.const(np.array(values, dtype=np.int64), f"{n.name}_{key}")]
                elif n.op == "Split" and self.opset >= 18:
                    attrs["num_outputs"] = len(outputs)
            elif values is not None:
                attrs[key] = tuple(values)
        if n.op == "Gelu" and self.opset < 20:
            self.gelu(inputs[0], outputs[0], attrs.get("approximate", "none"), n.name, n.outputs[0])
            return
        if act:
            if act not in FUSABLE_ACTIVATIONS:
                raise InvalidGraphError(f"node {n.name!r}: fused activation {act!r} cannot be exported")
            pre = self.fresh(f"{outputs[0]}_pre_{act.lower()}")
            self.emit(n.op, inputs, [pre], attrs, n.name)
            self.activation(act, pre, outputs[0], n.name, n.outputs[0])
            return
        self.emit(n.op, inputs, outputs, attrs, n.name)

    def activation(self, act: str, x: str, y: str, base: str, value: str) -> None:
        if act == "Gelu" and self.opset < 20:
            self.gelu(x, y, "none", base, value)
        else:
            self.emit(act, [x], [y], {}, self.fresh(f"{base}_{act.lower()}"))

    def gelu(self, x: str, y: str, approximate: str, base: str, value: str) -> None:
        """Gelu before opset 20: 0.5 x (1 + erf(x / sqrt 2)), or the tanh approximation."""
        dtype = self.g.type_of(value).dtype

        def step(op: str, *args: str, out: str | None = None) -> str:
            out = out or self.fresh(f"{base}_gelu_{op.lower()}")
            self.emit(op, args, [out], {}, self.fresh(f"{base}_gelu_{op.lower()}"))
            return out

        if approximate == "tanh":
            cube = step("Mul", x, step("Mul", x, x))
            inner = step("Add", x, step("Mul", cube, self.scalar(0.044715, dtype)))
            core = step("Tanh", step("Mul", inner, self.scalar(math.sqrt(2 / math.pi), dtype)))
        elif approximate == "none":
            core = step("Erf", step("Div", x, self.scalar(math.sqrt(2.0), dtype)))
        else:
            raise InvalidGraphError(f"node {base!r}: Gelu approximate={approximate!r} is not 'none' or 'tanh'")
        step("Mul", step("Mul", x, step("Add", core, self.scalar(1.0, dtype))), self.scalar(0.5, dtype), out=y)

    # ----- model --------------------------------------------------------------------------------
    def build(self) -> onnx.ModelProto:
        g = self.g
        for n in g.topological_order:
            self.export_node(n)
        for v, name in self.identities:
            self.emit("Identity", [self.r(v)], [name], {}, self.fresh(f"{name}_identity"))
        # filled in place: helper.make_model copies a finished GraphProto, weights and all
        model = onnx.ModelProto()
        graph = model.graph
        graph.name = g.name
        graph.node.extend(self.nodes)
        graph.input.extend(_value_info(v, g.types[v]) for v in g.inputs)
        graph.output.extend(_value_info(name, g.type_of(v)) for v, name in zip(g.outputs, g.output_names))
        outputs = set(g.output_names)
        graph.value_info.extend(_value_info(self.r(v), g.types[v]) for n in g.topological_order
                                for v in n.outputs if self.r(v) not in outputs)
        for k, arr in g.initializers.items():
            _fill_tensor(graph.initializer.add(), self.r(k), arr, self.external)
        for k, arr in self.consts.items():
            _fill_tensor(graph.initializer.add(), k, arr, self.external)
        opsets = [helper.make_opsetid(d, v) for d, v in sorted(self.domains.items())]
        model.opset_import.extend(opsets)
        model.producer_name = "xrl"
        model.ir_version = helper.find_min_ir_version_for(opsets, ignore_unknown=True)
        return model


def _fill_tensor(t: TensorProto, name: str, arr: np.ndarray, external: dict[str, np.ndarray] | None = None) -> None:
    """Write a weight straight into the graph's TensorProto: numpy_helper.from_array plus an append
    copies every byte twice more, which is seconds for a model of a few hundred MB. With `external`, a
    big weight is not copied at all: the tensor points at MEMORY_LOCATION and `external` holds the array."""
    arr = np.asarray(arr, dtype=np.dtype(arr.dtype).newbyteorder("<"))  # ONNX raw data is little-endian
    t.name = name
    t.data_type = DTYPE_TO_ONNX[TensorType.of(arr).dtype]
    t.dims.extend(arr.shape)
    if external is not None and _kept_apart(arr):
        _mark_external(t)
        external[name] = np.ascontiguousarray(arr)  # the graph's own array (weights are C-contiguous)
        return
    t.raw_data = arr.tobytes()  # C order, whatever the array's strides


def _value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, DTYPE_TO_ONNX[t.dtype], list(t.shape))


_SCHEMA_TO_ATTR = {int(k): k for k in (AttributeProto.FLOAT, AttributeProto.INT, AttributeProto.STRING,
                                       AttributeProto.TENSOR, AttributeProto.FLOATS, AttributeProto.INTS,
                                       AttributeProto.STRINGS, AttributeProto.TENSORS)}


def _make_attr(key: str, value, schema: onnx.defs.OpSchema | None, node: str) -> AttributeProto:
    """A python attribute value as ONNX, typed by the op's schema where there is one (so an int
    written where ONNX wants a float still exports right)."""
    want = None
    if schema is not None and key in schema.attributes:
        want = _SCHEMA_TO_ATTR.get(int(schema.attributes[key].type))
    if isinstance(value, np.ndarray):
        return helper.make_attribute(key, numpy_helper.from_array(value))
    if isinstance(value, tuple | list):
        items = list(value)
        if want == AttributeProto.TENSORS or (want is None and items and isinstance(items[0], np.ndarray)):
            return helper.make_attribute(key, [numpy_helper.from_array(x) for x in items],
                                         attr_type=AttributeProto.TENSORS)
        if want == AttributeProto.STRINGS or (want is None and items and all(isinstance(x, str) for x in items)):
            return helper.make_attribute(key, [str(x) for x in items], attr_type=AttributeProto.STRINGS)
        if want == AttributeProto.FLOATS or (want is None and any(isinstance(x, float) for x in items)):
            return helper.make_attribute(key, [float(x) for x in items], attr_type=AttributeProto.FLOATS)
        return helper.make_attribute(key, [int(x) for x in items], attr_type=AttributeProto.INTS)
    if isinstance(value, str):
        return helper.make_attribute(key, value, attr_type=AttributeProto.STRING)
    if isinstance(value, bool | int | np.integer):
        if want == AttributeProto.FLOAT:
            return helper.make_attribute(key, float(value), attr_type=AttributeProto.FLOAT)
        return helper.make_attribute(key, int(value), attr_type=AttributeProto.INT)
    if isinstance(value, float | np.floating):
        if want == AttributeProto.INT and float(value).is_integer():
            return helper.make_attribute(key, int(value), attr_type=AttributeProto.INT)
        return helper.make_attribute(key, float(value), attr_type=AttributeProto.FLOAT)
    raise InvalidGraphError(f"node {node!r}: attribute {key!r} holds a {type(value).__name__}, which ONNX "
                            f"cannot store")


# ===== writing =================================================================================
def save_onnx(model: onnx.ModelProto, path: str | os.PathLike,
              external: Mapping[str, np.ndarray] | None = None) -> Path:
    """Write `model` atomically (a temporary file in the same folder, then a rename): a failed or
    interrupted write never leaves a partial file. Weights past ~1.8 GB go to `<name>.<hash>.data`
    beside it, a name of their own per content, so the model and its weights change together: the
    model's rename is the one commit point. Temporary files a killed xrl left behind, and weight files
    no model at `path` refers to any more, are removed.

    `model` may be a head with its weights in `external` (`to_onnx(..., external=...)`): the file is the
    same model, written from the arrays as they are (no serialised copy of the model in memory)."""
    missing = [t.name for t in model.graph.initializer if in_memory(t) and t.name not in (external or {})]
    if missing:
        raise XrlError(f"cannot write the model: weight {missing[0]!r} is kept apart and was not given")
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"{path} is a directory; give a file path such as {path / 'model.onnx'}")
    folder = path.parent
    if not folder.is_dir():
        raise OutputPathError(f"cannot write {path}: folder {folder} does not exist; create it first")
    remove_stale_temporaries(path)
    try:
        weight_bytes = initializer_bytes(model)
        if weight_bytes > EXTERNAL_DATA_THRESHOLD:
            data_name = _save_external(model, path, external)
        else:
            write_atomic(path, _serialized(model, external))
            data_name = None
    except OSError as e:
        raise OutputPathError(f"cannot write {path} ({e.strerror or brief_error(e)}); check the folder is writable "
                              f"and has space") from e
    _remove_old_data(path, keep=data_name)
    return path


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _length_field(number: int, length: int) -> bytes:
    """The key and length of a length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(length)


_GRAPH_FIELD = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_INITIALIZER_FIELD = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
_RAW_DATA_FIELD = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number


def _serialized(model: onnx.ModelProto, external: Mapping[str, np.ndarray] | None) -> Iterator[bytes | memoryview]:
    """The model's protobuf bytes, in chunks: a head's kept-apart weights are written from their arrays.
    Protobuf merges a message given in parts (repeated fields append), so the model without initializers,
    then each initializer as a model holding only it, reads back as the model itself."""
    if not any(in_memory(t) for t in model.graph.initializer):
        yield model.SerializeToString()
        return
    head = onnx.ModelProto()
    _copy_fields(head, model, skip="graph")
    _copy_fields(head.graph, model.graph, skip="initializer")
    yield head.SerializeToString()
    del head
    for t in model.graph.initializer:
        if not in_memory(t):
            part = onnx.ModelProto()
            part.graph.initializer.add().CopyFrom(t)
            yield part.SerializeToString()
            continue
        arr = np.ascontiguousarray(external[t.name], dtype=external[t.name].dtype.newbyteorder("<"))
        raw = memoryview(arr.reshape(-1).view(np.uint8))
        fields = onnx.TensorProto()
        _copy_fields(fields, t, skip=("raw_data", "data_location", "external_data"))
        tensor = fields.SerializeToString() + _length_field(_RAW_DATA_FIELD, raw.nbytes)
        size = len(tensor) + raw.nbytes
        entry = _length_field(_INITIALIZER_FIELD, size)
        yield _length_field(_GRAPH_FIELD, len(entry) + size) + entry + tensor
        yield raw


def _copy_fields(dst, src, skip: str | Sequence[str] = ()) -> None:  # noqa: ANN001 - protobuf messages
    """Copy every field of `src` that is set into `dst`, except those named in `skip`."""
    skip = (skip,) if isinstance(skip, str) else tuple(skip)
    for field, value in src.ListFields():
        if field.name in skip:
            continue
        if field.is_repeated:
            getattr(dst, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def _remove_old_data(path: Path, keep: str | None) -> None:
    """Weight files of earlier writes to `path` (`<name>.data`, `<name>.<hash>.data`) that the model
    just written does not use: the model that used them has been replaced."""
    import re

    pattern = re.compile(re.escape(path.name) + r"(\.[0-9a-f]{12})?\.data")
    for p in path.parent.glob(f"{glob.escape(path.name)}*.data"):
        if p.name != keep and pattern.fullmatch(p.name):
            with contextlib.suppress(OSError):
                p.unlink()


def _save_external(model: onnx.ModelProto, path: Path, external: Mapping[str, np.ndarray] | None = None) -> str:
    """Big tensors' bytes to `<path>.<hash>.data`, the rest to `path`; returns the data file's name.
    The data file gets its final name before the model is replaced, and that name is new whenever the
    weights are, so a crash at any point leaves the old model with its own weights or the new model
    with its own. The model written is a new head (every field but the big tensors' bytes, which point
    at the data file); the caller's model is neither changed nor copied: protobuf cannot free a field it
    clears, so moving the bytes out and back would grow the caller's model by its weights on every save."""
    import hashlib

    digest = hashlib.blake2b(digest_size=6)
    head = onnx.ModelProto()
    _copy_fields(head, model, skip="graph")
    _copy_fields(head.graph, model.graph, skip="initializer")
    written: list[TensorProto] = []
    # the weights' temporary gets its final name (from their digest) when the block ends
    with atomic_write(path, suffix=".data.tmp") as pending:
        with pending.open("wb") as f:
            offset = 0
            for t in model.graph.initializer:
                out = head.graph.initializer.add()
                kept_apart = in_memory(t)
                if not kept_apart and (not t.HasField("raw_data") or t.data_location == TensorProto.EXTERNAL
                                       or tensor_bytes(t) < _EXTERNAL_MIN_TENSOR):
                    out.CopyFrom(t)
                    continue
                if kept_apart:  # the array's own bytes, little-endian as ONNX stores them
                    arr = external[t.name]
                    raw = memoryview(np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).reshape(-1)
                                     .view(np.uint8))
                else:
                    raw = t.raw_data  # one tensor's bytes at a time
                f.write(raw)
                digest.update(raw)
                _copy_fields(out, t, skip=("raw_data", "data_location", "external_data"))
                out.data_location = TensorProto.EXTERNAL
                for k, v in (("location", ""), ("offset", str(offset)), ("length", str(len(raw)))):
                    entry = out.external_data.add()
                    entry.key, entry.value = k, v
                written.append(out)
                offset += len(raw)  # a memoryview of bytes: its length is its bytes
                del raw
        data_name = f"{path.name}.{digest.hexdigest()}.data"
        for t in written:
            t.external_data[0].value = data_name
        try:
            head = head.SerializeToString()
        except Exception as e:  # still over protobuf's 2 GiB without the big weights
            raise OutputPathError(f"cannot write {path}: the model is too large to serialise even with its "
                                  f"weights outside ({brief_error(e)})") from e
        existed = (path.parent / data_name).exists()  # the same weights written before: the old model uses it
        pending.destination = path.parent / data_name  # data first: the model never points at missing bytes
    try:
        write_atomic(path, head)
    except BaseException:
        if not existed:  # no model refers to it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.parent / data_name)
        raise
    return data_name
