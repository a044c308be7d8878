"""The Applier: one match of a rule's source pattern in, the rewrite its target makes out.

`Applier.apply(index, rule, match)` instantiates the rule's target for the match (egg's Applier):
fresh names for new values and nodes, target ops whose inputs are all weights folded into new weights
(computed later, see `xrl.rewrite.candidate.Fold`), shape inference of every target op (memoised per
Applier: many matches build the same op on the same types), and a `delta_key` that is equal for two
rewrites making the same graph. A match whose target does not type-check, that would change the type
of a value others read, or turn a graph output into an input or a weight gives None.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from xrl.errors import ShapeInferenceError
from xrl.ir import Node, TensorType
from xrl.ir.ops import infer_types
from xrl.rewrite.attrs import emitted
from xrl.rewrite.candidate import Candidate, Fold, fold_value
from xrl.rewrite.expr import EvalError
from xrl.rewrite.lang import Alias, Arg, ConstArg, Omitted, OpNode, Rule
from xrl.rewrite.match import GraphIndex, Match


class Applied(NamedTuple):
    """A built rewrite: the candidate, a key equal for rewrites that make the same graph, and whether it
    rewrites the graph into itself."""

    candidate: Candidate
    delta_key: tuple
    noop: bool


class Applier:
    """Builds rewrites from matches; holds the shape-inference memo shared by every rule it applies."""

    def __init__(self) -> None:
        self._memo: dict[tuple, list[TensorType]] = {}

    def apply(self, index: GraphIndex, rule: Rule, match: Match) -> Applied | None:
        """The rewrite `rule` makes at `match` in `index.graph`, or None when it is not a valid rewrite."""
        return _Builder(index, rule, match, self._memo).build()


def creates_cycle(index: GraphIndex, cand: Candidate) -> bool:
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
        self.folds: dict[str, Fold] = {}
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

    def build(self) -> Applied | None:
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

    def _build(self) -> Applied:
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
        return Applied(cand, key, noop)

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
            elif isinstance(a, Omitted):
                inputs.append("")  # ONNX's empty name: an optional input not given
            else:
                inputs.append(self._const(a))
        attrs: dict[str, Any] = dict(env[st.rest]) if st.rest is not None else {}
        for key, expr in st.attrs:
            attrs[key] = self._eval(expr)
        in_types = [self._type(v) if v else None for v in inputs]
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
                self.folds[w] = Fold(probe, i)
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
        """Output types of a target op, memoised per Applier (many matches build the same op on the same
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
        self.folds[name] = Fold(None, 0, arr)
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
