"""Tensat's language in egglog: dataflow graphs as terms, and back.

    Tensor := input(name)              a graph input
            | weight(key)              a constant (`ConstTable` key)
            | none()                   an omitted optional input (ONNX's "")
            | op(op, attrs, Args)      an operator: ONNX op name ("domain::op" outside the default
                                       domain), an `AttrTable` key (attributes and output count)
            | t.out(i)                 output i of a multi-output op
    Args   := nil() | cons(Tensor, Args)

One generic `op` constructor (rather than one per operator, as Tensat has) because xrl's ops and
rules are data: the operator is a string the rule patterns fix. Shapes live in the analysis
(`analysis.py`), filled by the rules in `analysis_rules`.

`encode` puts a Graph into a fresh EGraph (shared values become shared e-classes), `export` reads
the e-graph back (public `EGraph.freeze()`: every e-class with its e-nodes) into plain
`TermNode`s, and `decode` turns a choice of one e-node per e-class into a Graph: constant ops are
folded into weights, the rest become nodes with fresh names, and the outputs keep their names.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from egglog import (
    EGraph,
    Expr,
    PyObject,
    Ruleset,
    String,
    StringLike,
    eq,
    function,
    i64,
    i64Like,
    rule,
    ruleset,
    set_,
    var,
)

from xrl.cost.base import CostModel
from xrl.ir import Graph, Node, TensorType
from xrl.search.tensat.analysis import NONE_INFO, Callback, ClassInfo, Context, parse_info
from xrl.search.tensat.extract import ENode, ExtractionProblem


class Args(Expr):
    """The argument list of an op, as a cons list (any arity, one constructor)."""

    @classmethod
    def nil(cls) -> Args: ...

    @classmethod
    def cons(cls, head: Tensor, tail: Args) -> Args: ...


class Tensor(Expr):
    """A value of the dataflow graph, or the tuple of a multi-output op's values."""

    @classmethod
    def input(cls, name: StringLike) -> Tensor: ...

    @classmethod
    def weight(cls, key: StringLike) -> Tensor: ...

    @classmethod
    def none(cls) -> Tensor: ...

    @classmethod
    def op(cls, op: StringLike, attrs: StringLike, args: Args) -> Tensor: ...

    def out(self, index: i64Like) -> Tensor: ...


def _py(fn: Callback, *args: object) -> PyObject:
    return PyObject(fn)(*args)


@function(merge=lambda old, new: _py(Callback("", "merge_info"), PyObject.from_string(old),
                                      PyObject.from_string(new)).to_string())
def info(t: Tensor) -> String:
    """The analysis value of an e-class (see analysis.py)."""


@function(merge=lambda old, new: _py(Callback("", "merge_args_info"), PyObject.from_string(old),
                                      PyObject.from_string(new)).to_string())
def args_info(a: Args) -> String:
    """The infos of an argument list, in order."""


def args(*items: Tensor) -> Args:
    out = Args.nil()
    for t in reversed(items):
        out = Args.cons(t, out)
    return out


def op_name(node: Node) -> str:
    return f"{node.domain}::{node.op}" if node.domain not in ("", "ai.onnx") else node.op


def analysis_rules(ctx: Context) -> Ruleset:
    """The analysis as egglog rules: `make` for every constructor (the merge is on the functions)."""
    t, s, h = var("t", Tensor), var("s", Tensor), var("h", Tensor)
    lst, tail = var("l", Args), var("tail", Args)
    o, a, li, hi, ti, si, name = (var(n, String) for n in ("o", "a", "li", "hi", "ti", "si", "name"))
    i = var("i", i64)
    s_ = PyObject.from_string
    return ruleset(
        rule(eq(t).to(Tensor.input(name))).then(
            set_(info(t)).to(_py(Callback(ctx.id, "input_info"), s_(name)).to_string())),
        rule(eq(t).to(Tensor.weight(name))).then(
            set_(info(t)).to(_py(Callback(ctx.id, "weight_info"), s_(name)).to_string())),
        rule(eq(t).to(Tensor.none())).then(set_(info(t)).to(NONE_INFO)),
        rule(eq(lst).to(Args.nil())).then(set_(args_info(lst)).to("")),
        rule(eq(lst).to(Args.cons(h, tail)), eq(hi).to(info(h)), eq(ti).to(args_info(tail))).then(
            set_(args_info(lst)).to(_py(Callback("", "join"), s_(hi), s_(ti)).to_string())),
        rule(eq(t).to(Tensor.op(o, a, lst)), eq(li).to(args_info(lst))).then(
            set_(info(t)).to(_py(Callback(ctx.id, "infer"), s_(o), s_(a), s_(li)).to_string())),
        rule(eq(t).to(s.out(i)), eq(si).to(info(s))).then(
            set_(info(t)).to(_py(Callback(ctx.id, "out_info"), s_(si), PyObject.from_int(i)).to_string())),
        name=f"analysis-{ctx.id}",
    )


