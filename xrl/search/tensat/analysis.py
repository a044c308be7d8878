"""Tensat's e-class analysis: the tensor types of every e-class and, for constants, their value.

egg attaches an analysis to each e-class (`make` for a new e-node, `merge` when two classes join);
Tensat's records shapes, so that rewrites can check them. In egglog an analysis is a function
from e-classes to a value with a `merge`, filled by rules. Here it is `info(Tensor) -> String`
(and `args_info(Args)` for argument lists), rendered from a `ClassInfo`:

    "float32[1,64,56,56]"           one tensor
    "float32[8,4];float32[8,4]"     the outputs of a multi-output op (a tuple e-class)
    "float32[64,64]@<key>"          a constant: its value is `ConstTable.value(key)`

A constant is a graph weight, a constant a rule made (`ints(...)`, `const(...)`), or an op whose
inputs are all constants: the rewrite engine folds those into new weights at rewrite time
(TASO's weight preprocessing), so here they cost nothing and are folded the same way (float64
through the chain, `xrl.ir.execute.run_node`, cast once) when the graph is rebuilt.

egglog calls Python through `PyObject` values, which it pickles: a callback must not carry the
search's state. `Callback(context_id, method)` is a small picklable handle that finds the live
`Context` in a registry for the duration of one search.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from xrl.errors import XrlError
from xrl.ir import Graph, Node, TensorType
from xrl.ir.execute import run_node
from xrl.ir.ops import infer_types, is_known

NONE_INFO = "-"  # an omitted optional input
UNKNOWN_INFO = ""  # not inferred (an opaque op): the merge keeps whatever else is known
LIST_SEP = "|"


@dataclass(frozen=True)
class ClassInfo:
    """What the analysis knows of an e-class: one type per output, and a constant key if constant."""

    types: tuple[TensorType, ...]
    const: str | None = None

    def render(self) -> str:
        text = ";".join(str(t) for t in self.types)
        return f"{text}@{self.const}" if self.const is not None else text


@lru_cache(maxsize=65536)
def parse_info(text: str) -> ClassInfo | None:
    """The ClassInfo of an info string; None for an omitted input or an unknown class."""
    if text in (NONE_INFO, UNKNOWN_INFO):
        return None
    body, _, const = text.partition("@")
    return ClassInfo(tuple(_parse_type(t) for t in body.split(";")), const or None)


def _parse_type(text: str) -> TensorType:
    dtype, _, dims = text.partition("[")
    dims = dims.rstrip("]")
    return TensorType(tuple(int(d) for d in dims.split(",")) if dims else (), dtype)


def merge_info(old: str, new: str) -> str:
    """egglog's merge of two infos of one e-class: known beats unknown, constant beats not, then the
    smaller key (equal constants from different folds are interchangeable). Never raises: types of
    equal values agree for verified rules, and a disagreement keeps the old one."""
    if old == new or new in (UNKNOWN_INFO, NONE_INFO):
        return old
    if old in (UNKNOWN_INFO, NONE_INFO):
        return new
    a, b = parse_info(old), parse_info(new)
    if a is None or b is None or a.types != b.types:
        return old
    if a.const is None:
        return new if b.const is not None else old
    if b.const is None:
        return old
    return min(old, new)


def merge_args_info(old: str, new: str) -> str:
    """Merge of argument-list infos: element by element."""
    if old == new:
        return old
    xs, ys = old.split(LIST_SEP), new.split(LIST_SEP)
    if len(xs) != len(ys):
        return old
    return LIST_SEP.join(merge_info(x, y) for x, y in zip(xs, ys))


def _digest(obj: object) -> str:
    return hashlib.blake2b(repr(obj).encode(), digest_size=12).hexdigest()


# ----- tables of the values terms refer to -------------------------------------------------------
class AttrTable:
    """Node attributes (and output count) by a canonical string key: egglog terms hold the key."""

    def __init__(self) -> None:
        self._by_key: dict[str, tuple[int, dict[str, Any]]] = {}

    def key(self, n_outputs: int, attrs: Mapping[str, Any]) -> str:
        text = repr((n_outputs, tuple(sorted((k, _canonical(v)) for k, v in attrs.items()))))
        if text not in self._by_key:
            self._by_key[text] = (n_outputs, dict(attrs))
        return text

    def get(self, key: str) -> tuple[int, dict[str, Any]]:
        return self._by_key[key]


def _canonical(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return ("ndarray", v.dtype.str, v.shape, _digest(v.tobytes()))
    if isinstance(v, list | tuple):
        return tuple(_canonical(x) for x in v)
    return v


@dataclass
class _Fold:
    node: Node
    inputs: tuple[str, ...]  # const keys ("" for an omitted input)


class ConstTable:
    """Constant values by key: graph weights, arrays rules made, and folds of constant ops.

    `value(key)` is exact (float64 through folds, as the rewrite engine computes new weights);
    keys of one output of a fold are `"<fold key>/<index>"`.
    """

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}
        self._folds: dict[str, _Fold] = {}
        self._values: dict[str, list[np.ndarray]] = {}

    def add_array(self, array: np.ndarray, key: str | None = None) -> str:
        if key is None:
            key = "a" + _digest((array.dtype.str, array.shape, array.tobytes()))
        self._arrays.setdefault(key, array)
        return key

    def add_fold(self, node: Node, inputs: Sequence[str]) -> str:
        key = "f" + _digest((node.op, node.attr_key(), len(node.outputs), tuple(inputs)))
        self._folds.setdefault(key, _Fold(node, tuple(inputs)))
        return key

    def value(self, key: str) -> np.ndarray:
        if key in self._arrays:
            return self._arrays[key]
        fold_key, _, index = key.rpartition("/")
        return self._outputs(fold_key)[int(index)]

    def _outputs(self, fold_key: str) -> list[np.ndarray]:
        if fold_key not in self._values:
            fold = self._folds[fold_key]
            ins = [self.value(k) if k else None for k in fold.inputs]
            self._values[fold_key] = run_node(fold.node, ins)
        return self._values[fold_key]


# ----- the per-search context and the callbacks egglog calls --------------------------------------
@dataclass
class Context:
    """The state one Tensat search shares with its egglog callbacks."""

    graph: Graph
    attrs: AttrTable = field(default_factory=AttrTable)
    consts: ConstTable = field(default_factory=ConstTable)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    weight_names: dict[str, str] = field(default_factory=dict)  # const key -> the graph's weight name
    handlers: dict[str, Callable[..., Any]] = field(default_factory=dict)  # more callbacks (the rewrites')

    # --- analysis callbacks
    def input_info(self, name: str) -> str:
        return ClassInfo((self.graph.types[name],)).render()

    def weight_info(self, key: str) -> str:
        return ClassInfo((TensorType.of(self.consts.value(key)),), key).render()

    def infer(self, op: str, attrs_key: str, args_info: str) -> str:
        """`make` for an op e-node: its output types, and a constant key if every input is constant."""
        node, in_infos = self.probe(op, attrs_key, args_info)
        if node is None:
            return UNKNOWN_INFO
        in_types = [i.types[0] if i is not None else None for i in in_infos]
        consts = _Consts(self, in_infos)
        try:
            out_types = infer_types(node, in_types, consts)
        except XrlError:
            return UNKNOWN_INFO
        const = None
        if in_infos and all(i is not None and i.const is not None for i in in_infos):
            key = self.consts.add_fold(node, [i.const for i in in_infos])  # type: ignore[union-attr]
            const = f"{key}/0" if len(out_types) == 1 else key
        return ClassInfo(tuple(out_types), const).render()

    def probe(self, op: str, attrs_key: str, args_info: str) -> tuple[Node | None, list[ClassInfo | None]]:
        """A stand-in Node for an op e-node (inputs named by position), and its inputs' infos."""
        domain, _, name = op.rpartition("::")
        n_outputs, attrs = self.attrs.get(attrs_key)
        infos = [parse_info(s) for s in args_info.split(LIST_SEP)] if args_info else []
        if not is_known(name, domain) or any(i is None and s != NONE_INFO
                                             for i, s in zip(infos, args_info.split(LIST_SEP))):
            return None, infos
        ins = tuple(f"in{i}" if info is not None else "" for i, info in enumerate(infos))
        outs = tuple(f"out{i}" for i in range(n_outputs))
        return Node("probe", name, ins, outs, attrs, domain), infos

    def out_info(self, info: str, index: int) -> str:
        """`make` for output `index` of a multi-output e-class."""
        parsed = parse_info(info)
        if parsed is None or index >= len(parsed.types):
            return UNKNOWN_INFO
        const = f"{parsed.const}/{index}" if parsed.const is not None else None
        return ClassInfo((parsed.types[index],), const).render()


