"""Random instances of a rule's source pattern: small float64 graphs the verifier rewrites and runs.

Shapes come from the rule's `example` line (symbols drawn at random per trial) or, for variables
it leaves out, a random rank and dims. Attribute variables take the example's value, or a value
drawn for the op and key by `sample_attr` from the input types (a conv's group from its channels,
a transpose's perm as a random permutation, ...). Two ops with the same attribute draw the same
value more often than not, so rules that require equal attributes (merges) instantiate quickly.
Whether the instance satisfies the rule's conditions is left to the matcher: the verifier retries
until the rule matches the whole instance.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

import numpy as np

from xrl.ir import Graph, Node, TensorType
from xrl.ir.ops import infer_types
from xrl.rewrite.expr import PURE_FUNCTIONS
from xrl.rewrite.lang import Rule


class InstanceError(Exception):
    """This draw does not make a valid instance (shapes that do not fit, ...): draw again."""


@dataclass(frozen=True)
class Spec:
    """How to make one free tensor: its shape and how to fill it."""

    shape: tuple[int, ...]
    kind: str = "normal"  # normal | positive | fill | ints
    value: Any = None
    weight: bool | None = None  # None: decided by the rule's conditions


@dataclass(frozen=True)
class Instance:
    graph: Graph
    feeds: dict[str, np.ndarray]
    pattern: frozenset[str]  # the nodes that instantiate the source pattern


ACTIVATIONS = (None, "Relu", "Sigmoid", "Tanh", "Gelu")


def _example_functions(rng: np.random.Generator) -> dict[str, Any]:
    def between(lo: int, hi: int) -> int:
        return int(rng.integers(lo, hi + 1))

    def choice(*options: Any) -> Any:
        return options[int(rng.integers(len(options)))]

    return {
        "__builtins__": {}, **PURE_FUNCTIONS, "between": between, "choice": choice,
        "fill": lambda shape, v: Spec(tuple(shape), "fill", float(v), weight=True),
        # a causal mask: 0 on and below the diagonal of the last two axes, v above (a constant, as exporters fold it)
        "causal": lambda shape, v: Spec(tuple(shape), "causal", float(v), weight=True),
        "positive": lambda shape: Spec(tuple(shape), "positive"),
        "ints": lambda values: Spec((len(values),), "ints", tuple(int(v) for v in values), weight=True),
    }


class _Symbols(dict):
    """Example symbols: an unknown name is drawn at random once per instance."""

    def __init__(self, rng: np.random.Generator, functions: dict[str, Any]) -> None:
        super().__init__()
        self.rng, self.functions = rng, functions

    def __missing__(self, key: str) -> int:
        if key in self.functions:
            raise KeyError(key)  # eval then finds the function among its globals
        value = self[key] = int(self.rng.integers(2, 6))
        return value


def weight_vars(rule: Rule) -> tuple[set[str], set[str]]:
    """(variables the conditions require to be weights, variables they require not to be)."""
    yes, no = set(), set()
    for c in rule.conditions:
        tree = ast.parse(c.expr.source, mode="eval").body
        neg = isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.Not)
        call = tree.operand if neg else tree  # type: ignore[attr-defined]
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "weight"
                and len(call.args) == 1 and isinstance(call.args[0], ast.Name)):
            (no if neg else yes).add(call.args[0].id)
    return yes, no


def instantiate(rule: Rule, rng: np.random.Generator, *, present: dict[str, bool] | None = None) -> Instance:
    """One random instance of `rule`'s source. Raises InstanceError when the draw does not fit."""
    fns = _example_functions(rng)
    sym = _Symbols(rng, fns)
    tensor_specs: dict[str, Spec] = {}
    attr_env: dict[str, Any] = {}
    try:
        for name, expr in rule.example:  # symbols first: shapes may use them
            if name not in rule.inputs and name not in rule.attr_vars:
                sym[name] = expr.run(sym, fns)
        for name, expr in rule.example:
            if name in rule.attr_vars:
                v = expr.run(sym, fns)
                attr_env[name] = sym[name] = tuple(v) if isinstance(v, list) else v
            elif name in rule.inputs:
                v = expr.run(sym, fns)
                tensor_specs[name] = v if isinstance(v, Spec) else Spec(tuple(int(d) for d in v))
    except Exception as e:  # noqa: BLE001 - a bad example is a failed draw, reported by the verifier
        raise InstanceError(f"example: {e}") from e
    want_weight, want_act = weight_vars(rule)
    present = present or {}

    types: dict[str, TensorType] = {}
    weights: dict[str, np.ndarray] = {}
    feeds: dict[str, np.ndarray] = {}
    inputs: list[str] = []
    env: dict[str, str | None] = {}

    def make(var: str) -> str | None:
        if var in env:
            return env[var]
        if var in rule.optional and not present.get(var, True):
            env[var] = None
            return None
        spec = tensor_specs.get(var)
        if spec is None:
            rank = int(rng.integers(1, 5))
            spec = Spec(tuple(int(d) for d in rng.integers(1, 5, size=rank)))
        if any(d <= 0 for d in spec.shape):
            raise InstanceError(f"{var}: shape {spec.shape}")
        if spec.kind == "ints":
            a = np.asarray(spec.value, np.int64)
        elif spec.kind == "fill":
            a = np.full(spec.shape, spec.value, np.float64)
        elif spec.kind == "causal":
            if len(spec.shape) < 2:
                raise InstanceError(f"{var}: a causal mask needs two axes, not {spec.shape}")
            later = np.triu(np.ones(spec.shape[-2:], dtype=bool), 1)
            a = np.broadcast_to(np.where(later, spec.value, 0.0), spec.shape).copy()
        elif spec.kind == "positive":
            a = np.abs(rng.standard_normal(spec.shape)) + 0.5
        else:
            a = rng.standard_normal(spec.shape)
        is_weight = spec.weight if spec.weight is not None else (var in want_weight and var not in want_act)
        if is_weight or a.dtype.kind == "i":
            weights[var] = a
        else:
            feeds[var] = a
            inputs.append(var)
        types[var] = TensorType.of(a)
        env[var] = var
        return var

    memory: dict[tuple[str, str], Any] = {}
    nodes = []
    for i, pat in enumerate(rule.source):
        ins = [make(a.var) for a in pat.inputs]  # type: ignore[union-attr]
        while ins and ins[-1] is None:
            ins.pop()
        in_types = [types[v] for v in ins if v]
        attrs: dict[str, Any] = {}
        for p in pat.attrs:
            if p.var is None:
                value = p.literal
            elif p.var in attr_env:
                value = attr_env[p.var]
            else:
                value = attr_env[p.var] = sample_attr(pat.op, p.key, in_types, attrs, len(pat.outputs), rng, memory)
            if value is not None:
                attrs[p.key] = value
        if pat.rest is not None:
            explicit = {p.key for p in pat.attrs}
            for key in OPTIONAL_ATTRS.get(pat.op, ()):
                if key not in explicit and rng.random() < 0.5:
                    value = sample_attr(pat.op, key, in_types, attrs, len(pat.outputs), rng, memory)
                    if value is not None:
                        attrs[key] = value
        for key in REQUIRED_ATTRS.get(pat.op, ()):
            if key not in attrs:
                attrs[key] = sample_attr(pat.op, key, in_types, attrs, len(pat.outputs), rng, memory)
        outs = [v.replace("%", "_t") for v in pat.outputs]
        node = Node(f"n{i}", pat.op, tuple(v or "" for v in ins), tuple(outs), attrs)
        try:
            out_types = infer_types(node, in_types, [weights.get(v) for v in ins])
        except Exception as e:  # noqa: BLE001 - shapes that do not fit: draw again
            raise InstanceError(str(e)) from e
        for var, name, t in zip(pat.outputs, outs, out_types):
            env[var] = name
            types[name] = t
        nodes.append(node)
    # Each redefined value feeds an Identity whose output the graph returns: a rule may then rename a
    # value to a graph input (y = x), which it may not do to a graph output.
    pattern = frozenset(n.name for n in nodes)
    outputs = []
    for i, v in enumerate(rule.roots):
        out = f"out{i}"
        nodes.append(Node(f"sink{i}", "Identity", (env[v],), (out,)))
        types[out] = types[env[v]]  # type: ignore[index]
        outputs.append(out)
    graph = Graph(nodes, inputs, outputs, types, weights, name=f"instance:{rule.name}")
    return Instance(graph, feeds, pattern)


