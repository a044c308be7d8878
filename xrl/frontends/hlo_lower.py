"""HLO syntax tree -> xrl IR Graph.

The ENTRY computation is walked in order; called computations (`call`, `fusion`, `custom-call` with
`to_apply`/`calls`) are inlined, tuples and get-tuple-element are resolved away, and every other HLO
opcode lowers to ONNX-named IR ops (the tables below and the `_Lowerer._op_<opcode>` methods). An opcode
with no IR counterpart (sort, gather, while, ...) becomes an opaque node (domain "xla", op = the HLO
opcode, HLO attributes kept as strings) that keeps HLO's result types.

Three choices keep the graphs close to what an ONNX exporter would produce:
- `broadcast` is lazy (`_Bcast`): an elementwise consumer reads the source with numpy-style
  broadcasting (after a Reshape inserting size-1 dims where needed) instead of an Expand of the full
  tensor. Only other consumers materialise it (constant-folded when small).
- View ops on constants (reshape, transpose, convert, slice, broadcast, iota) fold at import, so a
  constant conv kernel in HWIO is stored as OIHW and `x @ C.T` reads a transposed weight.
- Chains of Reshape/Transpose collapse onto their source as they are built, and nodes no output
  needs are dropped at the end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from xrl.errors import ModelLoadError
from xrl.frontends.hlo_parse import (
    ArrayShape,
    Computation,
    Instruction,
    Module,
    Shape,
    TupleShape,
    attr_computations,
    attr_ints,
    attr_padding,
    attr_slices,
    attr_string,
    attr_window,
    literal_tokens,
)
from xrl.ir import Graph, Node, TensorType

XLA_DOMAIN = "xla"
FOLD_LIMIT = 1 << 14  # a broadcast constant up to this many elements is stored folded

DTYPES = {
    "pred": "bool", "s8": "int8", "s16": "int16", "s32": "int32", "s64": "int64", "u8": "uint8",
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
}
_UNARY = {"exponential": "Exp", "log": "Log", "sqrt": "Sqrt", "tanh": "Tanh", "logistic": "Sigmoid",
          "negate": "Neg", "abs": "Abs", "erf": "Erf"}
_BINARY = {"add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div", "maximum": "Max",
           "minimum": "Min", "power": "Pow"}
_COMPARE = {"EQ": "Equal", "LT": "Less", "GT": "Greater"}
_REDUCERS = {"add": "ReduceSum", "maximum": "ReduceMax", "minimum": "ReduceMin", "multiply": "ReduceProd"}
_POOLS = {"maximum": "MaxPool", "add": "AveragePool"}  # reduce-window; a sum is an average times the window size
_IDENTITY_OPS = ("copy", "opt-barrier", "optimization-barrier", "domain")
_DROPPED_ATTRS = ("metadata", "backend_config", "frontend_attributes", "sharding", "statistics_viz",
                  "control-predecessors")


def numpy_dtype(hlo_dtype: str) -> np.dtype:
    name = DTYPES[hlo_dtype]
    if name == "bfloat16":
        import ml_dtypes  # an onnx dependency; only bf16 constants need it

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


@dataclass(frozen=True, slots=True)
class _Bcast:
    """A broadcast not yet materialised: output dim `dims[i]` comes from `src` dim i (dims sorted)."""

    src: str
    dims: tuple[int, ...]
    shape: tuple[int, ...]


# What an HLO instruction lowers to: an IR value, a pending broadcast, or a tuple of those.
LValue = str | _Bcast | tuple["LValue", ...]


class _LowerError(Exception):
    def __init__(self, ins: Instruction, message: str) -> None:
        super().__init__(f"line {ins.line}: %{ins.name} ({ins.opcode}): {message}")


def lower_module(module: Module, name: str) -> Graph:
    """Lower a parsed module to a validated Graph; raises ModelLoadError naming the line at fault."""
    try:
        return _Lowerer(module).run(name)
    except _LowerError as e:
        raise ModelLoadError(str(e)) from None


class _Lowerer:
    def __init__(self, module: Module) -> None:
        self.module = module
        self.nodes: list[Node] = []
        self.types: dict[str, TensorType] = {}
        self.weights: dict[str, np.ndarray] = {}
        self.inputs: list[str] = []
        self.producer: dict[str, Node] = {}
        self._taken: set[str] = set()  # every value name given out
        self._pending: set[str] = set()  # names reserved for an instruction's result, not yet defined
        self._cache: dict[tuple, str] = {}  # (kind, args...) -> value: shared reshapes, constants
        self._sums: dict[str, tuple[str, tuple[int, ...]]] = {}  # ReduceSum output -> (input, axes)
        self._window_sums: dict[str, tuple[str, int]] = {}  # window sum -> (the average it was made of, window size)
        self._ins: Instruction | None = None  # the instruction being lowered, for error messages
        self._comps: list[Computation] = []  # computations being lowered (innermost last)
        self._shapes: dict[str, dict[str, Shape]] = {}  # computation -> instruction -> HLO shape

    # ----- driver -------------------------------------------------------------------------------
    def run(self, name: str) -> Graph:
        entry = self.module.entry
        env: dict[str, LValue] = {}
        params = entry.parameters
        if sorted(params) != list(range(len(params))):
            raise ModelLoadError(f"line {entry.line}: ENTRY parameters are numbered {sorted(params)}, "
                                 f"not 0..{len(params) - 1}")
        for i in range(len(params)):
            ins = params[i]
            self._ins = ins
            try:
                env[ins.name] = self._structure(ins.shape, ins.name, self._new_input)
            except ModelLoadError as e:
                raise _LowerError(ins, str(e)) from None
        result = self._lower_computation(entry, env, scope="")
        outputs = self._outputs(result)
        self._ins = None
        return self._graph(outputs, name)

    def _new_input(self, name: str, t: TensorType) -> str:
        name = self._claim(name)
        self.inputs.append(name)
        self.types[name] = t
        return name

    def _structure(self, shape: Shape, name: str, make: Callable[[str, TensorType], str]) -> LValue:
        """Build an LValue of `shape`'s structure, one `make(name, type)` per array leaf."""
        if isinstance(shape, TupleShape):
            return tuple(self._structure(s, f"{name}#{i}", make) for i, s in enumerate(shape.elements))
        return make(name, self._tensor_type(shape))

    def _lower_computation(self, comp: Computation, env: dict[str, LValue], scope: str) -> LValue:
        self._comps.append(comp)
        for ins in comp.instructions:
            if ins.param_index is not None:
                if ins.name not in env:
                    raise _LowerError(ins, f"computation {comp.name!r} has no argument {ins.param_index}")
                continue
            self._ins = ins
            try:
                env[ins.name] = self._lower(ins, env, scope)
            except (ModelLoadError, ValueError, IndexError, KeyError) as e:  # malformed attributes too
                raise _LowerError(ins, str(e)) from None
        self._comps.pop()
        return env[comp.root.name]

    def _lower(self, ins: Instruction, env: dict[str, LValue], scope: str) -> LValue:
        args: list[LValue] = []
        for o in ins.operands:
            if o not in env:
                raise _LowerError(ins, f"operand %{o} is not defined before it is used")
            args.append(env[o])
        name = self._fresh(scope + ins.name)
        op = ins.opcode
        if op in _UNARY:
            return self._unary(_UNARY[op], args[0], name)
        if op in _BINARY:
            return self._binary(ins, _BINARY[op], args, name)
        if op in _IDENTITY_OPS:
            return args[0] if len(args) == 1 else tuple(args)
        method = getattr(self, "_op_" + op.replace("-", "_"), None)
        if method is not None:
            result = method(ins, args, name, scope)
            if result is not None:
                return result
        return self._opaque(ins, args, name)

    def _outputs(self, result: LValue) -> list[str]:
        leaves = [self._full(v) for v in _leaves(result)]
        outputs: list[str] = []
        for v in leaves:
            if v in self.inputs or v in self.weights or v in outputs:
                v = self._emit("Identity", [v], self.types[v], f"{v}/out", cse=False)  # an output of its own
            outputs.append(v)
        return outputs

    def _graph(self, outputs: list[str], name: str) -> Graph:
        live = set(outputs)
        kept: list[Node] = []
        for n in reversed(self.nodes):  # dead-code elimination: emission order is topological
            if any(v in live for v in n.outputs):
                kept.append(n)
                live.update(v for v in n.inputs if v)
        kept.reverse()
        used = live | set(self.inputs)
        for n in kept:
            used.update(n.outputs)
        types = {k: t for k, t in self.types.items() if k in used}
        weights = {k: w for k, w in self.weights.items() if k in used}
        return Graph(kept, self.inputs, outputs, types, weights, name=name).validate()

    # ----- emission helpers ---------------------------------------------------------------------
    def _fresh(self, hint: str) -> str:
        """Reserve a value name not used yet (HLO names stay as they are where they can)."""
        name, i = hint, 0
        while name in self._taken:
            i += 1
            name = f"{hint}_{i}"
        self._taken.add(name)
        self._pending.add(name)
        return name

    def _claim(self, name: str) -> str:
        """`name` if it is reserved and still undefined, else a fresh name like it."""
        if name not in self._pending:
            name = self._fresh(name)
        self._pending.discard(name)
        return name

    def _emit(self, op: str, inputs: list[str], out: TensorType, name: str, domain: str = "", *,
              cse: bool = True, **attrs) -> str:
        node = Node("", op, tuple(inputs), ("",), attrs, domain)
        key = ("node", op, domain, node.inputs, node.attr_key())
        if cse and key in self._cache and self.types[self._cache[key]] == out:
            return self._cache[key]  # the same op on the same values: reuse it (jax repeats itself)
        name = self._claim(name)
        node = Node(name, op, tuple(inputs), (name,), attrs, domain)
        self._cache.setdefault(key, name)
        self.nodes.append(node)
        self.producer[name] = node
        self.types[name] = out
        return name

    def _weight(self, array: np.ndarray, hint: str) -> str:
        """An initializer; small arrays are shared by content."""
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)  # (never on 0-d arrays: it makes them 1-d)
        key = None
        if array.size <= 1024:
            key = ("weight", array.dtype.str, array.shape, array.tobytes())
            if key in self._cache:
                return self._cache[key]
        name = self._claim(hint)
        self.weights[name] = array
        self.types[name] = TensorType.of(array)
        if key is not None:
            self._cache[key] = name
        return name

    def _ints(self, values, hint: str) -> str:
        """An int64 1-D initializer for a shape-like input, shared by content."""
        return self._weight(np.asarray(list(values), dtype=np.int64), "const/" + hint)

    def _tensor_type(self, shape: Shape) -> TensorType:
        if not isinstance(shape, ArrayShape):
            raise ModelLoadError(f"expected an array shape, got the tuple {shape}")
        if shape.dtype not in DTYPES:
            raise ModelLoadError(f"element type {shape.dtype} has no counterpart in xrl's IR "
                                 f"(supported: {', '.join(DTYPES)})")
        return TensorType(shape.dims, DTYPES[shape.dtype])

    def _shape(self, v: LValue) -> tuple[int, ...]:
        return v.shape if isinstance(v, _Bcast) else self.types[self._array(v)].shape

    def _array(self, v: LValue) -> str | _Bcast:
        if isinstance(v, tuple):
            raise _LowerError(self._ins, "a tuple is used where an array is expected")  # type: ignore[arg-type]
        return v

    def _dtype(self, v: LValue) -> str:
        v = self._array(v)
        return self.types[v.src if isinstance(v, _Bcast) else v].dtype

    def _const(self, v: LValue) -> np.ndarray | None:
        """The value of a constant operand (its compact form for a pending broadcast)."""
        v = self._array(v)
        src = v.src if isinstance(v, _Bcast) else v
        return self.weights.get(src)

    # ----- broadcasts ---------------------------------------------------------------------------
    def _compact(self, v: LValue) -> str:
        """A value that broadcasts numpy-style to v's shape: a pending broadcast's source with
        size-1 dims inserted after its first kept dim (leading dims are left to broadcasting)."""
        v = self._array(v)
        if not isinstance(v, _Bcast):
            return v
        if not v.dims:
            return v.src
        src_shape = self.types[v.src].shape
        compact = [1] * (len(v.shape) - v.dims[0])
        for i, d in enumerate(v.dims):
            compact[d - v.dims[0]] = src_shape[i]
        return self._broadcastable(v.src, _strip_ones(tuple(compact)), len(v.shape), v.src + "/bcast")

    def _broadcastable(self, v: str, target: tuple[int, ...], rank: int, hint: str) -> str:
        """A value equal to v reshaped to `target` up to leading 1s (which broadcasting implies) and
        of rank <= `rank`: v itself, the input of the Reshape that made v, or a reshape of v made
        before, else a new one."""
        root = v
        prod = self.producer.get(v)
        if prod is not None and prod.op == "Reshape":
            root = prod.inputs[0]
        for cand in (root, v):  # the Reshape's input first: then the Reshape may die
            shape = self.types[cand].shape
            if _strip_ones(shape) == target and len(shape) <= rank:
                return cand
        for k in range(1, rank - len(target) + 1):
            made = self._cache.get(("reshape", root, (1,) * k + target))
            if made is not None:
                return made
        return self._reshape(v, target, hint)

    def _full(self, v: LValue) -> str:
        """v as a tensor of its full shape (an Expand, or a folded constant, for a pending broadcast)."""
        v = self._array(v)
        if not isinstance(v, _Bcast):
            return v
        key = ("full", v.src, v.dims, v.shape)
        if key in self._cache:
            return self._cache[key]
        compact = self._compact(v)
        const = self.weights.get(compact)
        t = self.types[compact].with_shape(v.shape)
        if const is not None and t.numel <= FOLD_LIMIT:
            out = self._weight(np.broadcast_to(const, v.shape), v.src + "/full")
        else:
            out = self._emit("Expand", [compact, self._ints(v.shape, "shape")], t, v.src + "/expand")
        self._cache[key] = out
        return out

    def _operands(self, args: list[LValue], shape: tuple[int, ...]) -> list[str]:
        """Elementwise operands in compact form, expanding one when none carries the full shape."""
        vals = [self._unprefixed(self._compact(a)) for a in args]
        if _broadcast(*(self.types[v].shape for v in vals)) != shape:
            i = next((i for i, a in enumerate(args) if isinstance(a, _Bcast)), None)
            if i is None:
                raise ModelLoadError(f"operand shapes {[self.types[v].shape for v in vals]} differ from {shape}")
            vals[i] = self._full(args[i])
        return vals

    def _unprefixed(self, v: str) -> str:
        """v without the size-1 dims a Reshape prepended (broadcasting prepends them anyway)."""
        shape = self.types[v].shape
        return self._broadcastable(v, _strip_ones(shape), len(shape), v)

    # ----- shape ops with folding and chain collapse --------------------------------------------
    def _reshape(self, v: str, shape: tuple[int, ...], hint: str) -> str:
        t = self.types[v]
        if t.shape == shape:
            return v
        prod = self.producer.get(v)
        if prod is not None and prod.op == "Reshape":  # reshape(reshape(x)) = reshape(x)
            return self._reshape(prod.inputs[0], shape, hint)
        key = ("reshape", v, shape)
        if key not in self._cache:
            if v in self.weights:
                self._cache[key] = self._weight(self.weights[v].reshape(shape), hint)
            else:
                self._cache[key] = self._emit("Reshape", [v, self._ints(shape, "shape")], t.with_shape(shape), hint)
        return self._cache[key]

    def _transpose(self, v: str, perm: tuple[int, ...], hint: str) -> str:
        if perm == tuple(range(len(perm))):
            return v
        prod = self.producer.get(v)
        if prod is not None and prod.op == "Transpose":  # transpose(transpose(x, p), q) = transpose(x, p[q])
            inner = prod.attrs["perm"]
            return self._transpose(prod.inputs[0], tuple(inner[p] for p in perm), hint)
        key = ("transpose", v, perm)
        if key not in self._cache:
            t = self.types[v]
            if v in self.weights:
                self._cache[key] = self._weight(self.weights[v].transpose(perm), hint)
            else:
                self._cache[key] = self._emit("Transpose", [v], t.with_shape([t.shape[p] for p in perm]), hint,
                                              perm=perm)
        return self._cache[key]

    def _cast(self, v: str, dtype: str, hint: str) -> str:
        t = self.types[v]
        if t.dtype == dtype:
            return v
        if v in self.weights:
            return self._weight(self.weights[v].astype(numpy_dtype(_hlo_name(dtype))), hint)
        return self._emit("Cast", [v], TensorType(t.shape, dtype), hint, to=dtype)

    # ----- elementwise --------------------------------------------------------------------------
    def _unary(self, op: str, x: LValue, name: str) -> LValue:
        x = self._array(x)
        if isinstance(x, _Bcast):  # unary ops commute with broadcasting: apply to the source
            return _Bcast(self._unary(op, x.src, name), x.dims, x.shape)  # type: ignore[arg-type]
        return self._emit(op, [x], self.types[x], name)

    def _binary(self, ins: Instruction, op: str, args: list[LValue], name: str) -> LValue:
        out_t = self._tensor_type(ins.shape)
        if op in ("Max", "Min") and _is_float(out_t.dtype):
            for i in (0, 1):
                c, other = self._const(args[i]), args[1 - i]
                if c is None or not isinstance(other, str) or self.types[other] != out_t:
                    continue
                if np.all(c == (-math.inf if op == "Max" else math.inf)):
                    return other  # max(x, -inf) = x (jax's softmax guard), NaN included
                if op == "Max" and not np.any(c):
                    return self._emit("Relu", [other], out_t, name)  # max(x, 0)
        if op in ("Div", "Mul") and _is_float(out_t.dtype):
            for total, count in [args, args[::-1]] if op == "Mul" else [args]:
                mean = self._mean(op, total, count, name)
                if mean is None:
                    mean = self._window_mean(op, total, count, out_t)
                if mean is not None:
                    return mean
        a, b = self._operands(args, out_t.shape)
        return self._emit(op, [a, b], out_t, name)

    def _mean(self, op: str, s: LValue, count: LValue, name: str) -> str | None:
        """ReduceSum(x) / N (or * 1/N) with N the reduced element count -> ReduceMean."""
        c = self._const(count)
        if not isinstance(s, str) or c is None or c.size == 0:
            return None
        prod = self.producer.get(s)
        total = prod.inputs[0] if prod is not None and prod.op == "Reshape" else s  # keepdims via a reshape
        if total not in self._sums:
            return None
        x, axes = self._sums[total]
        n = math.prod(self.types[x].shape[a] for a in axes)
        want = np.asarray(n if op == "Div" else 1.0 / n).astype(c.dtype)
        if not np.all(c == want):
            return None
        if total == s:
            return self._emit("ReduceMean", [x], self.types[s], name, axes=axes, keepdims=0)
        mean = self._emit("ReduceMean", [x], self.types[total], name + "/mean", axes=axes, keepdims=0)
        return self._reshape(mean, self.types[s].shape, name)

    def _window_mean(self, op: str, s: LValue, count: LValue, out_t: TensorType) -> str | None:
        """A window sum (AveragePool * K) / K (or * 1/K) -> the AveragePool itself."""
        c = self._const(count)
        if not isinstance(s, str) or s not in self._window_sums or c is None or c.size == 0:
            return None
        avg, k = self._window_sums[s]
        want = np.asarray(k if op == "Div" else 1.0 / k).astype(c.dtype)
        if not np.all(c == want) or self.types[avg] != out_t:
            return None
        return avg

    # pred (bool) logic; on integers HLO's and/or/not/xor are bitwise and stay opaque
    def _op_and(self, ins: Instruction, args, name, scope) -> LValue | None:
        return self._logical(ins, "And", args, name)

    def _op_or(self, ins: Instruction, args, name, scope) -> LValue | None:
        return self._logical(ins, "Or", args, name)

    def _op_not(self, ins: Instruction, args, name, scope) -> LValue | None:
        if self._dtype(args[0]) != "bool":
            return None
        return self._unary("Not", args[0], name)

    def _op_xor(self, ins: Instruction, args, name, scope) -> LValue | None:
        if len(args) != 2 or any(self._dtype(a) != "bool" for a in args):
            return None
        out_t = self._tensor_type(ins.shape)
        a, b = self._operands(args, out_t.shape)
        same = self._emit("Equal", [a, b], out_t, name + "/eq")  # a xor b = not (a == b)
        return self._emit("Not", [same], out_t, name)

    def _logical(self, ins: Instruction, op: str, args: list[LValue], name: str) -> LValue | None:
        if len(args) != 2 or any(self._dtype(a) != "bool" for a in args):
            return None
        return self._binary(ins, op, args, name)

    def _op_compare(self, ins: Instruction, args, name, scope) -> str | None:
        direction = ins.attrs.get("direction", "")
        if ins.attrs.get("type") == "TOTALORDER" and _is_float(self._dtype(args[0])):
            return None  # total order differs from IEEE comparison on NaN and -0: keep it opaque
        shape = self._shape(args[0])
        a, b = self._operands(args, shape)
        out = TensorType(shape, "bool")
        if direction in _COMPARE:
            return self._emit(_COMPARE[direction], [a, b], out, name)
        if direction == "NE":  # not(a == b), with no Not op: (a == b) == false
            eq = self._emit("Equal", [a, b], out, name + "/eq")
            return self._emit("Equal", [eq, self._weight(np.array(False), "const/false")], out, name)
        if direction in ("LE", "GE"):
            # a <= b  <=>  (a < b ? b : a) == b, exact for NaN too, and every op here runs in
            # onnxruntime (Where has no bool kernel there, so no `(a < b) or (a == b)` via Where).
            strict = self._emit("Less" if direction == "LE" else "Greater", [a, b], out, name + "/strict")
            pick = self._emit("Where", [strict, b, a], TensorType(shape, self.types[a].dtype), name + "/pick")
            return self._emit("Equal", [pick, b], out, name)
        return None

    def _op_select(self, ins: Instruction, args, name, scope) -> str:
        shape = self._shape(args[1])
        p, a, b = self._operands(args, shape)
        return self._emit("Where", [p, a, b], TensorType(shape, self.types[a].dtype), name)

    def _op_clamp(self, ins: Instruction, args, name, scope) -> str:
        lo, x, hi = args
        shape = self._shape(x)
        t = self._tensor_type(ins.shape)
        lo_c, hi_c = self._compact(lo), self._compact(hi)
        if self.types[lo_c].shape == () and self.types[hi_c].shape == () and isinstance(x, str):
            return self._emit("Clip", [x, lo_c, hi_c], t, name)
        a, b = self._operands([x, hi], shape)
        upper = self._emit("Min", [a, b], t, name + "/min")
        a, b = self._operands([upper, lo], shape)
        return self._emit("Max", [a, b], t, name)

    def _op_convert(self, ins: Instruction, args, name, scope) -> LValue:
        x = self._array(args[0])
        dtype = self._tensor_type(ins.shape).dtype
        if isinstance(x, _Bcast):
            return _Bcast(self._cast(x.src, dtype, name), x.dims, x.shape)
        return self._cast(x, dtype, name)

    def _op_rsqrt(self, ins: Instruction, args, name, scope) -> LValue:
        return self._unary("Reciprocal", self._unary("Sqrt", args[0], name + "/sqrt"), name)

    # ----- constants and shapes -----------------------------------------------------------------
    def _op_constant(self, ins: Instruction, args, name, scope) -> LValue | None:
        if not isinstance(ins.shape, ArrayShape):
            return None  # a tuple literal: rare enough to keep opaque
        t = self._tensor_type(ins.shape)
        tokens = literal_tokens(ins.literal or "")
        if tokens is None:
            return None  # elided `{...}`: the value is unknown, keep the node opaque with its type
        if len(tokens) != t.numel:
            raise _LowerError(ins, f"the literal has {len(tokens)} values but the shape {ins.shape} needs {t.numel}")
        dtype = numpy_dtype(ins.shape.dtype)
        if t.dtype == "bool":
            values = np.array([tok in ("true", "1") for tok in tokens], dtype=bool)
        elif t.dtype.startswith(("float", "bfloat")):
            values = np.array([float(tok.split("(")[0]) for tok in tokens], dtype=np.float64).astype(dtype)
        else:
            values = np.array([int(tok) for tok in tokens], dtype=dtype)
        return self._weight(values.reshape(t.shape), name)

    def _op_iota(self, ins: Instruction, args, name, scope) -> LValue:
        t = self._tensor_type(ins.shape)
        dim = int(ins.attrs.get("iota_dimension", "0"))
        ramp = self._weight(np.arange(t.shape[dim]).astype(numpy_dtype(ins.shape.dtype)), name)
        return ramp if t.rank == 1 else _Bcast(ramp, (dim,), t.shape)

    def _op_broadcast(self, ins: Instruction, args, name, scope) -> LValue:
        x = self._array(args[0])
        shape = self._tensor_type(ins.shape).shape
        dims = attr_ints(ins.attrs.get("dimensions", "{}"))
        if isinstance(x, _Bcast):  # broadcast(broadcast(s)): compose the dimension maps
            x, dims = x.src, tuple(dims[d] for d in x.dims)
        order = tuple(sorted(range(len(dims)), key=lambda i: dims[i]))
        x = self._transpose(x, order, name + "/perm")
        dims = tuple(sorted(dims))
        if dims == tuple(range(len(shape))) and self.types[x].shape == shape:
            return x
        return _Bcast(x, dims, shape)

    def _op_reshape(self, ins: Instruction, args, name, scope) -> LValue:
        x = self._array(args[0])
        shape = self._tensor_type(ins.shape).shape
        if isinstance(x, _Bcast) and not x.dims:
            return _Bcast(x.src, (), shape)  # a scalar broadcast stays one
        return self._reshape(self._full(x), shape, name)

    def _op_bitcast(self, ins: Instruction, args, name, scope) -> LValue | None:
        # Same bytes, new logical shape: read the input in its physical (major-to-minor) order,
        # reshape, and read the result back through the output's layout.
        x = self._full(args[0])
        operand = self._operand_shape(ins, 0)
        out = ins.shape
        if not isinstance(out, ArrayShape) or operand is None or DTYPES.get(out.dtype) != self.types[x].dtype:
            return None
        in_major = _major_to_minor(operand)
        out_major = _major_to_minor(out)
        phys = self._transpose(x, in_major, name + "/phys")
        flat = self._reshape(phys, tuple(out.dims[d] for d in out_major), name + "/reshape")
        return self._transpose(flat, tuple(np.argsort(out_major).tolist()), name)

    def _op_transpose(self, ins: Instruction, args, name, scope) -> LValue:
        perm = attr_ints(ins.attrs.get("dimensions", "{}"))
        x = self._array(args[0])
        if isinstance(x, _Bcast) and not x.dims:
            return _Bcast(x.src, (), self._tensor_type(ins.shape).shape)
        return self._transpose(self._full(x), perm, name)

    def _op_slice(self, ins: Instruction, args, name, scope) -> LValue:
        x = self._full(args[0])
        shape = self.types[x].shape
        spec = attr_slices(ins.attrs.get("slice", ""))
        if len(spec) != len(shape):
            raise _LowerError(ins, f"slice={ins.attrs.get('slice')} does not fit rank {len(shape)}")
        axes = [i for i, (s, e, st) in enumerate(spec) if (s, e, st) != (0, shape[i], 1)]
        if not axes:
            return x
        if x in self.weights:
            return self._weight(self.weights[x][tuple(slice(*s) for s in spec)], name)
        inputs = [x, self._ints([spec[a][0] for a in axes], "starts"), self._ints([spec[a][1] for a in axes], "ends"),
                  self._ints(axes, "axes")]
        if any(spec[a][2] != 1 for a in axes):
            inputs.append(self._ints([spec[a][2] for a in axes], "steps"))
        return self._emit("Slice", inputs, self._tensor_type(ins.shape), name)

    def _op_reverse(self, ins: Instruction, args, name, scope) -> LValue:
        x = self._full(args[0])
        axes = attr_ints(ins.attrs.get("dimensions", "{}"))
        if not axes:
            return x
        if x in self.weights:
            return self._weight(np.flip(self.weights[x], axes), name)
        minus_one, int_min = [-1] * len(axes), [np.iinfo(np.int64).min] * len(axes)
        inputs = [x, self._ints(minus_one, "starts"), self._ints(int_min, "ends"), self._ints(axes, "axes"),
                  self._ints(minus_one, "steps")]
        return self._emit("Slice", inputs, self.types[x], name)

    def _op_concatenate(self, ins: Instruction, args, name, scope) -> LValue:
        parts = [self._full(a) for a in args]
        if len(parts) == 1:
            return parts[0]
        axis = attr_ints(ins.attrs.get("dimensions", "{0}"))[0]
        if all(p in self.weights for p in parts):
            return self._weight(np.concatenate([self.weights[p] for p in parts], axis=axis), name)
        return self._emit("Concat", parts, self._tensor_type(ins.shape), name, axis=axis)

    def _op_pad(self, ins: Instruction, args, name, scope) -> LValue | None:
        x = self._full(args[0])
        value = self._compact(args[1])
        padding = attr_padding(ins.attrs.get("padding", ""))
        if any(p[2] for p in padding) or self.types[value].shape != ():
            return None  # interior (dilating) padding has no ONNX Pad counterpart
        if not any(p[0] or p[1] for p in padding):
            return x
        pads = [p[0] for p in padding] + [p[1] for p in padding]
        return self._emit("Pad", [x, self._ints(pads, "pads"), value], self._tensor_type(ins.shape), name,
                          mode="constant")

    # ----- tuples and calls ---------------------------------------------------------------------
    def _op_tuple(self, ins: Instruction, args, name, scope) -> LValue:
        return tuple(args)

    def _op_get_tuple_element(self, ins: Instruction, args, name, scope) -> LValue:
        t = args[0]
        index = int(ins.attrs.get("index", "-1"))
        if not isinstance(t, tuple) or not 0 <= index < len(t):
            raise _LowerError(ins, f"index={index} does not select an element of its operand")
        return t[index]

    def _op_add_dependency(self, ins: Instruction, args, name, scope) -> LValue:
        return args[0]

    def _call(self, ins: Instruction, args, name, scope) -> LValue | None:
        key = "to_apply" if "to_apply" in ins.attrs else "calls"
        called = attr_computations(ins.attrs.get(key, ""))
        if len(called) != 1:
            return None
        comp = self._computation(ins, called[0])
        params = comp.parameters
        if sorted(params) != list(range(len(args))):
            raise _LowerError(ins, f"passes {len(args)} operands to {comp.name!r}, which takes {len(params)}")
        env: dict[str, LValue] = {params[i].name: a for i, a in enumerate(args)}
        return self._lower_computation(comp, env, scope=f"{name}/")

    _op_call = _call
    _op_fusion = _call

    def _op_custom_call(self, ins: Instruction, args, name, scope) -> LValue | None:
        target = attr_string(ins.attrs.get("custom_call_target", ""))
        if target == "Sharding" and len(args) == 1:
            return args[0]
        if "to_apply" in ins.attrs or "calls" in ins.attrs:
            return self._call(ins, args, name, scope)
        return None

    def _computation(self, ins: Instruction, name: str) -> Computation:
        comp = self.module.computations.get(name)
        if comp is None:
            raise _LowerError(ins, f"calls computation {name!r}, which the module does not define")
        return comp

    # ----- compute ------------------------------------------------------------------------------
    def _op_dot(self, ins: Instruction, args, name, scope) -> LValue:
        out_t = self._tensor_type(ins.shape)
        lhs = self._cast(self._full(args[0]), out_t.dtype, name + "/lhs")
        rhs = self._cast(self._full(args[1]), out_t.dtype, name + "/rhs")
        ls, rs = self.types[lhs].shape, self.types[rhs].shape
        dims = {k: attr_ints(ins.attrs.get(k, "{}")) for k in
                ("lhs_batch_dims", "lhs_contracting_dims", "rhs_batch_dims", "rhs_contracting_dims")}
        lb, lc, rb, rc = dims.values()
        lf = tuple(d for d in range(len(ls)) if d not in lb + lc)
        rf = tuple(d for d in range(len(rs)) if d not in rb + rc)
        if not lb and len(lc) == 1 and lc[0] == len(ls) - 1 and len(rc) == 1 and len(rf) <= 1:
            # x[..., K] @ W[K, N] (W maybe stored [N, K]): MatMul broadcasts x's leading dims itself.
            rhs = self._transpose(rhs, rc + rf, name + "/rhs_t")
            return self._emit("MatMul", [lhs, rhs], out_t, name)
        batch = tuple(ls[d] for d in lb)
        m, k, n = (math.prod(ls[d] for d in lf), math.prod(ls[d] for d in lc), math.prod(rs[d] for d in rf))
        a = self._reshape(self._transpose(lhs, lb + lf + lc, name + "/lhs_t"), (*batch, m, k), name + "/lhs_2d")
        b = self._reshape(self._transpose(rhs, rb + rc + rf, name + "/rhs_t"), (*batch, k, n), name + "/rhs_2d")
        mm_shape = (*batch, m, n)
        if mm_shape == out_t.shape:
            return self._emit("MatMul", [a, b], out_t, name)
        mm = self._emit("MatMul", [a, b], out_t.with_shape(mm_shape), name + "/matmul")
        return self._reshape(mm, out_t.shape, name)

    def _op_convolution(self, ins: Instruction, args, name, scope) -> LValue | None:
        labels = ins.attrs.get("dim_labels", "")
        if "->" not in labels or "_" not in labels.split("->")[0]:
            return None
        lhs_l, rest = labels.split("_", 1)
        rhs_l, out_l = rest.split("->")
        nsp = len(lhs_l) - 2
        w = attr_window(ins.attrs.get("window", "{}"), nsp)
        if (int(ins.attrs.get("batch_group_count", "1")) != 1 or any(d != 1 for d in w.lhs_dilate)
                or any(w.reversal) or any(p < 0 for pad in w.pad for p in pad)):
            return None  # transposed or reversed convolutions and cropping pads: no plain Conv
        out_t = self._tensor_type(ins.shape)
        x = self._cast(self._full(args[0]), out_t.dtype, name + "/x")
        k = self._cast(self._full(args[1]), out_t.dtype, name + "/w")
        spatial = [str(i) for i in range(nsp)]
        x = self._transpose(x, tuple(lhs_l.index(c) for c in ["b", "f", *spatial]), name + "/nchw")
        k = self._transpose(k, tuple(rhs_l.index(c) for c in ["o", "i", *spatial]), name + "/oihw")
        to_out = tuple(["b", "f", *spatial].index(c) for c in out_l)  # NCHW dim of each output dim
        nchw_shape = [0] * len(out_l)
        for j, d in enumerate(to_out):
            nchw_shape[d] = out_t.shape[j]
        attrs = dict(kernel_shape=tuple(self.types[k].shape[2:]), strides=w.stride,
                     pads=tuple(p[0] for p in w.pad) + tuple(p[1] for p in w.pad), dilations=w.rhs_dilate,
                     group=int(ins.attrs.get("feature_group_count", "1")))
        if to_out == tuple(range(len(to_out))):
            return self._emit("Conv", [x, k], out_t, name, **attrs)
        y = self._emit("Conv", [x, k], out_t.with_shape(nchw_shape), name + "/conv", **attrs)
        return self._transpose(y, to_out, name)

    # ----- reductions ---------------------------------------------------------------------------
    def _reducer(self, ins: Instruction) -> str | None:
        """The binary op a reduction's `to_apply` computes ("add", "maximum", ...), if that is all it does."""
        called = attr_computations(ins.attrs.get("to_apply", ""))
        if len(called) != 1:
            return None
        comp = self._computation(ins, called[0])
        params = comp.parameters
        root = comp.root
        if len(params) != 2 or len(comp.instructions) != 3 or set(root.operands) != {params[0].name, params[1].name}:
            return None
        return root.opcode

    def _op_reduce(self, ins: Instruction, args, name, scope) -> LValue | None:
        if len(args) != 2 or not isinstance(ins.shape, ArrayShape):
            return None  # a variadic reduce (e.g. argmax) stays opaque
        kind = self._reducer(ins)
        x, init = self._full(args[0]), self._compact(args[1])
        t = self.types[x]
        if kind not in _REDUCERS or t.dtype == "bool" or self.types[init].shape != ():
            return None
        out_t = self._tensor_type(ins.shape)
        axes = tuple(sorted(attr_ints(ins.attrs.get("dimensions", "{}"))))
        if axes:
            reduced = self._emit(_REDUCERS[kind], [x], out_t, name if _is_identity(kind, self.weights.get(init))
                                 else name + "/reduce", axes=axes, keepdims=0)
            if kind == "add":
                self._sums[reduced] = (x, axes)
        else:
            reduced = x
        if _is_identity(kind, self.weights.get(init)):
            return reduced
        return self._emit(_BINARY[kind], [reduced, init], out_t, name)  # fold a non-neutral init in

    def _op_reduce_window(self, ins: Instruction, args, name, scope) -> LValue | None:
        """A max or a sum over windows of a float tensor -> MaxPool, or AveragePool (counting the zero
        padding) times the window size. The untouched dims (batch, channels) go first by a Transpose
        when they are not (NHWC), and are merged into one (or made up, as size-1 dims) by a Reshape when
        there are not exactly two of them (a cumulative sum over one axis). Windows with base dilation,
        cropping pads, pads as wide as the window (onnxruntime refuses them), more than 3 pooled dims,
        a non-neutral init, or (for sums) window dilation stay opaque."""
        if len(args) != 2:
            return None
        kind = self._reducer(ins)
        if kind not in _POOLS:
            return None
        x, init = self._full(args[0]), self.weights.get(self._compact(args[1]))
        t = self.types[x]
        if init is None or not _is_identity(kind, init) or not _is_float(t.dtype):
            return None
        w = attr_window(ins.attrs.get("window", "{}"), t.rank)
        if any(d != 1 for d in w.lhs_dilate) or any(p < 0 for pad in w.pad for p in pad):
            return None
        pooled = [d for d in range(t.rank) if w.size[d] != 1 or w.stride[d] != 1 or w.pad[d] != (0, 0)]
        kept = [d for d in range(t.rank) if d not in pooled]
        if not 1 <= len(pooled) <= 3 or any(max(w.pad[d]) >= w.size[d] for d in pooled):
            return None
        if kind == "add" and any(w.rhs_dilate[d] != 1 for d in pooled):
            return None  # the torch executor has no dilated AveragePool
        if kind == "maximum" and len(kept) != 2:
            return None
        out_t = self._tensor_type(ins.shape)
        perm = tuple(kept + pooled)
        xp = self._transpose(x, perm, name + "/nchw")
        kept_shape = tuple(t.shape[d] for d in kept)
        merged = len(kept) != 2
        if merged:  # (..., pooled dims) -> (1, all kept dims as channels, pooled dims)
            xp = self._reshape(xp, (1, math.prod(kept_shape), *(t.shape[d] for d in pooled)), name + "/nc")
        attrs = dict(kernel_shape=tuple(w.size[d] for d in pooled), strides=tuple(w.stride[d] for d in pooled),
                     pads=tuple(w.pad[d][0] for d in pooled) + tuple(w.pad[d][1] for d in pooled))
        if kind == "maximum":
            attrs["dilations"] = tuple(w.rhs_dilate[d] for d in pooled)
        else:
            attrs["count_include_pad"] = 1
        pool_out = [out_t.shape[d] for d in perm]
        pool_shape = (1, math.prod(kept_shape), *pool_out[len(kept):]) if merged else tuple(pool_out)
        plain = perm == tuple(range(t.rank)) and not merged
        op = _POOLS[kind]
        y = self._emit(op, [xp], out_t if plain else out_t.with_shape(pool_shape),
                       name if plain and kind == "maximum" else name + "/pool", **attrs)
        if merged:
            y = self._reshape(y, tuple(pool_out), name + "/unmerge")
        y = self._transpose(y, tuple(np.argsort(perm).tolist()), name if kind == "maximum" else name + "/avg")
        if kind == "maximum":
            return y
        size = math.prod(w.size[d] for d in pooled)
        total = self._emit("Mul", [y, self._weight(np.array(size, dtype=numpy_dtype(_hlo_name(t.dtype))),
                                                   "const/window_size")], out_t, name)
        self._window_sums[total] = (y, size)
        return total

    # ----- everything else ----------------------------------------------------------------------
    def _opaque(self, ins: Instruction, args: list[LValue], name: str) -> LValue:
        inputs = [self._full(v) for a in args for v in _leaves(a)]
        leaves = _shape_leaves(ins.shape, name)
        outs = [(n if len(leaves) > 1 else name, self._tensor_type(s)) for n, s in leaves]
        attrs = {k: v for k, v in ins.attrs.items() if k not in _DROPPED_ATTRS}
        if ins.literal is not None:
            attrs["literal"] = ins.literal
        outs = [(self._claim(n), t) for n, t in outs]
        node = Node(name, ins.opcode, tuple(inputs), tuple(n for n, _ in outs), attrs, XLA_DOMAIN)
        self.nodes.append(node)
        for n, t in outs:
            self.types[n] = t
            self.producer[n] = node
        it = iter(n for n, _ in outs)
        return _rebuild(ins.shape, it) if isinstance(ins.shape, TupleShape) else outs[0][0]

    def _operand_shape(self, ins: Instruction, i: int) -> ArrayShape | None:
        """The HLO shape (with layout) of operand i, from the instruction that defines it."""
        comp = self._comps[-1]
        if comp.name not in self._shapes:
            self._shapes[comp.name] = {other.name: other.shape for other in comp.instructions}
        shape = self._shapes[comp.name].get(ins.operands[i])
        return shape if isinstance(shape, ArrayShape) else None


