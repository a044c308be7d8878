"""What the rewrite engine knows of each op's attributes: defaults, axis normalisation, arity.

A pattern compares *normalised* attributes: defaults filled in (an absent `strides` reads as all
ones), negative axes made non-negative, lists made tuples. So `Conv(x, w, strides=s)` binds the
same `s` whether the exporter wrote the default or left it out. New nodes are *emitted* without
attributes that equal their default, so a rewritten node looks like a freshly imported one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from xrl.ir.ops import OPS, Arity
from xrl.ir.types import TensorType

Types = Sequence[TensorType]


def _spatial(ins: Types) -> int:
    return max(ins[0].rank - 2, 0) if ins else 0


def _conv_defaults(ins: Types) -> dict[str, Any]:
    k = _spatial(ins)
    return {"kernel_shape": ins[1].shape[2:] if len(ins) > 1 else None, "strides": (1,) * k, "pads": (0,) * (2 * k),
            "dilations": (1,) * k, "group": 1, "auto_pad": "NOTSET", "activation": None}


def _pool_defaults(ins: Types, **extra: Any) -> dict[str, Any]:
    k = _spatial(ins)
    return {"kernel_shape": None, "strides": (1,) * k, "pads": (0,) * (2 * k), "dilations": (1,) * k,
            "ceil_mode": 0, "auto_pad": "NOTSET", **extra}


def _last_axis(ins: Types) -> int:
    return ins[0].rank - 1 if ins else -1


_REDUCE = {"axes": None, "keepdims": 1, "noop_with_empty_axes": 0}

# op -> attribute defaults (normalised), as a function of the input types where they depend on them.
DEFAULTS: dict[str, Callable[[Types], dict[str, Any]]] = {
    "Conv": _conv_defaults,
    "MatMul": lambda ins: {"activation": None},
    "Gemm": lambda ins: {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0, "activation": None},
    "MaxPool": lambda ins: _pool_defaults(ins, storage_order=0),
    "AveragePool": lambda ins: _pool_defaults(ins, count_include_pad=0),
    "Softmax": lambda ins: {"axis": _last_axis(ins)},
    "LayerNormalization": lambda ins: {"axis": _last_axis(ins), "epsilon": 1e-5},
    "SimplifiedLayerNormalization": lambda ins: {"axis": _last_axis(ins), "epsilon": 1e-5, "stash_type": 1},
    "BatchNormalization": lambda ins: {"epsilon": 1e-5, "training_mode": 0},
    "Concat": lambda ins: {"axis": None},
    "Split": lambda ins: {"axis": 0, "split": None},
    "Transpose": lambda ins: {"perm": tuple(reversed(range(ins[0].rank))) if ins else None},
    "Flatten": lambda ins: {"axis": 1},
    "Squeeze": lambda ins: {"axes": None},
    "Unsqueeze": lambda ins: {"axes": None},
    "ReduceMean": lambda ins: dict(_REDUCE),
    "ReduceSum": lambda ins: dict(_REDUCE),
    "ReduceMax": lambda ins: dict(_REDUCE),
    "ReduceMin": lambda ins: dict(_REDUCE),
    "ReduceProd": lambda ins: dict(_REDUCE),
    "LeakyRelu": lambda ins: {"alpha": 0.01},
    "HardSigmoid": lambda ins: {"alpha": 0.2, "beta": 0.5},
    "Gelu": lambda ins: {"approximate": "none"},
    "Cast": lambda ins: {"to": None},
    "Reshape": lambda ins: {"allowzero": 0},
    "Pad": lambda ins: {"mode": "constant"},
    "Clip": lambda ins: {"min": None, "max": None},
    "Constant": lambda ins: {"value": None},
}

# Attributes that do not change what an inference graph computes: ignored when matching.
IGNORED: dict[str, frozenset[str]] = {
    "BatchNormalization": frozenset({"momentum"}),
    "LayerNormalization": frozenset({"stash_type"}),
    "Dropout": frozenset({"seed"}),
    "Cast": frozenset({"saturate"}),
    "Split": frozenset({"num_outputs"}),
}


def _norm_axis(a: int, rank: int) -> int:
    return a % rank if rank and -rank <= a < rank else a


def _norm_axes(axes: Sequence[int] | None, rank: int) -> tuple[int, ...] | None:
    return None if axes is None else tuple(sorted(_norm_axis(int(a), rank) for a in axes))


def _normalize_value(op: str, key: str, value: Any, ins: Types) -> Any:
    if isinstance(value, list):
        value = tuple(value)
    rank = ins[0].rank if ins else 0
    if key == "axis" and op in ("Concat", "Split", "Softmax", "LayerNormalization", "SimplifiedLayerNormalization") \
            and isinstance(value, int):
        return _norm_axis(value, rank)
    if key == "axis" and op == "Flatten" and isinstance(value, int):
        return value % (rank + 1) if -rank - 1 <= value < 0 else value
    if key == "axes" and value is not None and (op.startswith("Reduce") or op == "Squeeze"):
        return _norm_axes(value, rank)
    if key == "axes" and value is not None and op == "Unsqueeze":
        return _norm_axes(value, rank + len(value))
    return value


def normalized(op: str, attrs: Mapping[str, Any], ins: Types) -> tuple[dict[str, Any], frozenset[str]]:
    """(every attribute with defaults filled in, normalised; the keys that differ from their default).

    Keys the table does not know are kept as they are and always count as non-default, so a rule that
    does not mention them cannot match (and silently drop) them.
    """
    defaults = DEFAULTS.get(op, lambda ins: {})(ins)
    ignored = IGNORED.get(op, frozenset())
    values = dict(defaults)
    changed = []
    for key, raw in attrs.items():
        if key in ignored:
            continue
        v = _normalize_value(op, key, raw, ins)
        values[key] = v
        if key not in defaults or not same(v, defaults[key]):
            changed.append(key)
    return values, frozenset(changed)


def emitted(op: str, attrs: Mapping[str, Any], ins: Types) -> dict[str, Any]:
    """The attributes to store on a new node: None dropped, defaults dropped, lists made tuples."""
    defaults = DEFAULTS.get(op, lambda ins: {})(ins)
    out = {}
    for key, raw in attrs.items():
        if raw is None:
            continue
        value = tuple(raw) if isinstance(raw, list) else raw
        if key in defaults and same(_normalize_value(op, key, value, ins), defaults[key]):
            continue
        out[key] = value
    return out


def same(a: Any, b: Any) -> bool:
    """Attribute equality that never raises (arrays compare by content, tuples by items)."""
    if a is b:
        return True
    if type(a).__name__ == "ndarray" or type(b).__name__ == "ndarray":
        try:
            return bool(a.shape == b.shape and (a == b).all())
        except AttributeError:
            return False
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "Equal"})


def arity(op: str) -> Arity:
    """(fewest inputs, most inputs or None, outputs), read from the op table (xrl.ir.ops.OpSpec.arity); an op the
    IR does not know reads as one input, one output."""
    spec = OPS.get(op)
    return spec.arity if spec is not None else (1, 1, 1)