# ----- Graph -> terms ----------------------------------------------------------------------------
@dataclass
class Encoding:
    """A graph in an e-graph: the term of each output, by position (let-bound as `$root<i>`)."""

    egraph: EGraph
    roots: list[Tensor]


def encode(graph: Graph, ctx: Context) -> Encoding:
    """A fresh EGraph holding `graph`; opaque ops get their recorded types (nothing infers them).

    Every node's term is let-bound as it is added, so each expression handed to egglog is one op
    over let-bound arguments. (Handing egglog-python 13.2 the whole graph as one expression DAG
    corrupts it: the conversion that shares repeated sub-expressions produced, for vit, an Add
    whose attribute key was the string "Softmax".)
    """
    egraph = EGraph()
    terms: dict[str, Tensor] = {"": egraph.let("none", Tensor.none())}
    for i, v in enumerate(graph.inputs):
        terms[v] = egraph.let(f"in{i}", Tensor.input(v))
    for i, (v, w) in enumerate(graph.initializers.items()):
        key = ctx.consts.add_array(w, key="w" + graph.weight_digest(v))
        ctx.weight_names.setdefault(key, v)
        terms[v] = egraph.let(f"w{i}", Tensor.weight(key))
    for i, node in enumerate(graph.topological_order):
        attrs = ctx.attrs.key(len(node.outputs), node.attrs)
        term = egraph.let(f"n{i}", Tensor.op(op_name(node), attrs, args(*(terms[v] for v in node.inputs))))
        if len(node.outputs) == 1:
            terms[node.outputs[0]] = term
        else:
            for k, v in enumerate(node.outputs):
                terms[v] = egraph.let(f"n{i}_{k}", term.out(k))
        if ctx.probe(op_name(node), attrs, "")[0] is None:
            egraph.register(set_(info(term)).to(ClassInfo(tuple(graph.types[v] for v in node.outputs)).render()))
    roots = [egraph.let(f"root{i}", terms[v]) for i, v in enumerate(graph.outputs)]
    return Encoding(egraph, roots)


# ----- the e-graph, read back ----------------------------------------------------------------------
@dataclass(frozen=True)
class TermNode:
    """One e-node of the exported e-graph.

    kind: "input" | "weight" | "none" | "op" | "out" | "nil" | "cons"; `value` is the input name,
    weight key, op name or output index; `attrs` the op's AttrTable key; `children` e-class ids.
    """

    id: str
    eclass: str
    kind: str
    value: str | int | None
    attrs: str | None
    children: tuple[str, ...]


@dataclass
class Export:
    nodes: dict[str, TermNode]
    infos: dict[str, ClassInfo | None]  # Tensor e-class -> analysis value
    roots: tuple[str, ...]  # e-class of each graph output

    def class_nodes(self) -> dict[str, list[TermNode]]:
        out: dict[str, list[TermNode]] = {}
        for n in self.nodes.values():
            out.setdefault(n.eclass, []).append(n)
        return out


def export(encoding: Encoding) -> Export:
    """Every e-class and e-node of the e-graph, with the analysis, from `EGraph.freeze()`."""
    from egglog.declarations import LitDecl, ValueDecl

    frozen = encoding.egraph.freeze().decl

    def cid(sort: str, value: object) -> str:
        return f"{sort}:{value}"  # e-class ids: "Tensor:Value(12)", "Args:Value(3)"

    nodes: dict[str, TermNode] = {}
    for value, (tp, calls) in frozen.e_classes.items():
        sort = tp.ident.name
        for k, call in enumerate(calls):
            kind = call.callable.method_name  # type: ignore[union-attr]
            lits = [a.expr.value for a in call.args if isinstance(a.expr, LitDecl)]
            kids = tuple(cid(a.tp.ident.name, a.expr.value) for a in call.args if isinstance(a.expr, ValueDecl))
            node_id = f"{cid(sort, value)}#{k}"
            val = lits[0] if kind in ("input", "weight", "op", "out") else None
            attrs = lits[1] if kind == "op" else None
            nodes[node_id] = TermNode(node_id, cid(sort, value), kind, val, attrs, kids)
    infos: dict[str, ClassInfo | None] = {}
    for call, typed in frozen.sets.items():
        if call.callable.ident.name == "info":  # type: ignore[union-attr]
            (arg,) = call.args
            infos[cid("Tensor", arg.expr.value)] = parse_info(typed.expr.value)  # type: ignore[union-attr]
    roots = []
    for i in range(len(encoding.roots)):
        typed = frozen.let_bindings[f"$root{i}"]
        roots.append(cid("Tensor", typed.expr.value))  # type: ignore[union-attr]
    return Export(nodes, infos, tuple(roots))


