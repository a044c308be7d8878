"""The small expression language of rules: conditions, computed attributes, example shapes.

An expression is a Python expression restricted to literals, names, tuples/lists, arithmetic,
comparisons, `and`/`or`/`not`, `x if c else y`, indexing and calls of the functions below. It is
checked once when the rule file is parsed (anything else is a syntax error: no attribute access,
no lambdas, no comprehensions) and then compiled and run by `eval` with no builtins, so a rule
file cannot run arbitrary code.

Names are rule variables. A tensor variable evaluates to the *name* of the value it matched (so
`a == b` asks "the same value?"), and the tensor functions (`shape`, `rank`, `weight`, ...) take
such names and look their types and contents up in the graph being rewritten.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import numpy as np

from xrl.errors import XrlError
from xrl.ir.types import TensorType

# Bounds on what one rule expression may compute: a rule file is data, and `10 ** 10 ** 9` or
# `sum(range(10**12))` must fail at once, not hang xrl. Real rules use small ints and short tuples.
MAX_INT_BITS = 4096
MAX_SEQUENCE = 100_000


class ExprLimitError(XrlError):
    """A rule expression asked for more than MAX_INT_BITS / MAX_SEQUENCE: a broken or hostile rule file."""


class _Limit(Exception):
    pass


def _bits(x: Any) -> int:
    return abs(x).bit_length() if isinstance(x, int) else 0


def _safe_pow(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1:
        if b * max(_bits(a) - 1, 1) > MAX_INT_BITS:
            raise _Limit(f"{a} ** {b} would have over {MAX_INT_BITS} bits")
    elif isinstance(b, int) and _bits(b) > 64:
        raise _Limit(f"exponent {b} is too large")
    return a**b


def _safe_mul(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        if _bits(a) + _bits(b) > MAX_INT_BITS:
            raise _Limit(f"a product of {_bits(a)}- and {_bits(b)}-bit integers is over {MAX_INT_BITS} bits")
    else:
        seq, n = (a, b) if isinstance(b, int) else (b, a)
        if isinstance(n, int) and isinstance(seq, tuple | list | str) and len(seq) * n > MAX_SEQUENCE:
            raise _Limit(f"repeating a sequence {n} times makes over {MAX_SEQUENCE:,} items")
    return a * b


def _safe_range(*args: Any) -> range:
    r = range(*args)
    if len(r) > MAX_SEQUENCE:
        raise _Limit(f"range of {len(r):,} items is over {MAX_SEQUENCE:,}")
    return r


def _safe_prod(items: Iterable[Any], start: Any = 1) -> Any:
    out = start
    for x in items:
        out = _safe_mul(out, x)
    return out

_ALLOWED = (
    ast.Expression, ast.Constant, ast.Name, ast.Load, ast.Tuple, ast.List, ast.BinOp, ast.UnaryOp, ast.BoolOp,
    ast.Compare, ast.Call, ast.Subscript, ast.Slice, ast.IfExp,
    ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Div, ast.Pow, ast.USub, ast.UAdd, ast.Not, ast.And,
    ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is, ast.IsNot,
)


class Values(Protocol):
    """What tensor functions may ask of the graph a rule is matched in."""

    def type_of(self, value: str) -> TensorType: ...

    def is_weight(self, value: str) -> bool: ...

    def weight_value(self, value: str) -> np.ndarray | None: ...


class EvalError(Exception):
    """An expression could not be evaluated on this match (e.g. `value` of an activation)."""


def _tensor_functions(g: Values) -> dict[str, Callable[..., Any]]:
    def typ(v: str | None) -> TensorType:
        if not isinstance(v, str) or not v:
            raise EvalError(f"{v!r} is not a tensor")
        return g.type_of(v)

    def value(v: str) -> np.ndarray:
        a = g.weight_value(v) if isinstance(v, str) and g.is_weight(v) else None
        if a is None:
            raise EvalError(f"{v!r} is not a weight")
        return a

    def all_equal(v: str, x: float) -> bool:
        return isinstance(v, str) and g.is_weight(v) and bool(np.all(value(v) == x))

    def close(v: str, x: float) -> bool:
        return isinstance(v, str) and g.is_weight(v) and bool(np.allclose(value(v), x, rtol=1e-6, atol=0.0))

    return {
        "shape": lambda v: typ(v).shape,
        "rank": lambda v: typ(v).rank,
        "dim": lambda v, i: typ(v).shape[i],
        "numel": lambda v: typ(v).numel,
        "dtype": lambda v: typ(v).dtype,
        "weight": lambda v: isinstance(v, str) and g.is_weight(v),
        "present": lambda v: v is not None,
        "value": value,
        "all_equal": all_equal,
        "close": close,
    }


def compose(p: tuple[int, ...], q: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation of Transpose(Transpose(x, p), q)."""
    return tuple(p[i] for i in q)