# Attributes a `**rest` binding is exercised with, and the ones an op cannot do without.
OPTIONAL_ATTRS = {
    "Conv": ("strides", "pads", "dilations"), "MatMul": (), "Gemm": ("alpha", "beta"),
    "MaxPool": ("strides", "pads"), "AveragePool": ("strides", "pads", "count_include_pad"),
    "Softmax": ("axis",), "LayerNormalization": ("epsilon",), "BatchNormalization": ("epsilon",),
    "LeakyRelu": ("alpha",), "Flatten": ("axis",), "Transpose": ("perm",),
}
REQUIRED_ATTRS = {"Concat": ("axis",), "MaxPool": ("kernel_shape",), "AveragePool": ("kernel_shape",),
                  "Cast": ("to",), "Unsqueeze": ("axes",)}


def sample_attr(op: str, key: str, ins: list[TensorType], attrs: dict[str, Any], n_outputs: int,
                rng: np.random.Generator, memory: dict[tuple[str, str], Any]) -> Any:
    """A random value of attribute `key` of `op` for inputs `ins` (and the node's `attrs` so far);
    often the value drawn last time for the same op and key."""
    if (op, key) in memory and rng.random() < 0.7:
        return memory[(op, key)]
    value = _draw(op, key, ins, attrs, n_outputs, rng)
    memory[(op, key)] = value
    return value


