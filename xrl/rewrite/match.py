"""Pattern matching: every place in a graph where a rule's source pattern fits.

Each rule is compiled once into a plan per possible anchor op: visit the anchor, then the other
pattern ops in an order where each is reached from an already bound value, through its producer
(one lookup) or through the consumers of one of its inputs (a short list). At match time the
anchor is the pattern op whose type is rarest in the graph, so a rule about BatchNormalization
never looks at a MatMul. Each `where` conjunct runs as soon as the variables it reads are bound.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from xrl.ir import Graph, Node, TensorType
from xrl.rewrite.attrs import COMMUTATIVE, normalized, same
from xrl.rewrite.expr import EvalError, function_table
from xrl.rewrite.lang import Arg, Condition, OpNode, Rule

# The time.perf_counter() by which enumeration must stop (a search's time limit), or None.
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("xrl_enumeration_deadline", default=None)


@contextlib.contextmanager
def enumeration_deadline(seconds: float | None) -> Iterator[None]:
    """Within this block, matching and candidate enumeration stop `seconds` from now (a search's
    `--time-limit`), even in the middle of one state's candidates; None leaves an outer deadline."""
    if seconds is None:
        yield
        return
    at = time.perf_counter() + max(seconds, 0.0)
    outer = _DEADLINE.get()
    token = _DEADLINE.set(at if outer is None else min(at, outer))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def deadline() -> float | None:
    return _DEADLINE.get()


# Called with each graph whose candidates are enumerated (one search step): a progress display.
_STEP_HOOK: contextvars.ContextVar[Any] = contextvars.ContextVar("xrl_step_hook", default=None)


@contextlib.contextmanager
def step_hook(hook: Any) -> Iterator[None]:
    token = _STEP_HOOK.set(hook)
    try:
        yield
    finally:
        _STEP_HOOK.reset(token)


@contextlib.contextmanager
def outside_search() -> Iterator[None]:
    """No deadline and no progress hook inside: for work a search triggers but does not own (verifying
    the rules when the engine first loads them must not be cut short by the search's time limit)."""
    t1, t2 = _DEADLINE.set(None), _STEP_HOOK.set(None)
    try:
        yield
    finally:
        _STEP_HOOK.reset(t2)
        _DEADLINE.reset(t1)


def on_step(graph: Graph) -> None:
    hook = _STEP_HOOK.get()
    if hook is not None:
        hook(graph)


def past_deadline() -> bool:
    at = _DEADLINE.get()
    return at is not None and time.perf_counter() >= at


class GraphIndex:
    """What matching needs of one graph, computed once per `candidates` call."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.by_op: dict[str, list[Node]] = {}
        for n in graph.nodes.values():
            if n.domain in ("", "ai.onnx"):
                self.by_op.setdefault(n.op, []).append(n)
        self.producers = graph.producers
        self.consumers = graph.consumers
        self.outputs = frozenset(graph.outputs)
        self._attrs: dict[str, tuple[dict[str, Any], frozenset[str]]] = {}
        self.values = GraphValues(graph)
        self.functions = function_table(self.values)

    def attrs(self, node: Node) -> tuple[dict[str, Any], frozenset[str]]:
        """The node's normalised attributes and the keys that are not at their default (cached)."""
        got = self._attrs.get(node.name)
        if got is None:
            types = [self.graph.types[v] for v in node.inputs if v]
            got = self._attrs[node.name] = normalized(node.op, node.attrs, types)
        return got

    @cached_property
    def topo_index(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.graph.topological_order)}


class GraphValues:
    """Types and weights of a graph, plus those a rewrite in progress adds (`local`)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.local_types: dict[str, TensorType] = {}
        self.local_weights: Any = None  # set by the Applier while it builds a rewrite: name -> ndarray on demand

    def type_of(self, value: str) -> TensorType:
        t = self.local_types.get(value)
        return t if t is not None else self.graph.types[value]

    def is_weight(self, value: str) -> bool:
        return value in self.graph.initializers or (self.local_weights is not None and value in self.local_weights)

    def weight_value(self, value: str) -> np.ndarray | None:
        w = self.graph.initializers.get(value)
        if w is None and self.local_weights is not None and value in self.local_weights:
            return self.local_weights[value]
        return w


@dataclass(frozen=True)
class Match:
    """Graph nodes for the rule's source ops (in `rule.source` order) and the variable bindings."""

    nodes: tuple[Node, ...]
    env: dict[str, Any]


@dataclass(frozen=True)
class _Step:
    index: int  # into rule.source
    via: str  # "anchor" | "producer" | "consumer"
    var: str | None
    conditions: tuple[Condition, ...]


