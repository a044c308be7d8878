"""A candidate rewrite: what it removes and adds, and its rewritten graph built on first use.

A `Candidate` records a rewrite of its `parent` as a delta; its `graph` (built with `Graph.replace`:
structure shared, nothing deep-copied) is only made when someone reads it, and its new weights
(concatenated, folded, padded: `Fold`s) are only computed then, once per content digest across
candidates and steps (`WEIGHT_CACHE`). `skeleton` and `cost_graph` give its structure with
placeholder weights, for hashing, featurising and per-op costing without computing a weight.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from xrl.ir import Graph, Node, TensorType
from xrl.ir.execute import run_node
from xrl.ir.ops import op_kind


# ----- new weights, computed on demand -----------------------------------------------------------
@dataclass(frozen=True)
class Fold:
    """A new weight: output `index` of `node` run on weights (or a literal array when node is None)."""

    node: Node | None
    index: int
    array: np.ndarray | None = None


class WeightCache:
    """Materialised new weights by digest, so a rewrite reached again (next step, other branch) is free."""

    def __init__(self, max_bytes: int = 256 << 20) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, np.ndarray] = OrderedDict()
        self._bytes = 0

    def get(self, digest: str) -> np.ndarray | None:
        a = self._items.get(digest)
        if a is not None:
            self._items.move_to_end(digest)
        return a

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0

    def put(self, digest: str, array: np.ndarray) -> None:
        if digest in self._items or array.nbytes > self.max_bytes:
            return
        self._items[digest] = array
        self._bytes += array.nbytes
        while self._bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self._bytes -= old.nbytes


WEIGHT_CACHE = WeightCache()


def fold_value(v: str, folds: Mapping[str, Fold], weights: Mapping[str, np.ndarray],
               memo: dict[str, np.ndarray]) -> np.ndarray:
    """The value of new weight `v`, computed through its chain of folds (memoised in `memo`).

    Arithmetic runs in float64 and is cast once, at the end, to the weight's type. Data movement
    (concat, pad, reshape, transpose, ...) runs in its inputs' own precision: it cannot round, and a
    padded or concatenated big weight then costs no float64 copy.
    """
    got = memo.get(v)
    if got is not None:
        return got
    fold = folds.get(v)
    if fold is None:
        return weights[v]
    if fold.node is None:
        got = fold.array
    else:
        ins = [fold_value(i, folds, weights, memo) if i else None for i in fold.node.inputs]
        floats = [a.dtype for a in ins if a is not None and a.dtype.kind == "f"]
        moves = op_kind(fold.node.op) in ("memory", "view") and floats
        got = run_node(fold.node, ins, dtype=np.result_type(*floats) if moves else np.float64)[fold.index]
    memo[v] = got  # type: ignore[assignment]
    return got  # type: ignore[return-value]


# New integer weights up to this many elements are computed even where a graph is only costed: kernels
# (Expand, Slice, Pad, Tile) are timed and cached by those values (xrl/cost/kernel_measured.py's _SMALL_CONST).
SMALL_INT_WEIGHT = 64


def placeholder(t: TensorType) -> np.ndarray:
    """A read-only zero-stride array of type t (numpy has no bfloat16: float32 stands in; only its
    shape is ever read)."""
    return np.broadcast_to(np.zeros((), t.dtype if t.dtype != "bfloat16" else "float32"), t.shape)


def content_digest(obj: object) -> str:
    return hashlib.blake2b(repr(obj).encode(), digest_size=16).hexdigest()


# ----- candidates ------------------------------------------------------------------------------
@dataclass(frozen=True)
class CandidateInfo:
    """A candidate's summary, JSON-ready (`dataclasses.asdict`)."""

    rule: str
    location: tuple[str, ...]
    removed_ops: tuple[str, ...]
    added_ops: tuple[str, ...]
    new_weights: int


