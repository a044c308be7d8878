"""The rule language: rewrite rules as data, parsed from text files in `rewrite_rules/`.

A rule file holds rules like this one (indentation is free; `#` starts a comment)::

    # Merge two MatMuls that share their left operand: concat the weights, split the output
    rule merge_matmul_2 family=merge
      y1 = MatMul(x, w1, activation=a)
      y2 = MatMul(x, w2, activation=a)
      where weight(w1) and weight(w2) and rank(w1) == 2 and rank(w2) == 2
      =>
      y1, y2 = Split(MatMul(x, Concat(w1, w2, axis=1), activation=a), axis=rank(y1) - 1,
                     split=(dim(w1, 1), dim(w2, 1)))
      example x=[B, M, K], w1=[K, N], w2=[K, P]

Every line is a Python expression or assignment, restricted (see `xrl.rewrite.expr`) and parsed
with `ast`:

- The comment directly above `rule` says what the rule does (required). The header names the rule,
  its `family` and its `kind`: `kind=elementary` (one algebraic step) or `kind=composite` (one step
  that does what a sequence of elementary rules does, e.g. merge_lowrank_* = fold the scale, move the
  bias, reassociate, factor; its elementary steps must exist as rules too, so that the `elementary`
  rule set reaches the same graph). A header without `kind=` is elementary; the built-in files declare
  it on every rule (`xrl rules list` shows it). `in_all=no` leaves an elementary rule out of the `all`
  set (the default optimisation's): a step only a composite needs, which the default search, alone, would
  take where the composite does better. Named rule sets select by kind and file (`xrl.rewrite.rules`,
  `--rules all|elementary|composite|<file stem>`, joined with `+`).
  `tags=a,b` declares what a stage selects rules by, one of TAGS: `tags=exact_merge` marks a rule that merges an
  adapter into its layer's weights exactly (`xrl.deploy.exact_merges` takes those before the pre-passes).
  `shared=t,u` lets the intermediate values t, u keep other consumers (their
  producers then stay); any other `key=A|B|C` makes the rule a template, expanded once per value
  with `{key}` substituted in its name, comment and body.
- Source lines (before `=>`) are ops over pattern variables. An argument is a variable, a nested op
  call, or `opt(b)` (a trailing optional input: bound to None when absent). A keyword binds an
  attribute variable (`strides=s`) or requires a literal (`activation=None`); `**a` binds every
  other attribute, and without it the node's other attributes must all be at their defaults.
  Add, Mul, Max, Min and Equal match either operand order.
- `where` conditions (several lines are and-ed) see tensor variables as value names, and the
  functions of `xrl.rewrite.expr` (`shape`, `rank`, `dim`, `weight`, `value`, ...).
- Target lines (after `=>`) build the replacement: op calls whose attributes are expressions,
  `ints(expr)` / `const(expr, like)` for new constant weights, `None` for an optional input left
  empty before a given one (`MultiHeadAttention(q, k, v, None, None, bias)`), `**a` to copy bound
  attributes, and plain aliases `y = x`. A target line that assigns a source value (y1 above) *redefines* it:
  every use of the old value now reads the new one. Source values the target does not redefine are
  intermediates and must have no other consumer (unless `shared`). A new value nothing reads is an
  error, except one named `_name`: an output an op must have in its place (`y, _mean, _inv, s = ...`).
- `example` lines give the verifier shapes to instantiate the rule with: `x=[B, M, K]` (symbols
  are drawn at random, `H=between(5, 9)` bounds one), `s=choice((1, 1), (2, 2))`, and value kinds
  `v=positive([C])`, `c=fill([1], 1.0)`, `m=causal([S, S], -1e38)` (0 on and below the diagonal).

Errors in a rule file raise `RuleSyntaxError` with `file:line: problem`.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xrl.errors import XrlError
from xrl.ir.ops import OPS
from xrl.rewrite.attrs import arity
from xrl.rewrite.expr import PURE_FUNCTIONS, Compiled, check

FAMILIES = ("merge", "fusion", "distributivity", "associativity", "transpose", "concat_split", "reshape",
            "algebraic")
EXAMPLE_FUNCTIONS = frozenset(PURE_FUNCTIONS) | {"between", "choice", "fill", "causal", "positive", "ints"}
TARGET_CONSTS = ("ints", "const")
KINDS = ("elementary", "composite")
# what a stage selects rules by (a header's `tags=`), so that renaming a rule cannot drop it from the stage
TAGS = ("exact_merge",)


class RuleSyntaxError(XrlError):
    """A rule file that does not parse: the message is `file:line: problem`."""

    def __init__(self, file: str, line: int, problem: str) -> None:
        super().__init__(f"{file}:{line}: {problem}")
        self.file, self.line, self.problem = file, line, problem


# ----- the parsed form -------------------------------------------------------------------------
@dataclass(frozen=True)
class Arg:
    """A tensor argument: a pattern variable, optionally an absent-able trailing input."""

    var: str
    optional: bool = False


@dataclass(frozen=True)
class ConstArg:
    """Target only: a new constant weight, `ints(expr)` (int64) or `const(expr, like)` (like's dtype)."""

    expr: Compiled
    kind: str
    like: str | None = None


@dataclass(frozen=True)
class Omitted:
    """Target only: `None`, an optional input left empty so that a later one can be given (onnxruntime's
    MultiHeadAttention takes its mask as input 4 or 5, after a bias a fusion may not have)."""


@dataclass(frozen=True)
class AttrPat:
    """A source attribute: binds `var`, or must equal `literal`."""

    key: str
    var: str | None
    literal: Any = None


@dataclass(frozen=True)
class OpNode:
    """One op of a pattern. Source attrs are AttrPats; target attrs are (key, expression) pairs."""

    op: str
    inputs: tuple[Arg | ConstArg | Omitted, ...]
    outputs: tuple[str, ...]
    attrs: tuple[Any, ...]
    rest: str | None
    line: int


@dataclass(frozen=True)
class Alias:
    """Target only: `output = source`, the output is redefined as an existing value."""

    output: str
    source: str
    line: int


@dataclass(frozen=True)
class Condition:
    expr: Compiled
    line: int


@dataclass(frozen=True)
class RuleInfo:
    """A rule's summary, JSON-ready (`dataclasses.asdict`)."""

    name: str
    family: str
    comment: str
    source_ops: int
    target_ops: int
    multi_output: bool
    location: str
    kind: str = "elementary"


@dataclass(frozen=True, eq=False)
class Rule:
    name: str
    family: str
    comment: str
    file: str
    line: int
    source: tuple[OpNode, ...]
    target: tuple[OpNode | Alias, ...]
    conditions: tuple[Condition, ...]
    shared: frozenset[str]
    example: tuple[tuple[str, Compiled], ...]
    inputs: tuple[str, ...]  # free tensor variables of the source, in first-use order
    defined: frozenset[str]  # tensor variables the source computes
    roots: tuple[str, ...]  # source values the target redefines: the rule's outputs
    attr_vars: frozenset[str]
    optional: frozenset[str]
    text: str = field(repr=False, default="")
    kind: str = "elementary"  # or "composite": see the module docstring
    in_all: bool = True  # in the `all` rule set (header `in_all=no`: the elementary set only)
    tags: frozenset[str] = frozenset()  # header `tags=...`, each one of TAGS

    @property
    def source_ops(self) -> int:
        return len(self.source)

    @property
    def target_ops(self) -> int:
        return sum(isinstance(s, OpNode) for s in self.target)

    @property
    def is_multi_output(self) -> bool:
        """TASO's multi-output rules / Tensat's multi-patterns: the rewrite redefines 2+ values."""
        return len(self.roots) >= 2

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"

    def info(self) -> RuleInfo:
        return RuleInfo(self.name, self.family, self.comment, self.source_ops, self.target_ops,
                        self.is_multi_output, self.location, self.kind)

    def __repr__(self) -> str:
        return f"Rule({self.name!r}, {self.family}, {self.location})"


# ----- files -----------------------------------------------------------------------------------
def parse_file(path: str | Path) -> list[Rule]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise RuleSyntaxError(str(path), 0, f"cannot read the rule file ({e.strerror})") from None
    return parse_rules(text, str(path))


def parse_rules(text: str, file: str = "<rules>") -> list[Rule]:
    """Every rule in `text` (templates expanded), in file order. Raises RuleSyntaxError."""
    lines = text.splitlines()
    headers = [i for i, ln in enumerate(lines) if ln.strip().split(" ", 1)[0] == "rule"]
    rules: list[Rule] = []
    for i, ln in enumerate(lines[: headers[0] if headers else len(lines)]):
        if ln.strip() and not ln.strip().startswith("#"):
            raise RuleSyntaxError(file, i + 1, f"expected 'rule NAME family=...', found {ln.strip()!r}")
    for k, h in enumerate(headers):
        comment = []
        j = h - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            comment.insert(0, lines[j].strip().lstrip("#").strip())
            j -= 1
        end = headers[k + 1] if k + 1 < len(headers) else len(lines)
        while end - 1 > h and lines[end - 1].strip().startswith("#"):
            end -= 1  # the next rule's comment block
        body = [(n + 1, lines[n]) for n in range(h + 1, end)]
        rules.extend(_parse_block(file, h + 1, lines[h].strip(), " ".join(comment), body))
    names: dict[str, Rule] = {}
    for r in rules:
        if r.name in names:
            raise RuleSyntaxError(file, r.line, f"rule {r.name!r} is defined twice (first at line "
                                                f"{names[r.name].line})")
        names[r.name] = r
    return rules


_PARAM = re.compile(r"\{(\w+)\}")


def _parse_block(file: str, line: int, header: str, comment: str, body: list[tuple[int, str]]) -> list[Rule]:
    parts = header.split()
    if len(parts) < 2:
        raise RuleSyntaxError(file, line, "a rule needs a name: 'rule NAME family=...'")
    name, options = parts[1], {}
    for opt in parts[2:]:
        key, eq, value = opt.partition("=")
        if not eq or not key or not value:
            raise RuleSyntaxError(file, line, f"header option {opt!r} is not key=value")
        options[key] = value
    family = options.pop("family", None)
    if family is None:
        raise RuleSyntaxError(file, line, f"rule {name!r} has no family=... (one of {', '.join(FAMILIES)})")
    shared = options.pop("shared", "")
    kind = options.pop("kind", "elementary")
    if kind not in KINDS:
        raise RuleSyntaxError(file, line, f"rule {name!r}: unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    in_all = options.pop("in_all", "yes")
    if in_all not in ("yes", "no") or (in_all == "no" and kind != "elementary"):
        raise RuleSyntaxError(file, line, f"rule {name!r}: in_all is yes or no, and no only for an elementary rule")
    tags = frozenset(t for t in options.pop("tags", "").split(",") if t)
    if not tags <= set(TAGS):
        raise RuleSyntaxError(file, line, f"rule {name!r}: unknown tag {sorted(tags - set(TAGS))[0]!r}; choose from "
                                          f"{', '.join(TAGS)}")
    params = {k: v.split("|") for k, v in options.items()}
    for p in _PARAM.findall(name):
        if p not in params:
            raise RuleSyntaxError(file, line, f"rule name {name!r} uses {{{p}}}, which the header does not define")
    if params and not _PARAM.search(name):
        raise RuleSyntaxError(file, line, f"template rule {name!r} must use its parameters in its name")
    out = []
    for combo in itertools.product(*params.values()) if params else [()]:
        sub = dict(zip(params, combo))
        fill = lambda s, sub=sub: _PARAM.sub(lambda m: sub.get(m.group(1), m.group(0)), s)
        rule = _parse_rule(file, line, fill(name), family, fill(comment), shared, [(n, fill(t)) for n, t in body])
        out.append(dataclasses.replace(rule, kind=kind, in_all=in_all == "yes", tags=tags))
    return out


def _logical_lines(b: _Builder, body: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Join lines inside open brackets; drop comments and blank lines."""
    out: list[tuple[int, str]] = []
    buf, start, depth = "", 0, 0
    for n, raw in body:
        text = raw.split("#", 1)[0].rstrip()
        if not text.strip() and depth == 0:
            continue
        if depth == 0:
            start, buf = n, text.strip()
        else:
            buf += " " + text.strip()
        depth += sum(text.count(c) for c in "([{") - sum(text.count(c) for c in ")]}")
        if depth < 0:
            raise b.error(n, "unbalanced brackets")
        if depth == 0:
            out.append((start, buf))
    if depth:
        raise b.error(start, "unclosed bracket")
    return out


# ----- one rule --------------------------------------------------------------------------------
class _Builder:
    """Parses the statements of one rule and checks its variables."""

    def __init__(self, file: str, name: str) -> None:
        self.file, self.name = file, name
        self.tmp = 0

    def error(self, line: int, problem: str) -> RuleSyntaxError:
        return RuleSyntaxError(self.file, line, f"rule {self.name}: {problem}")

    def fresh(self) -> str:
        self.tmp += 1
        return f"%{self.tmp}"

    def statement(self, n: int, text: str, target: bool) -> list[OpNode | Alias]:
        try:
            tree = ast.parse(text, mode="exec")
        except SyntaxError as e:
            raise self.error(n, f"syntax error: {e.msg}") from None
        if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assign) or len(tree.body[0].targets) != 1:
            raise self.error(n, f"expected 'outputs = Op(...)', found {text!r}")
        assign = tree.body[0]
        lhs = assign.targets[0]
        elts = lhs.elts if isinstance(lhs, ast.Tuple) else [lhs]
        if not all(isinstance(e, ast.Name) for e in elts):
            raise self.error(n, "the left-hand side must be a variable or a tuple of variables")
        outs = [e.id for e in elts]  # type: ignore[attr-defined]
        value = assign.value
        if isinstance(value, ast.Name):
            if not target:
                raise self.error(n, "a source line must be an op call, not an alias")
            if len(outs) != 1:
                raise self.error(n, "an alias assigns one variable")
            return [Alias(outs[0], value.id, n)]
        if not isinstance(value, ast.Call):
            raise self.error(n, f"expected an op call on the right-hand side, found {ast.unparse(value)!r}")
        return self.call(n, value, outs, target)

    def call(self, n: int, call: ast.Call, outs: list[str], target: bool) -> list[OpNode | Alias]:
        if not isinstance(call.func, ast.Name):
            raise self.error(n, f"{ast.unparse(call.func)!r} is not an op name")
        op = call.func.id
        if op not in OPS:
            raise self.error(n, f"unknown op {op!r}")
        nodes: list[OpNode | Alias] = []
        inputs: list[Arg | ConstArg | Omitted] = []
        for a in call.args:
            if isinstance(a, ast.Name):
                if inputs and isinstance(inputs[-1], Arg) and inputs[-1].optional:
                    raise self.error(n, f"{op}: optional inputs opt(...) must come last")
                inputs.append(Arg(a.id))
            elif isinstance(a, ast.Call) and isinstance(a.func, ast.Name) and a.func.id == "opt":
                if len(a.args) != 1 or not isinstance(a.args[0], ast.Name) or a.keywords:
                    raise self.error(n, "opt(...) takes one variable")
                inputs.append(Arg(a.args[0].id, optional=True))
            elif isinstance(a, ast.Call) and isinstance(a.func, ast.Name) and a.func.id in OPS:
                if inputs and isinstance(inputs[-1], Arg) and inputs[-1].optional:
                    raise self.error(n, f"{op}: optional inputs opt(...) must come last")
                tmp = self.fresh()
                nodes.extend(self.call(n, a, [tmp], target))
                inputs.append(Arg(tmp))
            elif target and isinstance(a, ast.Call) and isinstance(a.func, ast.Name) and a.func.id in TARGET_CONSTS:
                inputs.append(self.const_arg(n, a))
            elif target and isinstance(a, ast.Constant) and a.value is None:
                inputs.append(Omitted())
            else:
                allowed = "a variable, an op call or opt(v)" + (", ints(...), const(...) or None" if target else "")
                raise self.error(n, f"{op}: argument {ast.unparse(a)!r} must be {allowed}")
        attrs: list[Any] = []
        rest = None
        for kw in call.keywords:
            if kw.arg is None:
                if not isinstance(kw.value, ast.Name) or rest is not None:
                    raise self.error(n, f"{op}: use at most one '**name'")
                rest = kw.value.id
            elif target:
                names, problem = check(kw.value)
                if problem:
                    raise self.error(n, f"{op}: attribute {kw.arg}: {problem}")
                attrs.append((kw.arg, Compiled(kw.value, names, f"{self.file}:{n}")))
            elif isinstance(kw.value, ast.Name):
                attrs.append(AttrPat(kw.arg, kw.value.id))
            else:
                try:
                    literal = ast.literal_eval(kw.value)
                except ValueError:
                    raise self.error(n, f"{op}: source attribute {kw.arg}={ast.unparse(kw.value)} must be a "
                                        "variable or a literal") from None
                attrs.append(AttrPat(kw.arg, None, tuple(literal) if isinstance(literal, list) else literal))
        if inputs and isinstance(inputs[-1], Omitted):
            raise self.error(n, f"{op}: None leaves an input empty before a given one; drop a trailing None")
        lo, hi, nout = arity(op)
        if len(inputs) < lo or (hi is not None and len(inputs) > hi):
            want = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi is not None else f"at least {lo}"
            raise self.error(n, f"{op} takes {want} inputs, not {len(inputs)}")
        allowed_outs = (nout,) if isinstance(nout, int) else nout
        if allowed_outs is not None and len(outs) not in allowed_outs:
            raise self.error(n, f"{op} has {' or '.join(map(str, allowed_outs))} output(s), not {len(outs)}")
        nodes.append(OpNode(op, tuple(inputs), tuple(outs), tuple(attrs), rest, n))
        return nodes

    def const_arg(self, n: int, a: ast.Call) -> ConstArg:
        kind = a.func.id  # type: ignore[attr-defined]
        want = 1 if kind == "ints" else 2
        if len(a.args) != want or a.keywords:
            raise self.error(n, "ints(expr) takes one expression" if kind == "ints"
                             else "const(expr, like) takes an expression and a tensor variable")
        like = None
        if kind == "const":
            if not isinstance(a.args[1], ast.Name):
                raise self.error(n, "const(expr, like): `like` must be a tensor variable")
            like = a.args[1].id
        names, problem = check(a.args[0])
        if problem:
            raise self.error(n, f"{kind}(...): {problem}")
        return ConstArg(Compiled(a.args[0], names, f"{self.file}:{n}"), kind, like)


def _parse_rule(file: str, line: int, name: str, family: str, comment: str, shared_opt: str,
                body: list[tuple[int, str]]) -> Rule:
    b = _Builder(file, name)
    if family not in FAMILIES:
        raise b.error(line, f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    if not comment:
        raise b.error(line, "no comment: write one line above 'rule' saying what the rule does")
    source: list[OpNode] = []
    target: list[OpNode | Alias] = []
    conditions: list[Condition] = []
    example: list[tuple[str, Compiled]] = []
    arrow = None
    for n, text in _logical_lines(b, body):
        word = text.split(None, 1)[0]
        if text == "=>":
            if arrow is not None:
                raise b.error(n, f"second '=>' (the first is at line {arrow})")
            arrow = n
        elif word == "where":
            conditions.extend(_conditions(b, n, text[len("where"):]))
        elif word == "example":
            example.extend(_example(b, n, text[len("example"):]))
        elif arrow is None:
            source.extend(b.statement(n, text, target=False))  # type: ignore[arg-type]
        else:
            target.extend(b.statement(n, text, target=True))
    if arrow is None:
        raise b.error(line, "no '=>' between the source and the target pattern")
    if not source:
        raise b.error(line, "empty source pattern")
    if not target:
        raise b.error(arrow, "empty target pattern")
    shared = frozenset(s for s in shared_opt.split(",") if s)
    return _check_rule(b, line, family, comment, source, target, conditions, example, shared, body)


def _conditions(b: _Builder, n: int, text: str) -> list[Condition]:
    try:
        expr = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise b.error(n, f"syntax error in condition: {e.msg}") from None
    conjuncts = expr.values if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.And) else [expr]
    out = []
    for c in conjuncts:
        names, problem = check(c)
        if problem:
            raise b.error(n, f"condition {ast.unparse(c)!r}: {problem}")
        out.append(Condition(Compiled(c, names, f"{b.file}:{n}"), n))
    return out


def _example(b: _Builder, n: int, text: str) -> list[tuple[str, Compiled]]:
    try:
        call = ast.parse(f"f({text.strip()})", mode="eval").body
    except SyntaxError as e:
        raise b.error(n, f"syntax error in example: {e.msg}") from None
    assert isinstance(call, ast.Call)
    if call.args:
        raise b.error(n, "example entries are name=value")
    out = []
    for kw in call.keywords:
        if kw.arg is None:
            raise b.error(n, "example entries are name=value")
        names, problem = check(kw.value, functions=EXAMPLE_FUNCTIONS)
        if problem:
            raise b.error(n, f"example {kw.arg}: {problem}")
        out.append((kw.arg, Compiled(kw.value, names, f"{b.file}:{n}")))
    return out


def _check_rule(b: _Builder, line: int, family: str, comment: str, source: list[OpNode],
                target: list[OpNode | Alias], conditions: list[Condition], example: list[tuple[str, Compiled]],
                shared: frozenset[str], body: list[tuple[int, str]]) -> Rule:
    # --- the source: who defines and who reads each variable
    defined: dict[str, int] = {}
    for node in source:
        for v in node.outputs:
            if v in defined:
                raise b.error(node.line, f"source defines {v!r} twice")
            defined[v] = node.line
    source = _topological(b, source, defined)
    inputs: dict[str, int] = {}
    optional: set[str] = set()
    required: set[str] = set()
    attr_vars: dict[str, int] = {}
    rest_vars: set[str] = set()
    for node in source:
        for a in node.inputs:
            assert isinstance(a, Arg)
            (optional if a.optional else required).add(a.var)
            if a.var not in defined:
                inputs.setdefault(a.var, node.line)
            elif a.optional:
                raise b.error(node.line, f"opt({a.var}): an optional input must be a free variable")
        for p in node.attrs:
            if p.var is not None:
                attr_vars.setdefault(p.var, node.line)
        if node.rest is not None:
            if node.rest in rest_vars:
                raise b.error(node.line, f"'**{node.rest}' is bound twice")
            rest_vars.add(node.rest)
    if optional & required:
        v = sorted(optional & required)[0]
        raise b.error(line, f"{v!r} is optional in one place and required in another")
    tensor_vars = set(defined) | set(inputs)
    for v, n in attr_vars.items():
        if v in tensor_vars or v in rest_vars:
            raise b.error(n, f"{v!r} is used both as a tensor and as an attribute")
    _check_connected(b, line, source)

    # --- the target: reads only what the source binds and what it defined before
    source_vars = tensor_vars | set(attr_vars)
    tdefined: dict[str, int] = {}
    reads: set[str] = set()

    def need_tensor(v: str, n: int) -> None:
        if v in tdefined or v in inputs:
            reads.add(v)
            return
        if v in defined:
            raise b.error(n, f"target reads {v!r}, which the source computes and the rewrite removes")
        raise b.error(n, f"target uses {v!r}, which the source does not bind")

    def need_names(names: Iterable[str], n: int, what: str) -> None:
        for v in names:
            if v not in source_vars and v not in tdefined:
                raise b.error(n, f"{what} uses {v!r}, which the source does not bind")

    for st in target:
        if isinstance(st, Alias):
            need_tensor(st.source, st.line)
            outs: tuple[str, ...] = (st.output,)
        else:
            for a in st.inputs:
                if isinstance(a, Arg):
                    need_tensor(a.var, st.line)
                elif isinstance(a, ConstArg):
                    need_names(a.expr.names, st.line, f"{a.kind}(...)")
                    if a.like is not None:
                        need_tensor(a.like, st.line)
            for key, expr in st.attrs:
                need_names(expr.names, st.line, f"attribute {key}")
            if st.rest is not None and st.rest not in rest_vars:
                raise b.error(st.line, f"'**{st.rest}' is not bound by the source")
            outs = st.outputs
        for v in outs:
            if v in inputs:
                raise b.error(st.line, f"target redefines {v!r}, an input of the source pattern")
            if v in tdefined:
                raise b.error(st.line, f"target defines {v!r} twice")
            tdefined[v] = st.line
    roots = tuple(v for v in tdefined if v in defined)
    if not roots:
        raise b.error(line, "the target redefines none of the source's values (assign one of: "
                            f"{', '.join(v for v in defined if not v.startswith('%'))})")
    for v, n in tdefined.items():  # `_name`: an output an op must have in its place, which nothing needs
        if v not in defined and v not in reads and not v.startswith("_"):
            raise b.error(n, f"target computes {v!r} but nothing reads it")
    for c in conditions:
        for v in c.expr.names:
            if v not in source_vars:
                raise b.error(c.line, f"condition uses {v!r}, which the source does not bind")
    for v in shared:
        if v not in defined or v in roots:
            raise b.error(line, f"shared={v}: only intermediate values of the source can be shared")
    for v, _ in example:
        if v in defined or v in rest_vars:
            raise b.error(line, f"example gives {v!r}, which the source computes")
    text = "\n".join(t for _, t in body)
    return Rule(b.name, family, comment, b.file, line, tuple(source), tuple(target), tuple(conditions), shared,
                tuple(example), tuple(inputs), frozenset(defined), roots, frozenset(attr_vars), frozenset(optional),
                text)


def _topological(b: _Builder, source: list[OpNode], defined: dict[str, int]) -> list[OpNode]:
    """Source ops ordered so that each comes after the ops computing its inputs (stable)."""
    producer = {v: i for i, node in enumerate(source) for v in node.outputs}
    order: list[OpNode] = []
    state = [0] * len(source)  # 0 new, 1 visiting, 2 done

    def visit(i: int) -> None:
        if state[i] == 2:
            return
        if state[i] == 1:
            raise b.error(source[i].line, "the source pattern has a cycle")
        state[i] = 1
        for a in source[i].inputs:
            if isinstance(a, Arg) and a.var in producer:
                visit(producer[a.var])
        state[i] = 2
        order.append(source[i])

    for i in range(len(source)):
        visit(i)
    return order


def _check_connected(b: _Builder, line: int, source: list[OpNode]) -> None:
    """Multi-node patterns must be connected through shared variables (else matching is a cross product)."""
    parent = list(range(len(source)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    seen: dict[str, int] = {}
    for i, node in enumerate(source):
        for v in [a.var for a in node.inputs if isinstance(a, Arg)] + list(node.outputs):
            if v in seen:
                parent[find(i)] = find(seen[v])
            else:
                seen[v] = i
    if len({find(i) for i in range(len(source))}) > 1:
        raise b.error(line, "the source pattern is not connected: every op must share a variable with another")