class Matcher:
    """The compiled matching plans of one rule."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.plans = [self._plan(a) for a in range(len(rule.source))]
        self._deadline: float | None = None
        self._internal = [v for v in sorted(rule.defined) if v not in rule.roots]

    def _plan(self, anchor: int) -> tuple[_Step, ...]:
        src = self.rule.source
        placed = [anchor]
        links: list[tuple[str, str | None]] = [("anchor", None)]
        bound = set(_vars(src[anchor]))
        while len(placed) < len(src):
            best = None
            for i, node in enumerate(src):
                if i in placed:
                    continue
                out = next((v for v in node.outputs if v in bound), None)
                if out is not None:
                    best = (i, "producer", out)
                    break
                inp = next((a.var for a in node.inputs if isinstance(a, Arg) and not a.optional and a.var in bound),
                           None)
                if inp is not None and best is None:
                    best = (i, "consumer", inp)
            assert best is not None, "the parser guarantees a connected pattern"
            placed.append(best[0])
            links.append((best[1], best[2]))
            bound |= set(_vars(src[best[0]]))
        # Each condition runs after the first step that binds everything it reads.
        steps = []
        done: set[str] = set()
        seen: set[str] = set()
        for i, (via, var) in zip(placed, links):
            seen |= set(_vars(src[i]))
            conds = tuple(c for c in self.rule.conditions if c.expr.source not in done and c.expr.names <= seen)
            done |= {c.expr.source for c in conds}
            steps.append(_Step(i, via, var, conds))
        return tuple(steps)

    def matches(self, index: GraphIndex) -> Iterator[Match]:
        """Every match of the rule in the indexed graph, in a deterministic order."""
        src = self.rule.source
        counts = [len(index.by_op.get(n.op, ())) for n in src]
        if min(counts) == 0:
            return
        plan = self.plans[counts.index(min(counts))]
        assigned: list[Node | None] = [None] * len(src)
        self._deadline = deadline()
        yield from self._search(index, plan, 0, {}, assigned, set())

    def _search(self, index: GraphIndex, plan: tuple[_Step, ...], k: int, env: dict[str, Any],
                assigned: list[Node | None], used: set[str]) -> Iterator[Match]:
        if k == len(plan):
            nodes = tuple(assigned)  # type: ignore[arg-type]
            if self._valid(index, nodes, env):
                yield Match(nodes, env)
            return
        step = plan[k]
        pat = self.rule.source[step.index]
        if step.via == "anchor":
            options: list[Node] | tuple[Node, ...] = index.by_op.get(pat.op, ())
        elif step.via == "producer":
            p = index.producers.get(env[step.var])
            options = (p[0],) if p is not None and p[0].op == pat.op else ()
        else:
            options = [c for c in index.consumers.get(env[step.var], ()) if c.op == pat.op]
        for node in options:
            if node.name in used:
                continue
            if self._deadline is not None and time.perf_counter() >= self._deadline:
                return  # the search's time is up: a rule over many nodes must not outlast it
            for env2 in _bind(index, pat, node, env):
                if not all(_holds(c, env2, index) for c in step.conditions):
                    continue
                assigned[step.index] = node
                used.add(node.name)
                yield from self._search(index, plan, k + 1, env2, assigned, used)
                used.discard(node.name)
                assigned[step.index] = None

    def _valid(self, index: GraphIndex, nodes: tuple[Node, ...], env: dict[str, Any]) -> bool:
        names = {n.name for n in nodes}
        # An input of the pattern must come from outside it: else the rewrite would read a value it removes.
        for v in self.rule.inputs:
            value = env[v]
            p = index.producers.get(value) if value else None
            if p is not None and p[0].name in names:
                return False
        # Intermediates are private to the match, unless the rule shares them (their producers then stay).
        for v in self._internal:
            if v in self.rule.shared:
                continue
            value = env[v]
            if value in index.outputs or any(c.name not in names for c in index.consumers.get(value, ())):
                return False
        return True


def _vars(node: OpNode) -> list[str]:
    out = [a.var for a in node.inputs if isinstance(a, Arg)] + list(node.outputs)
    out += [p.var for p in node.attrs if p.var is not None]
    if node.rest is not None:
        out.append(node.rest)
    return out


def _holds(cond: Condition, env: dict[str, Any], index: GraphIndex) -> bool:
    try:
        return bool(cond.expr.run(env, index.functions))
    except EvalError:
        return False


def _unify(env: dict[str, Any], var: str, value: Any) -> bool:
    if var in env:
        return env[var] == value
    env[var] = value
    return True


def bind_attrs(pat: OpNode, values: Mapping[str, Any], raw: Mapping[str, Any], changed: set[str],
               env: dict[str, Any]) -> bool:
    """Bind `pat`'s attribute patterns against a node's attributes, extending `env`; False on a mismatch.

    `values` are the attributes with defaults filled in (`attrs.normalized`), `raw` as the node has them,
    and `changed` the keys whose value differs from the default: a pattern without `**rest` matches only
    if it names every such key. The rewrite engine's matcher and Tensat's rule guard both use this.
    """
    explicit = set()
    for p in pat.attrs:
        explicit.add(p.key)
        got = values.get(p.key)
        if p.var is None:
            if not same(got, p.literal):
                return False
        elif p.var in env:
            if not same(env[p.var], got):
                return False
        else:
            env[p.var] = got
    if pat.rest is not None:
        env[pat.rest] = {k: v for k, v in raw.items() if k not in explicit}
        return True
    return changed <= explicit


def _bind(index: GraphIndex, pat: OpNode, node: Node, env: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The extensions of `env` under which `pat` matches `node`."""
    if node.domain not in ("", "ai.onnx") or len(node.outputs) != len(pat.outputs):
        return
    ins = list(node.inputs)
    while ins and not ins[-1]:
        ins.pop()
    nreq = sum(not a.optional for a in pat.inputs)  # type: ignore[union-attr]
    if not nreq <= len(ins) <= len(pat.inputs) or not all(ins[:nreq]):
        return
    values, changed = index.attrs(node)
    base = dict(env)
    if not bind_attrs(pat, values, node.attrs, changed, base):
        return
    for v, out in zip(pat.outputs, node.outputs):
        if not _unify(base, v, out):
            return
    orders = [pat.inputs]
    if node.op in COMMUTATIVE and nreq == 2 and ins[0] != ins[1]:
        orders.append((pat.inputs[1], pat.inputs[0], *pat.inputs[2:]))
    for order in orders:
        e = dict(base)
        ok = True
        for i, a in enumerate(order):
            value = (ins[i] or None) if i < len(ins) else None
            if not _unify(e, a.var, value):  # type: ignore[union-attr]
                ok = False
                break
        if ok:
            yield e