class _Consts(Sequence):
    """`infer_types`'s consts: constant inputs' values, computed only if inference reads them."""

    def __init__(self, ctx: Context, infos: list[ClassInfo | None]) -> None:
        self.ctx, self.infos = ctx, infos

    def __len__(self) -> int:
        return len(self.infos)

    def __getitem__(self, i: Any) -> Any:
        info = self.infos[i]
        return self.ctx.consts.value(info.const) if info is not None and info.const is not None else None


_CONTEXTS: dict[str, Context] = {}


@contextmanager
def registered(ctx: Context) -> Iterator[Context]:
    """Make `ctx` reachable from egglog callbacks while the search runs."""
    _CONTEXTS[ctx.id] = ctx
    try:
        yield ctx
    finally:
        _CONTEXTS.pop(ctx.id, None)


@dataclass(frozen=True)
class Callback:
    """A picklable handle on `_CONTEXTS[context].<method>` (or a module-level function when context is "")."""

    context: str
    method: str

    def __call__(self, *args: Any) -> Any:
        if not self.context:
            return _PURE[self.method](*args)
        ctx = _CONTEXTS[self.context]
        fn = ctx.handlers.get(self.method) or getattr(ctx, self.method)
        return fn(*args)


def _join(head: str, tail: str) -> str:
    """args_info of cons(head, tail): infos in argument order ("" is the empty list)."""
    return f"{head}{LIST_SEP}{tail}" if tail else head


_PURE = {"merge_info": merge_info, "merge_args_info": merge_args_info, "join": _join}