def inverse(p: tuple[int, ...]) -> tuple[int, ...]:
    out = [0] * len(p)
    for i, j in enumerate(p):
        out[j] = i
    return tuple(out)


def bcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """numpy broadcasting of `shapes`, or None when they do not broadcast."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def channel_vector(shape: tuple[int, ...], channels: int, rank: int) -> bool:
    """A shape that broadcasts against (N, channels, *spatial) of `rank` as one value per channel."""
    if len(shape) > rank:
        return False
    full = (1,) * (rank - len(shape)) + tuple(shape)
    return full[0] == 1 and full[1] in (1, channels) and all(d == 1 for d in full[2:])


def vadd(a: Iterable[Any], b: Iterable[Any]) -> tuple[int, ...]:
    """Elementwise sum of two integer sequences of one length (pads, shapes), as a tuple of ints."""
    a, b = [int(v) for v in a], [int(v) for v in b]
    if len(a) != len(b):
        raise ValueError(f"vadd: lengths {len(a)} and {len(b)} differ")
    return tuple(x + y for x, y in zip(a, b))


def vsub(a: Iterable[Any], b: Iterable[Any]) -> tuple[int, ...]:
    """Elementwise difference of two integer sequences of one length, as a tuple of ints."""
    return vadd(a, [-int(v) for v in b])


def vmax(a: Iterable[Any], b: Iterable[Any]) -> tuple[int, ...]:
    """Elementwise maximum of two integer sequences of one length (two kernels' spatial shapes)."""
    a, b = [int(v) for v in a], [int(v) for v in b]
    if len(a) != len(b):
        raise ValueError(f"vmax: lengths {len(a)} and {len(b)} differ")
    return tuple(max(x, y) for x, y in zip(a, b))


def same_pads(kernel: Iterable[Any], dilations: Iterable[Any]) -> tuple[int, ...]:
    """The pads (begins, then ends) that keep a stride-1 conv's output the size of its input, centred:
    dilation * (k - 1) / 2 per spatial dim. Only odd kernels have them (an even one raises)."""
    k, d = [int(v) for v in kernel], [int(v) for v in dilations]
    if len(k) != len(d) or any(v % 2 == 0 for v in k):
        raise ValueError(f"same_pads: kernel {tuple(k)} with dilations {tuple(d)}")
    half = tuple(di * (ki - 1) // 2 for ki, di in zip(k, d))
    return half + half


def centre_pads(kernel: Iterable[Any], to: Iterable[Any]) -> tuple[int, ...]:
    """The Pad amounts of a conv filter (O, I, *kernel) that zero-pad its kernel to `to`, centred (odd
    sizes): with pads grown by dilation times as much, the enlarged conv computes what the small one did."""
    k, t = [int(v) for v in kernel], [int(v) for v in to]
    if len(k) != len(t) or any(a > b or (b - a) % 2 for a, b in zip(k, t)):
        raise ValueError(f"centre_pads: kernel {tuple(k)} does not centre in {tuple(t)}")
    half = tuple((b - a) // 2 for a, b in zip(k, t))
    return (0, 0) + half + (0, 0) + half


def identity_kernel(shape: Iterable[Any]) -> np.ndarray:
    """The convolution filter of shape (O, I, *kernel) that copies its input: out[o] = in[o] (float64).

    Filter o has a one at input channel `o % I` and the kernel's centre tap, zeros elsewhere: with
    group g and O = I * g channels in and out, output channel o reads the group holding input
    channel o, where that channel is number o % I. Exact for "same"-padded odd kernels of any dilation.
    Structural re-parameterisation (RepVGG) writes an identity branch, or a BatchNorm of the input, as
    this kernel (scaled per channel) so that it can be summed into a parallel convolution's filters:
    the rule language has no op that makes it from shapes, so it is this one function."""
    dims = tuple(int(d) for d in shape)
    if len(dims) < 3 or min(dims) <= 0 or any(k % 2 == 0 for k in dims[2:]):
        raise ValueError(f"identity_kernel: {dims} is not (O, I, odd kernel...)")
    if _safe_prod(dims) > MAX_SEQUENCE * 100:
        raise _Limit(f"an identity kernel of shape {dims} is over {MAX_SEQUENCE * 100:,} elements")
    out = np.zeros(dims, np.float64)
    o = np.arange(dims[0])
    out[(o, o % dims[1]) + tuple(k // 2 for k in dims[2:])] = 1.0
    return out


PURE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "len": len, "tuple": tuple, "range": _safe_range, "min": min, "max": max, "abs": abs, "sum": sum, "all": all,
    "any": any, "int": int, "float": float, "sorted": sorted, "prod": _safe_prod, "compose": compose,
    "inverse": inverse, "bcast": bcast, "channel_vector": channel_vector, "vadd": vadd, "vsub": vsub,
    "vmax": vmax, "same_pads": same_pads, "centre_pads": centre_pads, "identity_kernel": identity_kernel,
}
TENSOR_FUNCTIONS = frozenset(_tensor_functions(None).keys())  # type: ignore[arg-type]
FUNCTIONS = frozenset(PURE_FUNCTIONS) | TENSOR_FUNCTIONS


def check(expr: ast.expr, *, functions: Iterable[str] = FUNCTIONS) -> tuple[set[str], str | None]:
    """(the variable names `expr` reads, or a problem message)."""
    allowed_calls = set(functions)
    names: set[str] = set()
    for node in ast.walk(expr):
        if not isinstance(node, _ALLOWED):
            return names, f"{type(node).__name__} is not allowed in a rule expression"
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in allowed_calls:
                what = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
                return names, f"unknown function {what!r}"
            if node.keywords:
                return names, f"function {node.func.id!r} takes no keyword arguments"
    nodes = list(ast.walk(expr))
    callees = {id(n.func) for n in nodes if isinstance(n, ast.Call)}  # one walk, not one per name
    names.update(n.id for n in nodes if isinstance(n, ast.Name) and id(n) not in callees)
    return names, None


_SAFE_OPS = {"__pow": _safe_pow, "__mul": _safe_mul}


class _Bounded(ast.NodeTransformer):
    """`a ** b` and `a * b` become calls that check sizes before computing."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        fn = {ast.Pow: "__pow", ast.Mult: "__mul"}.get(type(node.op))
        if fn is None:
            return node
        return ast.copy_location(ast.Call(ast.Name(fn, ast.Load()), [node.left, node.right], []), node)


class Compiled:
    """One checked expression, compiled once; `run(env, functions)` evaluates it."""

    __slots__ = ("source", "names", "where", "_code")

    def __init__(self, expr: ast.expr, names: set[str], where: str = "") -> None:
        self.source = ast.unparse(expr)
        self.names = frozenset(names)
        self.where = where  # "file:line" of the rule text, for errors
        tree = ast.fix_missing_locations(_Bounded().visit(ast.Expression(_copy(expr))))
        self._code = compile(tree, "<rule>", "eval")

    def run(self, env: dict[str, Any], functions: dict[str, Any]) -> Any:
        if "__pow" not in functions:
            functions.update(_SAFE_OPS)
        try:
            return eval(self._code, functions, env)  # noqa: S307 - checked AST, no builtins
        except EvalError:
            raise
        except _Limit as e:
            raise ExprLimitError(f"{self.where or '<rule>'}: expression {self.source!r}: {e}; rule expressions "
                                 f"are limited to {MAX_INT_BITS}-bit integers and {MAX_SEQUENCE:,}-item "
                                 f"sequences") from None
        except MemoryError:
            raise ExprLimitError(f"{self.where or '<rule>'}: expression {self.source!r} ran out of memory") from None
        except (ArithmeticError, LookupError, TypeError, ValueError) as e:
            raise EvalError(f"{self.source}: {type(e).__name__}: {e}") from e

    def __repr__(self) -> str:
        return f"Compiled({self.source!r})"

    def __reduce__(self) -> tuple:
        return (_recompile, (self.source, tuple(sorted(self.names)), self.where))


def _copy(expr: ast.expr) -> ast.expr:
    return ast.parse(ast.unparse(expr), mode="eval").body  # the transformer must not change the caller's tree


def _recompile(source: str, names: tuple[str, ...], where: str = "") -> Compiled:
    return Compiled(ast.parse(source, mode="eval").body, set(names), where)


def function_table(g: Values, extra: Mapping[str, Callable[..., Any]] | None = None) -> dict[str, Any]:
    """The globals an expression runs with: no builtins, the pure and tensor functions, `extra`."""
    table: dict[str, Any] = {"__builtins__": {}}
    table.update(PURE_FUNCTIONS)
    table.update(_tensor_functions(g))
    if extra:
        table.update(extra)
    return table
