"""Candidate generation: every (rule, match) of a graph, as a cheap delta on the graph.

A candidate records what a rewrite removes and adds; its `graph` (the rewritten Graph, built with
`Graph.replace`: structure shared, nothing deep-copied) is only made when someone reads it, and
new weights (concatenated, folded, padded) are only computed then; their digests too, so no weight
is hashed while enumerating. Enumerating candidates costs matching plus a few (memoised) shape
inferences per match; per-op cost models can cost a candidate from its delta alone
(`Candidate.delta_cost`), and `skeleton` gives its structure with placeholder weights for hashing
and featurising, both without computing a weight.

Dropped while enumerating: candidates whose target does not type-check, that would create a
cycle, that would grow the graph past `max_growth` x its original op count, that rewrite the
graph into itself, and duplicates (the same nodes replaced by the same structure, whichever rule
or binding got there first).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from xrl.errors import ShapeInferenceError
from xrl.ir import Graph, Node, TensorType
from xrl.ir.execute import run_node
from xrl.ir.ops import infer_types, op_kind
from xrl.rewrite.attrs import emitted
from xrl.rewrite.expr import EvalError
from xrl.rewrite.lang import Alias, Arg, ConstArg, OpNode, Rule
from xrl.rewrite.match import GraphIndex, Match, Matcher, on_step, past_deadline

log = logging.getLogger(__name__)

MAX_MATCHES_ENV = "XRL_MAX_MATCHES"
# Candidates one rule may contribute per graph. Real graphs stay far below it; N ops sharing one input
# give a merge rule O(N^2) or O(N^3) matches (80 MatMuls: 85,320 candidates), which it cuts.
DEFAULT_MAX_MATCHES = 1000


def max_matches_default() -> int:
    raw = os.environ.get(MAX_MATCHES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_MATCHES
    try:
        value = int(raw)
    except ValueError:
        from xrl.errors import ConfigError

        raise ConfigError(f"{MAX_MATCHES_ENV}={raw!r} is not a whole number") from None
    return value if value > 0 else 2**62  # 0 or less: no cap

if TYPE_CHECKING:
    from xrl.rewrite.rules import RuleSet


# ----- new weights, computed on demand -----------------------------------------------------------
@dataclass(frozen=True)
class _Fold:
    """A new weight: output `index` of `node` run on weights (or a literal array when node is None)."""

    node: Node | None
    index: int
    array: np.ndarray | None = None


class _WeightCache:
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


WEIGHT_CACHE = _WeightCache()


def fold_value(v: str, folds: Mapping[str, _Fold], weights: Mapping[str, np.ndarray],
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


def _placeholder(t: TensorType) -> np.ndarray:
    """A read-only zero-stride array of type t (numpy has no bfloat16: float32 stands in; only its
    shape is ever read)."""
    return np.broadcast_to(np.zeros((), t.dtype if t.dtype != "bfloat16" else "float32"), t.shape)


def _digest(obj: object) -> str:
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
    folds: Mapping[str, _Fold] = field(repr=False)  # every new weight, final or intermediate
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
                d = _digest(("const", a.dtype.str, a.shape, a.tobytes()))  # type: ignore[union-attr]
            else:
                n = fold.node
                d = _digest((_digest(("fold", n.op, n.attr_key(), tuple(digest(i) for i in n.inputs))), fold.index))
            out[v] = d
            return d

        for v in self.folds:
            digest(v)
        return out

    @cached_property
    def skeleton(self) -> Graph:
        """The rewritten graph's structure, types and weight digests, with new weights as zero-stride
        placeholders: enough to hash, featurise or cost it without computing the weights. Never run or
        export it (use `graph`)."""
        placeholders = {w: _placeholder(self.new_types[w]) for w in self.weights}
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
        for v in dict.fromkeys(read):
            if v in self.folds:
                inits[v] = _placeholder(types[v])
            elif v in self.parent.initializers:
                inits[v] = self.parent.initializers[v]
        inputs = [v for v in dict.fromkeys(read) if v not in inits]
        return Graph(self.added, inputs, [], types, inits, name=f"{self.parent.name}:delta")

    def delta_cost(self, cost_model: Any, parent_cost: float) -> float:
        """The rewritten graph's cost under `cost_model` (an `xrl.cost.CostModel`), given the parent's:
        from the delta for per-op models (no graph is built), else by costing `graph`."""
        if getattr(cost_model, "per_op", False):
            return cost_model.delta_cost(self.parent, parent_cost, self.cost_graph, self.removed, self.added)
        if not getattr(cost_model, "measured", True):  # an estimate reads structure and types only
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


# ----- the engine ------------------------------------------------------------------------------
class RewriteEngine:
    """Enumerates the candidates of a graph under a rule set (by default the verified built-in rules)."""

    def __init__(self, rules: RuleSet | Sequence[Rule] | None = None, *, max_growth: float = 2.0,
                 exact_dedup: bool = False, max_matches: int | None = None) -> None:
        """max_growth: drop candidates with more than max_growth x the original graph's op count.
        exact_dedup: also drop candidates whose rewritten graph has the canonical hash of the current
        graph or of an earlier candidate, when different nodes were rewritten (see `candidates`).
        max_matches: candidates one rule may give per graph (default $XRL_MAX_MATCHES, else
        DEFAULT_MAX_MATCHES); the rest of its matches are not enumerated, and the cut is logged."""
        self.max_matches = max_matches if max_matches is not None else max_matches_default()
        self.cut_rules: Counter[str] = Counter()  # rule -> graphs where the cap cut its matches
        self.timed_out = 0  # enumerations stopped by a search's deadline
        self.rejected: list[frozenset[str]] = []  # the last call's matches whose rewrite did not type-check
        if rules is None:
            from xrl.rewrite.rules import load_rules

            rules = load_rules()
        self.rules: tuple[Rule, ...] = tuple(getattr(rules, "rules", rules))
        self.max_growth = max_growth
        self.exact_dedup = exact_dedup
        self._matchers = [Matcher(r) for r in self.rules]
        self._memo: dict[tuple, list[TensorType]] = {}  # shape inference of target ops

    def __repr__(self) -> str:
        return f"RewriteEngine({len(self.rules)} rules, max_growth={self.max_growth})"

    def matches(self, graph: Graph) -> list[tuple[Rule, Match]]:
        """Every raw match (before building, deduplication and the cycle check)."""
        index = GraphIndex(graph)
        return [(m.rule, match) for m in self._matchers for match in m.matches(index)]

    def candidates(self, graph: Graph, *, original_nodes: int | None = None) -> list[Candidate]:
        """Every distinct rewrite of `graph`, in a deterministic order (rule order, then match order).

        Two candidates are the same when they replace the same nodes by the same structure (whatever
        rule or variable binding produced them): only the first is kept, and a candidate that puts
        back what it removes is dropped. That key is exact and cheap. Different rewrites that happen to
        give isomorphic graphs (possible only where a graph computes something twice) are told apart
        only by the canonical hash, which `exact_dedup=True` also compares, at the price of building
        and hashing each candidate's structure.
        """
        on_step(graph)  # a search step: the progress display, if one is shown
        index = GraphIndex(graph)
        limit = self.max_growth * (original_nodes if original_nodes is not None else len(graph))
        seen: set[tuple] = set()
        hashes = {graph.canonical_hash} if self.exact_dedup else set()
        out: list[Candidate] = []
        self.rejected = []  # read by rule verification: a rule that matches but never type-checks is wrong
        for matcher in self._matchers:
            if past_deadline():
                self.timed_out += 1
                if self.timed_out == 1:  # once: a search past its deadline would log this for every state it sees
                    log.info("candidate enumeration stopped at the time limit (%d candidates, before rule %s)",
                             len(out), matcher.rule.name)
                break
            node_sets: set[frozenset[str]] = set()
            for match in matcher.matches(index):
                key = frozenset(n.name for n in match.nodes)
                if key in node_sets:
                    continue  # the same nodes under a symmetric binding (a+b vs b+a, Q/K/V in any order)
                if len(node_sets) >= self.max_matches:
                    self._cut(matcher.rule.name)
                    break
                built = _Builder(index, matcher.rule, match, self._memo).build()
                if built is None:
                    if len(self.rejected) < 64:
                        self.rejected.append(key)
                    continue
                node_sets.add(key)
                cand, delta_key, noop = built
                if noop or delta_key in seen:
                    continue
                seen.add(delta_key)
                if len(graph) - len(cand.removed) + len(cand.added) > limit:
                    continue
                if _creates_cycle(index, cand):
                    continue
                if self.exact_dedup:
                    h = cand.skeleton.canonical_hash
                    if h in hashes:
                        continue
                    hashes.add(h)
                out.append(cand)
        return out


    def _cut(self, rule: str) -> None:
        first = rule not in self.cut_rules
        self.cut_rules[rule] += 1
        log.log(logging.WARNING if first else logging.INFO,
                "rule %s matched more than %d places in one graph; only the first %d are candidates "
                "(raise %s to see more)", rule, self.max_matches, self.max_matches, MAX_MATCHES_ENV)


def _creates_cycle(index: GraphIndex, cand: Candidate) -> bool:
    """Would the rewrite close a cycle? True when an external value the added nodes read depends
    (through nodes that stay) on a removed node: the added nodes redefine what the removed computed."""
    removed = {n.name for n in cand.removed}
    if not removed:
        return False
    produced = {v for n in cand.added for v in n.outputs}
    topo = index.topo_index
    low = min(topo[n] for n in removed)
    stack = []
    for n in cand.added:
        for v in n.inputs:
            if v and v not in produced:
                p = index.producers.get(v)
                if p is not None:
                    stack.append(p[0])
    seen: set[str] = set()
    while stack:
        node = stack.pop()
        if node.name in removed:
            return True
        if node.name in seen or topo[node.name] < low:
            continue  # nothing before the earliest removed node can depend on it
        seen.add(node.name)
        for v in node.inputs:
            p = index.producers.get(v) if v else None
            if p is not None:
                stack.append(p[0])
    return False


# Ops whose shape inference reads the values of inputs after the first (shape, axes, pads, ...).
_READS_CONSTS = frozenset({"Reshape", "Slice", "Pad", "Expand", "Split", "Squeeze", "Unsqueeze", "ReduceSum",
                           "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"})
_REJECTED: list[TensorType] = []


class _Reject(Exception):
    """This match does not make a valid rewrite (a target that does not type-check, ...)."""


class _Builder:
    """Instantiates a rule's target for one match."""

    def __init__(self, index: GraphIndex, rule: Rule, match: Match, memo: dict) -> None:
        self.index, self.rule, self.match, self.memo = index, rule, match, memo
        self.graph = index.graph
        self.env: dict[str, Any] = dict(match.env)  # rule variable -> value name / attribute value
        self.new_types: dict[str, TensorType] = {}
        self.folds: dict[str, _Fold] = {}
        self.fold_keys: dict[str, tuple] = {}  # new weight -> what computes it, by name (cheap, exact here)
        self.added: list[Node] = []
        self.rename: dict[str, str] = {}
        self._exact: dict[str, np.ndarray] = {}
        self._count = len(self.graph.nodes) + len(self.graph.types)  # fresh names start past the graph's size

    def _fresh(self, prefix: str) -> str:
        """A name the graph does not use. Depends only on the graph and the rule (not on what was built
        before), so the same graph always gives the same candidates, names included."""
        g = self.graph
        while True:
            name = f"{prefix}_{self._count}"
            self._count += 1
            if name not in g.nodes and name not in g.types and name not in g.initializers:
                return name

    def build(self) -> tuple[Candidate, tuple, bool] | None:
        values = self.index.values
        values.local_types = self.new_types
        values.local_weights = _LazyWeights(self)
        try:
            return self._build()
        except _Reject:
            return None
        finally:
            values.local_types = {}
            values.local_weights = None

    def _build(self) -> tuple[Candidate, tuple, bool]:
        rule, env, graph = self.rule, self.env, self.graph
        removed = self._removed()
        for st in rule.target:
            if isinstance(st, Alias):
                self._define(st.output, env[st.source])
                continue
            self._op(st)
        weights = set()
        for n in self.added:
            weights.update(v for v in n.inputs if v in self.folds)
        weights.update(v for v in self.rename.values() if v in self.folds)
        outputs = set(graph.outputs)
        for old, new in self.rename.items():
            if old in outputs and (new in outputs or new in graph.initializers or new in graph.inputs
                                   or new in self.folds):
                raise _Reject  # a graph output would become an input, a weight or another output: keep an op
        cand = Candidate(rule.name, tuple(n.name for n in self.match.nodes), tuple(removed), tuple(self.added),
                         graph, self.rename, self.new_types, self.folds,
                         tuple(w for w in self.folds if w in weights))
        key, noop = self._delta_key(removed)
        return cand, key, noop

    def _removed(self) -> list[Node]:
        """Matched nodes go, except the producers of shared intermediates that others still read."""
        nodes = self.match.nodes
        if not self.rule.shared:
            return list(nodes)
        names = {n.name for n in nodes}
        keep: set[str] = set()
        by_value = {v: n for n in nodes for v in n.outputs}
        stack = []
        for var in self.rule.shared:
            value = self.env[var]
            ext = value in self.index.outputs or any(c.name not in names for c in self.index.consumers.get(value, ()))
            if ext:
                stack.append(by_value[value])
        while stack:
            n = stack.pop()
            if n.name in keep:
                continue
            keep.add(n.name)
            stack.extend(by_value[v] for v in n.inputs if v in by_value)
        for n in nodes:
            if n.name in keep and any(self.env[r] in n.outputs for r in self.rule.roots):
                raise _Reject  # a kept node computes a value the target redefines
        return [n for n in nodes if n.name not in keep]

    def _type(self, v: str) -> TensorType:
        t = self.new_types.get(v)
        return t if t is not None else self.graph.types[v]

    def _is_weight(self, v: str) -> bool:
        return v in self.folds or v in self.graph.initializers

    def _eval(self, expr: Any) -> Any:
        try:
            return expr.run(self.env, self.index.functions)
        except EvalError:
            raise _Reject from None

    def _op(self, st: OpNode) -> None:
        graph, env = self.graph, self.env
        inputs: list[str] = []
        for a in st.inputs:
            if isinstance(a, Arg):
                v = env[a.var]
                if v is None:
                    if not a.optional:
                        raise _Reject
                    continue
                inputs.append(v)
            else:
                inputs.append(self._const(a))
        attrs: dict[str, Any] = dict(env[st.rest]) if st.rest is not None else {}
        for key, expr in st.attrs:
            attrs[key] = self._eval(expr)
        in_types = [self._type(v) for v in inputs]
        fold = bool(inputs) and all(self._is_weight(v) for v in inputs)
        # A folded op never reaches the graph: its attributes need no canonical form.
        attrs = {k: v for k, v in attrs.items() if v is not None} if fold else emitted(st.op, attrs, in_types)
        probe = Node("?", st.op, tuple(inputs), tuple(st.outputs), attrs)
        out_types = self._infer(probe, inputs, in_types)
        if fold:
            # Weights in, weights out: computed at rewrite time (TASO's preprocess_weights), free at run time.
            node_key = (st.op, probe.attr_key(), tuple(self._weight_key(v) for v in inputs))
            for i, (var, t) in enumerate(zip(st.outputs, out_types)):
                w = self._fresh(f"{self.rule.name}.w")
                self.folds[w] = _Fold(probe, i)
                self.fold_keys[w] = (node_key, i)
                self.new_types[w] = t
                self._define(var, w)
            return
        outs = []
        for var, t in zip(st.outputs, out_types):
            if var in self.rule.defined:
                old = env[var]
                if graph.types[old] != t:
                    raise _Reject  # the rewrite would change the type of a value others read
                outs.append(old)  # the new node computes the old value under its old name
            else:
                name = self._fresh(f"{self.rule.name}.{var.lstrip('%')}")
                self.new_types[name] = t
                outs.append(name)
        node = Node(self._fresh(self.rule.name), st.op, tuple(inputs), tuple(outs), attrs)
        self.added.append(node)
        for var, name in zip(st.outputs, outs):
            if var not in self.rule.defined:
                env[var] = name

    def _infer(self, probe: Node, inputs: list[str], in_types: list[TensorType]) -> list[TensorType]:
        """Output types of a target op, memoised per engine (many matches build the same op on the same
        types). The key holds the *values* of the shape-like inputs an op's inference reads, so it is
        valid across graphs; an op reading a big or non-constant input is not memoised."""
        key: tuple | None = (probe.op, probe.attr_key(), len(probe.outputs), tuple(in_types))
        if probe.op in _READS_CONSTS:
            for v in inputs[1:]:
                a = (self.exact(v) if v in self.folds else self.graph.initializers.get(v)) if v else None
                if a is None and v:
                    continue  # an activation: inference does not read it (or fails the same way)
                if a is not None and a.size > 64:
                    key = None
                    break
                key += (None,) if a is None else ((a.dtype.str, a.shape, a.tobytes()),)
        got = self.memo.get(key) if key is not None else None
        if got is None:
            try:
                got = infer_types(probe, in_types, _LazyConsts(self, inputs))
            except (ShapeInferenceError, EvalError):
                got = _REJECTED
            if key is not None:
                if len(self.memo) > 200_000:
                    self.memo.clear()
                self.memo[key] = got
        if got is _REJECTED:
            raise _Reject
        return got  # type: ignore[return-value]

    def _define(self, var: str, value: str) -> None:
        if var in self.rule.defined:
            self._redefine(var, value)
        else:
            self.env[var] = value

    def _redefine(self, var: str, value: str) -> None:
        old = self.env[var]
        if self._type(value) != self.graph.types[old]:
            raise _Reject
        self.rename[old] = value

    def _const(self, a: ConstArg) -> str:
        value = self._eval(a.expr)
        if a.kind == "ints":
            arr = np.asarray(value, dtype=np.int64)
        else:
            arr = np.asarray(value, dtype=np.dtype(self._type(self.env[a.like]).dtype))
        name = self._fresh(f"{self.rule.name}.c")
        self.folds[name] = _Fold(None, 0, arr)
        self.fold_keys[name] = ("const", arr.dtype.str, arr.shape, arr.tobytes())
        self.new_types[name] = TensorType.of(arr)
        return name

    def _weight_key(self, v: str) -> Any:
        """A weight's identity within this graph: its name, or for a new one what computes it."""
        return self.fold_keys[v] if v in self.folds else ("w", v)

    def exact(self, v: str) -> np.ndarray:
        """A new weight's value, computed now: shape inference of Reshape & co. needs it."""
        return fold_value(v, self.folds, self.graph.initializers, self._exact)

    def _delta_key(self, removed: list[Node]) -> tuple[tuple, bool]:
        """(a key equal for two candidates that make the same graph, whether this one is a no-op).

        Values outside the rewrite are keyed by name (exact within one parent); values inside by op,
        attributes and their inputs' keys, so the key ignores fresh names. The removed nodes and the
        new structure of each redefined value determine the rewritten graph.
        """
        local: dict[str, Any] = {}

        def key_of(v: str) -> Any:
            if v in local:
                return local[v]
            if v in self.folds:
                return self.fold_keys[v]
            return v

        def node_key(n: Node, attr_key: tuple) -> tuple:
            k = (n.op, attr_key, tuple(key_of(v) for v in n.inputs))
            for i, v in enumerate(n.outputs):
                local[v] = (k, i)
            return k

        roots = self.rule.roots
        new_nodes = [node_key(n, n.attr_key()) for n in self.added]  # added attributes are in emitted form
        new_roots = tuple(key_of(self.rename.get(self.env[r], self.env[r])) for r in roots)
        key = (frozenset(n.name for n in removed), tuple(zip((self.env[r] for r in roots), new_roots)))
        if Counter(n.op for n in removed) != Counter(n.op for n in self.added):
            return key, False
        # Same ops in and out: compare structures, the removed nodes' attributes in emitted form too.
        local.clear()
        types = self.graph.types
        old_nodes = [node_key(n, Node("?", n.op, (), (), emitted(n.op, n.attrs, [types[v] for v in n.inputs if v]))
                              .attr_key()) for n in removed]
        old_roots = tuple(key_of(self.env[r]) for r in roots)
        return key, Counter(old_nodes) == Counter(new_nodes) and old_roots == new_roots


class _LazyWeights:
    """name -> value of the rewrite's new weights, computed when a condition or inference asks."""

    def __init__(self, builder: _Builder) -> None:
        self.builder = builder

    def __contains__(self, v: object) -> bool:
        return v in self.builder.folds

    def __getitem__(self, v: str) -> np.ndarray:
        return self.builder.exact(v)


class _LazyConsts(Sequence):
    """The `consts` argument of `infer_types`: weight values, fetched only if inference reads them."""

    def __init__(self, builder: _Builder, inputs: list[str]) -> None:
        self.builder, self.inputs = builder, inputs

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: Any) -> Any:
        v = self.inputs[i]
        b = self.builder
        if v in b.folds:
            return b.exact(v)
        return b.graph.initializers.get(v)