@dataclass(frozen=True, eq=False)
class Candidate:
    """One rewrite of `parent`: `removed` nodes replaced by `added` ones.

    `graph` is the rewritten graph (built and cached on first use). `location` names the matched
    nodes in the order of the rule's source pattern.
    """

    rule: str
    location: tuple[str, ...]
    removed: tuple[Node, ...]
    added: tuple[Node, ...]
    parent: Graph = field(repr=False)
    rename: Mapping[str, str] = field(repr=False)
    new_types: Mapping[str, TensorType] = field(repr=False)
    folds: Mapping[str, Fold] = field(repr=False)  # every new weight, final or intermediate
    weights: tuple[str, ...] = field(repr=False)  # the new weights the rewritten graph holds

    @property
    def step(self) -> str:
        """`rule@node,node`: how search results record an applied rewrite."""
        return f"{self.rule}@{','.join(self.location)}"

    @cached_property
    def graph(self) -> Graph:
        arrays = self.weight_arrays()
        return self.parent.replace(
            remove=[n.name for n in self.removed], add=self.added, rename=self.rename,
            new_types=self.new_types,
            new_weights={w: arrays[w] for w in self.weights},
            new_digests={w: self.digests[w] for w in self.weights})

    @cached_property
    def digests(self) -> dict[str, str]:
        """New weight -> content digest, derived from the op and its inputs' digests (no new weight is
        computed for it). Computed on first use: it digests the parent's weights it reads, once per graph."""
        out: dict[str, str] = {}

        def digest(v: str) -> str:
            if v in out:
                return out[v]
            fold = self.folds.get(v)
            if fold is None:
                return self.parent.weight_digest(v)
            if fold.node is None:
                a = fold.array
                d = content_digest(("const", a.dtype.str, a.shape, a.tobytes()))  # type: ignore[union-attr]
            else:
                n = fold.node
                op_digest = content_digest(("fold", n.op, n.attr_key(), tuple(digest(i) for i in n.inputs)))
                d = content_digest((op_digest, fold.index))
            out[v] = d
            return d

        for v in self.folds:
            digest(v)
        return out

    def _stand_in(self, w: str, memo: dict[str, np.ndarray]) -> np.ndarray:
        """New weight w for a graph that is costed but never run: its value where it is a small integer
        tensor (a shape, axes, pads: what a kernel's timing depends on, and is keyed by), else a placeholder."""
        t = self.new_types[w]
        if t.numel <= SMALL_INT_WEIGHT and (t.dtype.startswith(("int", "uint")) or t.dtype == "bool"):
            return np.asarray(fold_value(w, self.folds, self.parent.initializers, memo)).astype(t.dtype)
        return placeholder(t)

    @cached_property
    def skeleton(self) -> Graph:
        """The rewritten graph's structure, types and weight digests, with new weights as zero-stride
        placeholders (small integer ones computed: see `_stand_in`): enough to hash, featurise or cost it
        without computing the weights. Never run or export it (use `graph`)."""
        memo: dict[str, np.ndarray] = {}
        placeholders = {w: self._stand_in(w, memo) for w in self.weights}
        return self.parent.replace(
            remove=[n.name for n in self.removed], add=self.added, rename=self.rename, new_types=self.new_types,
            new_weights=placeholders, new_digests={w: self.digests[w] for w in self.weights})

    @cached_property
    def cost_graph(self) -> Graph:
        """The added nodes with the values they read and write, for per-op costing without the new
        weights' contents: those are zero-stride placeholders. Never run or export this graph."""
        produced = {v for n in self.added for v in n.outputs}
        read = [v for n in self.added for v in n.inputs if v and v not in produced]
        types = {v: self.new_types.get(v) or self.parent.types[v] for v in (*read, *produced)}
        inits = {}
        memo: dict[str, np.ndarray] = {}
        for v in dict.fromkeys(read):
            if v in self.folds:
                inits[v] = self._stand_in(v, memo)
            elif v in self.parent.initializers:
                inits[v] = self.parent.initializers[v]
        inputs = [v for v in dict.fromkeys(read) if v not in inits]
        return Graph(self.added, inputs, [], types, inits, name=f"{self.parent.name}:delta")

    def delta_cost(self, cost_model: Any, parent_cost: float) -> float:
        """The rewritten graph's cost under `cost_model` (an `xrl.cost.CostModel`), given the parent's:
        from the delta for per-op models (no graph is built), else by costing `graph`."""
        if cost_model.per_op:
            return cost_model.delta_cost(self.parent, parent_cost, self.cost_graph, self.removed, self.added)
        if not cost_model.measured:  # an estimate reads structure and types only
            return cost_model.cost(self.skeleton)
        return cost_model.cost(self.graph)

    def info(self) -> CandidateInfo:
        return CandidateInfo(self.rule, self.location, tuple(n.op for n in self.removed),
                             tuple(n.op for n in self.added), len(self.weights))

    def weight_arrays(self) -> dict[str, np.ndarray]:
        """The new weights `graph` holds, computed (see `fold_value`) and cast to their types; cached by
        digest across candidates and steps (`WEIGHT_CACHE`)."""
        exact: dict[str, np.ndarray] = {}
        out = {}
        for w in self.weights:
            cached = WEIGHT_CACHE.get(self.digests[w])
            if cached is None:
                t = self.new_types[w]
                value = fold_value(w, self.folds, self.parent.initializers, exact)
                cached = np.asarray(value).astype(t.dtype, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
                if TensorType.of(cached) != t:
                    raise AssertionError(f"rule {self.rule}: weight {w} computed as {TensorType.of(cached)}, typed {t}")
                cached.flags.writeable = False
                WEIGHT_CACHE.put(self.digests[w], cached)
            out[w] = cached
        return out