def _draw(op: str, key: str, ins: list[TensorType], attrs: dict[str, Any], n_outputs: int,
          rng: np.random.Generator) -> Any:
    rank = ins[0].rank if ins else 0
    k = max(rank - 2, 0)
    pick = lambda *xs: xs[int(rng.integers(len(xs)))]
    if key == "activation":
        return pick(*ACTIVATIONS)
    if op == "Conv":
        if key == "strides":
            return tuple(pick(1, 1, 2) for _ in range(k))
        if key == "pads":
            return tuple(int(p) for p in rng.integers(0, 2, size=2 * k))
        if key == "dilations":
            return tuple(pick(1, 1, 2) for _ in range(k))
        if key == "group":
            c, cw = ins[0].shape[1], ins[1].shape[1]
            return c // cw if cw and c % cw == 0 else 1
        if key == "kernel_shape":
            return ins[1].shape[2:]
        if key == "auto_pad":
            return "NOTSET"
    if op in ("MaxPool", "AveragePool"):
        if key == "kernel_shape":
            return tuple(pick(1, 2, 3) for _ in range(k))
        if key == "strides":
            return tuple(pick(1, 2) for _ in range(k))
        if key == "pads":
            return (0,) * (2 * k)
        if key in ("ceil_mode", "count_include_pad"):
            return pick(0, 1)
        if key == "dilations":
            return (1,) * k
    if op == "Gemm":
        if key in ("transA", "transB"):
            return pick(0, 1)
        if key in ("alpha", "beta"):
            return pick(1.0, 0.5, 2.0)
    if key == "perm":
        return tuple(int(p) for p in rng.permutation(rank))
    if key == "axis":
        if op == "Flatten":
            return int(rng.integers(0, rank + 1))
        return int(rng.integers(0, max(rank, 1)))
    if key == "split" and op == "Split":
        size = ins[0].shape[attrs.get("axis", 0) % max(rank, 1)]
        if size < n_outputs:
            raise InstanceError(f"cannot split {size} into {n_outputs}")
        cuts = sorted(int(c) for c in rng.choice(np.arange(1, size), size=n_outputs - 1, replace=False))
        return tuple(int(b - a) for a, b in zip([0, *cuts], [*cuts, size]))
    if key == "axes":
        if op == "Squeeze":
            ones = [i for i, d in enumerate(ins[0].shape) if d == 1]
            if not ones:
                raise InstanceError("nothing to squeeze")
            return tuple(ones)
        if op == "Unsqueeze":
            return (int(rng.integers(0, rank + 1)),)
        if rank == 0:
            return None
        n = int(rng.integers(1, rank + 1))
        return tuple(sorted(int(a) for a in rng.choice(rank, size=n, replace=False)))
    if key == "keepdims":
        return pick(0, 1)
    if key == "epsilon":
        return pick(1e-5, 1e-3)
    if key == "alpha":
        return pick(0.01, 0.2)
    if key == "to":
        return "float64"
    if key == "approximate":
        return "none"
    return None