# ----- small pure helpers ------------------------------------------------------------------------
def _leaves(v: LValue) -> list[str | _Bcast]:
    if isinstance(v, tuple):
        return [leaf for x in v for leaf in _leaves(x)]
    return [v]


def _shape_leaves(shape: Shape, name: str) -> list[tuple[str, ArrayShape]]:
    if isinstance(shape, TupleShape):
        return [leaf for i, s in enumerate(shape.elements) for leaf in _shape_leaves(s, f"{name}#{i}")]
    return [(name, shape)]


def _rebuild(shape: Shape, names) -> LValue:
    if isinstance(shape, TupleShape):
        return tuple(_rebuild(s, names) for s in shape.elements)
    return next(names)


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*shapes))


def _major_to_minor(shape: ArrayShape) -> tuple[int, ...]:
    rank = len(shape.dims)
    if shape.layout is None or len(shape.layout) != rank:
        return tuple(range(rank))
    return tuple(reversed(shape.layout))


def _strip_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    """shape without its leading 1s."""
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return shape[i:]


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _hlo_name(dtype: str) -> str:
    return next(k for k, v in DTYPES.items() if v == dtype)


def _is_identity(kind: str, init: np.ndarray | None) -> bool:
    """Whether `init` is the neutral element of the reduction `kind` (so it can be dropped)."""
    if init is None:
        return False
    v = init.item()
    if kind == "add":
        return v == 0
    if kind == "multiply":
        return v == 1
    floating = np.issubdtype(init.dtype, np.floating) or init.dtype.name == "bfloat16"
    if kind == "maximum":
        return v == -math.inf if floating else v == np.iinfo(init.dtype).min
    if kind == "minimum":
        return v == math.inf if floating else v == np.iinfo(init.dtype).max
    return False