def arg_classes(args_class: str, node_of: Callable[[str], TermNode]) -> list[str]:
    """The Tensor e-classes of an Args e-class, walking the cons/nil e-node `node_of` gives per class.

    Any e-node will do: Args classes only ever merge by congruence (no rule unions two lists), so
    every cons e-node of one class has the same head and tail classes."""
    out: list[str] = []
    cls = args_class
    while True:
        node = node_of(cls)
        if node.kind == "nil":
            return out
        out.append(node.children[0])
        cls = node.children[1]


# ----- costs ---------------------------------------------------------------------------------------
def extraction_problem(exp: Export, cost_model: CostModel, ctx: Context) -> ExtractionProblem:
    """The e-graph with a cost per e-node: an op's cost under `cost_model` given its input types;
    zero for leaves, argument lists, output projections and ops on constants (folded, free)."""
    by_class = exp.class_nodes()
    costs: dict[str, float] = {}
    for n in exp.nodes.values():
        cost = 0.0
        if n.kind == "op":
            cost = _op_cost(exp, n, arg_classes(n.children[0], lambda c: by_class[c][0]), cost_model, ctx)
        costs[n.id] = cost
    nodes = {n.id: ENode(n.id, n.eclass, n.kind if n.kind != "op" else str(n.value), n.children, costs[n.id])
             for n in exp.nodes.values() if math.isfinite(costs[n.id])}
    return ExtractionProblem(nodes, exp.roots)


def _op_cost(exp: Export, n: TermNode, ins: Sequence[str], cost_model: CostModel, ctx: Context) -> float:
    infos = [exp.infos.get(c) for c in ins]
    own = exp.infos.get(n.eclass)
    if own is None:
        return math.inf  # a term the analysis could not type: never extract it
    if infos and all(i is not None and i.const is not None for i in infos):
        return 0.0  # constant inputs: folded into a weight
    name = str(n.value)
    domain, _, op = name.rpartition("::")
    n_out, attrs = ctx.attrs.get(str(n.attrs))
    types: dict[str, TensorType] = {}
    inits: dict[str, np.ndarray] = {}
    in_names = []
    for k, info_ in enumerate(infos):
        if info_ is None:
            in_names.append("")
            continue
        v = f"in{k}"
        in_names.append(v)
        types[v] = info_.types[0]
        if info_.const is not None:
            t = info_.types[0]
            inits[v] = np.broadcast_to(np.zeros((), t.dtype if t.dtype != "bfloat16" else "float32"), t.shape)
    outs = [f"out{k}" for k in range(n_out)]
    types.update(zip(outs, own.types))
    node = Node("enode", op, tuple(in_names), tuple(outs), attrs, domain)
    mini = Graph([node], [v for v in in_names if v and v not in inits], [], types, inits, name="enode")
    return cost_model.op_cost(node, mini)


# ----- terms -> Graph ------------------------------------------------------------------------------
def decode(exp: Export, choice: Mapping[str, str], graph: Graph, ctx: Context) -> Graph:
    """The graph the chosen e-nodes describe. Inputs, output names and the graph name are kept.

    A chosen op whose inputs are all constants is folded; a constant becomes a weight only where
    an emitted node or an output reads it (the folds inside a chain of constant ops never do).
    """
    from xrl.search.tensat.extract import chosen_nodes

    problem_nodes = {nid: ENode(nid, n.eclass, n.kind, n.children, 0.0) for nid, n in exp.nodes.items()}
    order = chosen_nodes(ExtractionProblem(problem_nodes, exp.roots), choice)
    out = _GraphBuilder(graph, ctx)
    for en in order:
        n = exp.nodes[en.id]
        cls, info_ = n.eclass, exp.infos.get(n.eclass)
        if n.kind == "input":
            out.values[cls] = str(n.value)
        elif n.kind == "weight":
            out.consts[cls] = (str(n.value), info_.types[0])  # type: ignore[union-attr]
        elif n.kind == "out":
            tup, k = n.children[0], int(n.value)  # type: ignore[arg-type]
            if tup in out.consts:
                key, _ = out.consts[tup]
                out.consts[cls] = (f"{key}/{k}", info_.types[0])  # type: ignore[union-attr]
            else:
                out.values[cls] = out.tuples[tup][k]
        elif n.kind == "op":
            assert info_ is not None, "extraction never picks an untyped e-node"
            ins = arg_classes(n.children[0], lambda c: exp.nodes[choice[c]])
            if ins and all(c in out.consts for c in ins):  # constant inputs: folded, as the rewrite engine folds
                assert info_.const is not None
                out.consts[cls] = (info_.const, info_.types[0] if len(info_.types) == 1 else None)
                continue
            out.emit(cls, str(n.value), str(n.attrs), ins, info_)
    return out.finish([out.value(c) for c in exp.roots])


