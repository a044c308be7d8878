"""xrl's rules as egglog rules.

Each rule becomes egglog rules per combination of its optional inputs (`opt(b)` present or
absent: argument lists have fixed lengths), in two stages that one saturation iteration runs in
turn (`Rewrites.search`, then `Rewrites.apply`):

- search: the *structure* of the source pattern, one fact per constructor
  (`eq(y).to(Tensor.op("Conv", a_i, l0))`, `eq(l0).to(Args.cons(x, l1))`, ..., with `.out(k)` for
  the outputs of a multi-output op), and `ne` between two source ops of the same type (as the
  matcher never uses one node twice). A multi-output rule (TASO's, e.g. two MatMuls sharing an
  input) is a multi-pattern: several such facts joined on their shared variables. Each match
  becomes a row of the variant's match relation (its tensor classes and attribute keys).
- apply: a match row, `info(v)` of each of its tensor classes, and one guard: a Python call that
  does what egglog's primitives cannot, exactly as the rewrite engine does it: attribute patterns
  (normalised attributes, literals, `**rest`), the `where` conditions (shapes, weights, values),
  and a dry run of the target with shape inference (Tensat's shape check: an ill-typed target is
  never added). Its actions build the target's terms from the matched classes, with each new
  op's attributes and each new constant (`ints(...)`, `const(...)`) computed by the same Python
  plan, and `union(old, new)` every value the target redefines. Target ops on constants stay
  terms: the analysis marks them constant, extraction costs them zero and decoding folds them.

Why two stages and flat facts: while debugging, rules that joined several nested patterns with
`info` lookups unioned unrelated classes on `mlp` (every [1, 256] Add in one e-class). The cause
turned out to be egglog-python 13.2 corrupting a large shared expression when converting it
(see `language.encode`), not the query itself; but a query of constructors only, and a query of
one relation row plus lookups, are the simplest shapes egglog plans, and keeping each match as a
row makes matches easy to count and inspect, so the split stays.

Commutativity (Add, Mul, Max, Min, Equal), which the matcher gets by trying both operand orders,
is a rewrite of its own here, as in Tensat's rule set.

What does not carry over, and why: the engine's checks that a rewrite may *remove* nodes (an
intermediate value must have no other consumer unless `shared`; a pattern input must not be
computed inside the match) guard a destructive graph edit; an e-graph only adds equalities, so
they do not apply, and a rule is valid wherever its equality is. A condition that compares two
tensor variables as values (`a == b`) cannot be checked from the variables' infos; a rule with
one is reported as untranslated (no built-in rule has one). Everything else in the rule language
translates.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from egglog import Bool, PyObject, Ruleset, String, eq, ne, relation, rule, ruleset, union, var

from xrl.errors import XrlError
from xrl.ir import Node, TensorType
from xrl.ir.ops import infer_types
from xrl.rewrite.attrs import COMMUTATIVE, emitted, normalized
from xrl.rewrite.expr import EvalError, function_table
from xrl.rewrite.lang import Alias, Arg, ConstArg, Omitted, OpNode, Rule
from xrl.rewrite.match import bind_attrs
from xrl.search.tensat.analysis import Callback, ClassInfo, Context, parse_info
from xrl.search.tensat.language import Args, Tensor, args, info


@dataclass
class Coverage:
    """Which rules became egglog rules (and how many variants), and which did not, with why."""

    translated: dict[str, int] = field(default_factory=dict)  # rule -> egglog rules (optional-input variants)
    skipped: dict[str, str] = field(default_factory=dict)  # rule -> reason

    @property
    def egglog_rules(self) -> int:
        return sum(self.translated.values())


@dataclass(frozen=True)
class _Variant:
    """One rule with each optional input fixed present or absent."""

    id: str
    rule: Rule
    present: dict[str, bool]  # optional variable -> present
    tensor_vars: tuple[str, ...]  # bound tensor variables (free inputs present, then computed values), in order


@dataclass(frozen=True)
class Rewrites:
    """The rulesets one saturation iteration runs: search, then apply (see the module doc); the
    multi-pattern rules (rules that redefine two or more values) in rulesets of their own, which
    the runner stops after a few iterations, as Tensat does."""

    search: Ruleset  # structural matches -> match relations; commutativity
    apply: Ruleset  # match relations + analysis + guard -> new terms and unions
    search_multi: Ruleset
    apply_multi: Ruleset


def translate(rules: Sequence[Rule], ctx: Context) -> tuple[Rewrites, Coverage]:
    """egglog rules for `rules` (plus commutativity), with their plans registered on `ctx`."""
    planner = _Planner(ctx)
    ctx.handlers["guard"] = planner.guard
    ctx.handlers["field"] = planner.field
    coverage = Coverage()
    search: list[Any] = list(_commutativity())
    apply: list[Any] = []
    search_multi: list[Any] = []
    apply_multi: list[Any] = []
    for r in rules:
        why = _untranslatable(r)
        if why:
            coverage.skipped[r.name] = why
            continue
        variants = _variants(r)
        try:
            built = [_egg_rule(v, ctx) for v in variants]
        except (XrlError, ValueError, TypeError) as e:  # an egglog construction error: report, not crash
            coverage.skipped[r.name] = f"egglog rejected the translation: {e}"
            continue
        for v in variants:
            planner.variants[v.id] = v
        for found, applied in built:
            (search_multi if r.is_multi_output else search).append(found)
            (apply_multi if r.is_multi_output else apply).append(applied)
        coverage.translated[r.name] = len(built)
    rewrites = Rewrites(ruleset(*search, name=f"search-{ctx.id}"), ruleset(*apply, name=f"apply-{ctx.id}"),
                        ruleset(*search_multi, name=f"search-multi-{ctx.id}"),
                        ruleset(*apply_multi, name=f"apply-multi-{ctx.id}"))
    return rewrites, coverage


def _untranslatable(r: Rule) -> str:
    tensor_vars = set(r.inputs) | set(r.defined)
    for c in r.conditions:
        tree = ast.parse(c.expr.source, mode="eval")
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                names = [x.id for x in [node.left, *node.comparators] if isinstance(x, ast.Name)]
                if sum(n in tensor_vars for n in names) >= 2:
                    return f"condition {c.expr.source!r} compares tensors by identity, which infos cannot tell"
    return ""


def _variants(r: Rule) -> list[_Variant]:
    optional = sorted(r.optional)
    out = []
    for k, combo in enumerate(itertools.product((True, False), repeat=len(optional))):
        present = dict(zip(optional, combo))
        bound = [v for v in r.inputs if present.get(v, True)] + [v for v in _defined_in_order(r)]
        out.append(_Variant(f"{r.name}#{k}", r, present, tuple(bound)))
    return out


def _defined_in_order(r: Rule) -> list[str]:
    return [v for node in r.source for v in node.outputs]


def _safe(name: str) -> str:
    return "t" + "".join(c if c.isalnum() else "_" for c in name)


class _Facts:
    """Query facts with every constructor application flattened into its own fact.

    egglog 13 can lose the join between a nested pattern and the rest of a query when the query
    also looks up functions (`info`) of several of its variables: the nested term's root becomes a
    cross product over every e-node with its op. One constructor per fact, joined through
    explicit variables, is the same query and is planned correctly.
    """

    def __init__(self) -> None:
        self.facts: list[Any] = []
        self.nil = var("nil", Args)
        self.facts.append(eq(self.nil).to(Args.nil()))
        self._lists = itertools.count()

    def op(self, out: Any, op: str, attrs: Any, items: Sequence[Any]) -> None:
        tail = self.nil
        for item in reversed(items):
            lst = var(f"l{next(self._lists)}", Args)
            self.facts.append(eq(lst).to(Args.cons(item, tail)))
            tail = lst
        self.facts.append(eq(out).to(Tensor.op(op, attrs, tail)))


def _commutativity() -> list[Any]:
    t, a, b = var("t", Tensor), var("a", Tensor), var("b", Tensor)
    at = var("at", String)
    out = []
    for op in sorted(COMMUTATIVE):
        q = _Facts()
        q.op(t, op, at, [a, b])
        out.append(rule(*q.facts, name=f"commute-{op}").then(union(t).with_(Tensor.op(op, at, args(b, a)))))
    return out


def _egg_rule(v: _Variant, ctx: Context) -> tuple[Any, Any]:
    """(the search rule: structure -> a row of the variant's match relation; the apply rule: a match
    row, the analysis of its classes and the guard -> the target's terms and unions)."""
    r = v.rule
    tv = {name: var(_safe(name), Tensor) for name in v.tensor_vars}
    attrs = [var(f"a{i}", String) for i in range(len(r.source))]
    infos = {name: var("i" + _safe(name), String) for name in v.tensor_vars}
    q = _Facts()
    outs_by_op: dict[str, list[Any]] = {}
    for i, p in enumerate(r.source):
        ins = [tv[a.var] for a in p.inputs if isinstance(a, Arg) and v.present.get(a.var, True)]
        if len(p.outputs) == 1:
            q.op(tv[p.outputs[0]], p.op, attrs[i], ins)
            outs_by_op.setdefault(p.op, []).append(tv[p.outputs[0]])
        else:
            tup = var(f"s{i}", Tensor)
            q.op(tup, p.op, attrs[i], ins)
            q.facts.extend(eq(tv[o]).to(tup.out(k)) for k, o in enumerate(p.outputs))
            outs_by_op.setdefault(p.op, []).append(tup)
    for same_op in outs_by_op.values():
        q.facts.extend(ne(x).to(y) for x, y in itertools.combinations(same_op, 2))
    columns = [tv[n] for n in v.tensor_vars] + attrs
    found = relation(f"match-{v.id}-{ctx.id}", *([Tensor] * len(v.tensor_vars) + [String] * len(attrs)))
    facts: list[Any] = [found(*columns)]
    facts.extend(eq(infos[n]).to(info(tv[n])) for n in v.tensor_vars)
    strings = [PyObject.from_string(a) for a in attrs] + [PyObject.from_string(infos[n]) for n in v.tensor_vars]
    vid = PyObject.from_string(v.id)
    facts.append(eq(PyObject(Callback(ctx.id, "guard"))(vid, *strings).to_bool()).to(Bool(True)))

    slot = itertools.count()

    def field_(k: int) -> Any:
        return PyObject(Callback(ctx.id, "field"))(vid, PyObject.from_int(k), *strings).to_string()

    terms: dict[str, Any] = {n: tv[n] for n in r.inputs if v.present.get(n, True)}
    for st in r.target:
        if isinstance(st, Alias):
            terms[st.output] = terms[st.source]
            continue
        ins = []
        for a in st.inputs:
            if isinstance(a, Arg):
                if v.present.get(a.var, True):
                    ins.append(terms[a.var])
            elif isinstance(a, Omitted):
                ins.append(Tensor.none())
            else:
                ins.append(Tensor.weight(field_(next(slot))))
        term = Tensor.op(st.op, field_(next(slot)), args(*ins))
        if len(st.outputs) == 1:
            terms[st.outputs[0]] = term
        else:
            for k, o in enumerate(st.outputs):
                terms[o] = term.out(k)
    actions = [union(tv[root]).with_(terms[root]) for root in r.roots]
    return (rule(*q.facts, name=f"search {v.id}").then(found(*columns)),
            rule(*facts, name=f"apply {v.id}").then(*actions))


# ----- the Python side of each match ---------------------------------------------------------------
class _Reject(Exception):
    """This match is not a valid rewrite."""


class _MatchValues:
    """`xrl.rewrite.expr.Values` over a match: tensor variables are tokens with infos, not graph values."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.types: dict[str, TensorType] = {}
        self.consts: dict[str, str] = {}  # token -> const key

    def bind(self, token: str, info_: ClassInfo) -> None:
        self.types[token] = info_.types[0]
        if info_.const is not None:
            self.consts[token] = info_.const

    def type_of(self, value: str) -> TensorType:
        return self.types[value]

    def is_weight(self, value: str) -> bool:
        return value in self.consts

    def weight_value(self, value: str) -> np.ndarray | None:
        key = self.consts.get(value)
        return self.ctx.consts.value(key) if key is not None else None


@dataclass
class _Plan:
    fields: tuple[str, ...]  # attribute keys and constant keys, in the order `_egg_rule` asks for them


class _Planner:
    """Guards and attribute computation for every rule variant, memoised per match."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.variants: dict[str, _Variant] = {}
        self._memo: dict[tuple, _Plan | None] = {}

    def guard(self, vid: str, *strings: str) -> bool:
        return self._plan(vid, strings) is not None

    def field(self, vid: str, k: int, *strings: str) -> str:
        plan = self._plan(vid, strings)
        assert plan is not None, "egglog applies a rule only where its guard held"
        return plan.fields[k]

    def _plan(self, vid: str, strings: tuple[str, ...]) -> _Plan | None:
        key = (vid, strings)
        if key not in self._memo:
            try:
                self._memo[key] = self._build(self.variants[vid], strings)
            except _Reject:
                self._memo[key] = None
        return self._memo[key]

    def _build(self, v: _Variant, strings: tuple[str, ...]) -> _Plan:
        r, ctx = v.rule, self.ctx
        n_ops = len(r.source)
        values = _MatchValues(ctx)
        env: dict[str, Any] = {}
        for name, text in zip(v.tensor_vars, strings[n_ops:]):
            parsed = parse_info(text)
            if parsed is None or len(parsed.types) != 1:
                raise _Reject  # an omitted input, an untyped class, or a tuple where a tensor belongs
            values.bind(name, parsed)
            env[name] = name
        for name, present in v.present.items():
            if not present:
                env[name] = None
        functions = function_table(values)
        for p, attrs_key in zip(r.source, strings[:n_ops]):
            self._bind_attrs(p, attrs_key, env, values)
        for c in r.conditions:
            if not _holds(c.expr, env, functions):
                raise _Reject
        return _Plan(tuple(self._dry_run(v, env, values, functions)))

    def _bind_attrs(self, p: OpNode, attrs_key: str, env: dict[str, Any], values: _MatchValues) -> None:
        """The matcher's attribute rules (xrl.rewrite.match._bind) on one matched op."""
        n_outputs, raw = self.ctx.attrs.get(attrs_key)
        if n_outputs != len(p.outputs):
            raise _Reject
        in_types = [values.types[a.var] for a in p.inputs if isinstance(a, Arg) and env.get(a.var) is not None]
        normal, changed = normalized(p.op, raw, in_types)
        if not bind_attrs(p, normal, raw, changed, env):
            raise _Reject

    def _dry_run(self, v: _Variant, env: dict[str, Any], values: _MatchValues, functions: dict) -> list[str]:
        """The target, instantiated as the rewrite engine instantiates it: the attribute key of each
        new op and the key of each new constant, in target order; rejects what does not type-check."""
        r, ctx = v.rule, self.ctx
        fields: list[str] = []
        fresh = itertools.count()
        for st in r.target:
            if isinstance(st, Alias):
                self._define(r, st.output, env[st.source], env, values)
                continue
            inputs: list[str] = []
            for a in st.inputs:
                if isinstance(a, Arg):
                    if env.get(a.var) is None:
                        if not a.optional:
                            raise _Reject
                        continue
                    inputs.append(env[a.var])
                elif isinstance(a, Omitted):
                    inputs.append("")  # none(): an omitted optional input
                else:
                    token, key = self._const(a, env, values, functions, f"%c{next(fresh)}")
                    inputs.append(token)
                    fields.append(key)
            attrs: dict[str, Any] = dict(env[st.rest]) if st.rest is not None else {}
            for key, expr in st.attrs:
                attrs[key] = _run(expr, env, functions)
            in_types = [values.types[t] if t else None for t in inputs]
            attrs = emitted(st.op, attrs, in_types)
            probe = Node("probe", st.op, tuple(inputs), tuple(st.outputs), attrs)
            try:
                out_types = infer_types(probe, in_types, [values.weight_value(t) if t else None for t in inputs])
            except (XrlError, EvalError):
                raise _Reject from None
            fields.append(ctx.attrs.key(len(st.outputs), attrs))
            fold = None
            if inputs and all(t and values.is_weight(t) for t in inputs):
                fold = ctx.consts.add_fold(probe, [values.consts[t] for t in inputs])
            for k, (out, t) in enumerate(zip(st.outputs, out_types)):
                token = f"%n{next(fresh)}"
                values.types[token] = t
                if fold is not None:
                    values.consts[token] = f"{fold}/{k}"
                self._define(r, out, token, env, values)
        return fields

    @staticmethod
    def _define(r: Rule, var_: str, token: str, env: dict[str, Any], values: _MatchValues) -> None:
        if var_ in r.defined and values.types[token] != values.types[env[var_]]:
            raise _Reject  # the rewrite would change the type of a value others read
        if var_ not in r.defined:
            env[var_] = token

    def _const(self, a: ConstArg, env: dict[str, Any], values: _MatchValues, functions: dict,
               token: str) -> tuple[str, str]:
        value = _run(a.expr, env, functions)
        try:
            if a.kind == "ints":
                arr = np.asarray(value, dtype=np.int64)
            else:
                arr = np.asarray(value, dtype=np.dtype(values.types[env[a.like]].dtype))
        except (TypeError, ValueError):
            raise _Reject from None
        key = self.ctx.consts.add_array(arr)
        values.types[token] = TensorType.of(arr)
        values.consts[token] = key
        return token, key


def _run(expr: Any, env: dict[str, Any], functions: dict) -> Any:
    try:
        return expr.run(env, functions)
    except EvalError:
        raise _Reject from None


def _holds(expr: Any, env: dict[str, Any], functions: dict) -> bool:
    try:
        return bool(expr.run(env, functions))
    except EvalError:
        return False
