"""ONNX <-> IR, the codec: `load_onnx`/`from_onnx` (import), `to_onnx` (export).

Import pins the input shapes, folds every weight-only computation (onnx_fold), then maps each node
to the IR's canonical form: axes/split as attributes, Cast.to as a dtype name, shape-like inputs as
weights. Ops the IR does not know stay opaque, with their domain, attributes and inferred types; so
does an onnxruntime contrib op the IR knows in a form it does not (packed or past key/values, partial
rotary, ...): its types are the file's, and the rules never touch it.
Export is the inverse for a chosen opset (17 unless the graph needs newer): canonical attributes go
back to inputs where the opset wants them, and fused activations become their own nodes. Opaque
nodes of other domains (com.microsoft, ...) export under the domain versions the source model
imported (`Graph.domain_opsets`).
Beside it: `onnx_weights` (heads and their weights kept apart, the interning pool, malloc_trim) and
`onnx_write` (`save_onnx`, the atomic, streamed file writer).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path

import numpy as np
import onnx
from onnx import AttributeProto, NodeProto, TensorProto, TypeProto, helper, numpy_helper

from xrl.errors import ConfigError, DynamicShapeError, InvalidGraphError, ModelLoadError, XrlError
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
from xrl.frontends.onnx_weights import kept_apart, mark_external, shared_weight, with_placeholders
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


# ===== import ==================================================================================
def load_onnx(path: str | os.PathLike, input_shapes: Mapping[str, Sequence[int]] | None = None, *,
              name: str | None = None) -> Graph:
    """Read an .onnx file (with any external data beside it) into a validated Graph."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"{p}: no such file; check the path")
    if p.is_dir():
        raise ModelLoadError(f"{p} is a directory, not an ONNX file; pass the path of the .onnx file")
    head = read_model_head(p)
    if head is not None:  # each weight read alone into the array the IR keeps: no model holds them all
        return _import(head[0], input_shapes, name or p.stem, str(p), head[1])
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


def read_model_head(path: str | os.PathLike, like: Mapping[str, np.ndarray] | None = None
                    ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]] | None:
    """`onnx_weights.read_head` of a model file whose weights are all in it (the common export), else None (a
    file with external data, or one the reader does not walk: onnx.load reads it, and says what is wrong)."""
    from google.protobuf.message import DecodeError

    from xrl.frontends.onnx_weights import in_memory, read_head

    try:
        head, external = read_head(str(path), like)
    except (OSError, ValueError, DecodeError):
        return None
    if any(t.data_location == onnx.TensorProto.EXTERNAL and not in_memory(t) for t in head.graph.initializer) \
            or head.ir_version <= 0 or not head.HasField("graph"):
        return None
    return head, external


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
        model = with_placeholders(model, external)
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

    With `external` (a dict, filled here), weights of `onnx_weights.EXTERNAL_MIN_TENSOR` bytes and more are not copied
    into the model: their tensors keep dtype and dims and point at `onnx_weights.MEMORY_LOCATION`, and `external` maps
    their names to the graph's own arrays. Such a model (a "head") is what `save_onnx`, `from_onnx`,
    `xrl.frontends.verify` and the onnxruntime cost models take with its `external` arrays: the weights
    are never serialised in memory (a model's worth of bytes per export)."""
    return _Exporter(graph, _export_opset(graph, opset), external).build()


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
    if external is not None and kept_apart(arr):
        mark_external(t)
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