class _GraphBuilder:
    """Accumulates the decoded graph: value names per e-class, constants materialised on first read."""

    def __init__(self, graph: Graph, ctx: Context) -> None:
        self.graph, self.ctx = graph, ctx
        self.values: dict[str, str] = {}  # Tensor e-class -> value name
        self.consts: dict[str, tuple[str, TensorType | None]] = {}  # e-class -> (const key, type)
        self.tuples: dict[str, list[str]] = {}  # multi-output e-class -> its output value names
        self.nodes: list[Node] = []
        self.types: dict[str, TensorType] = {v: graph.types[v] for v in graph.inputs}
        self.weights: dict[str, np.ndarray] = {}
        self.digests: dict[str, str] = {}
        self._by_key: dict[str, str] = {}
        self._taken = set(graph.inputs) | set(graph.initializers)
        self._counter = 0

    def fresh(self, prefix: str) -> str:
        while True:
            self._counter += 1
            name = f"{prefix}_{self._counter}"
            if name not in self._taken:
                self._taken.add(name)
                return name

    def value(self, cls: str) -> str:
        """The value name of an e-class; "" for an omitted input."""
        if cls in self.values:
            return self.values[cls]
        if cls not in self.consts:
            return ""  # none(): an omitted optional input
        key, t = self.consts[cls]
        name = self._by_key.get(key)
        if name is None:
            name = self._by_key[key] = self._weight(key, t)
        self.values[cls] = name
        return name

    def _weight(self, key: str, t: TensorType | None) -> str:
        original = self.ctx.weight_names.get(key)
        if original is not None:  # an original weight keeps its name
            self.weights[original] = self.graph.initializers[original]
            self.digests[original] = self.graph.weight_digest(original)
            self.types[original] = self.graph.types[original]
            return original
        assert t is not None
        name = self.fresh("tensat.w")
        arr = np.array(self.ctx.consts.value(key), dtype=t.dtype, order="C")  # 0-d stays 0-d
        if TensorType.of(arr) != t:
            raise AssertionError(f"constant {key} computes {TensorType.of(arr)}, typed {t}")
        arr.flags.writeable = False
        self.weights[name] = arr
        self.types[name] = t
        return name

    def emit(self, cls: str, op_key: str, attrs_key: str, ins: Sequence[str], info_: ClassInfo) -> None:
        n_out, attrs = self.ctx.attrs.get(attrs_key)
        domain, _, op = op_key.rpartition("::")
        outs = [self.fresh(f"tensat.{op}") for _ in range(n_out)]
        self.types.update(zip(outs, info_.types))
        self.nodes.append(Node(self.fresh(f"tensat.{op}"), op, tuple(self.value(c) for c in ins), tuple(outs), attrs,
                               domain))
        if n_out == 1:
            self.values[cls] = outs[0]
        else:
            self.tuples[cls] = outs

    def finish(self, outputs: list[str]) -> Graph:
        # A graph output must be computed by a node, and each by its own (as the rewrite engine keeps them).
        seen: set[str] = set()
        for k, v in enumerate(outputs):
            if v in seen or v in self.graph.inputs or v in self.weights:
                out = self.fresh("tensat.out")
                self.nodes.append(Node(self.fresh("tensat.Identity"), "Identity", (v,), (out,), {}))
                self.types[out] = self.types[v]
                outputs[k] = out
            seen.add(outputs[k])
        return Graph(self.nodes, self.graph.inputs, outputs, self.types, self.weights, name=self.graph.name,
                     output_names=self.graph.output_names, weight_digests=self.digests,
                     domain_opsets=self.graph.domain_opsets)
