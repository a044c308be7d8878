"""The rewrite engine's parts: Searcher (matches), Applier (a match -> a rewrite), Candidate, and the
engine that orchestrates them over rules its caller passes in; no import cycle, no private imports."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import numpy as np
import pytest

import xrl
from xrl.ir import Graph, Node, TensorType
from xrl.ir.ops import infer_node
from xrl.rewrite import RewriteEngine, load_rules, parse_rules
from xrl.rewrite.apply import Applied, Applier, creates_cycle
from xrl.rewrite.match import GraphIndex
from xrl.rewrite.search import Searcher
from xrl.rewrite.verify import verify_rule

PACKAGE = Path(xrl.__file__).resolve().parent

NEG_NEG = parse_rules(textwrap.dedent("""\
    # drop a double negation
    rule neg_neg family=algebraic
      y = Neg(Neg(x))
      =>
      y = x
    """))
# Matches every Relu, but its target's Reshape to 7 elements fits no tensor here: never a valid rewrite.
BAD_SHAPE = parse_rules(textwrap.dedent("""\
    # a wrong rule
    rule bad_shape family=algebraic
      y = Relu(x)
      =>
      y = Reshape(Relu(x), ints([7]))
    """))


def chain() -> Graph:
    """x -> Neg -> Neg -> Relu -> y, typed and validated."""
    types = {"x": TensorType((2, 3))}
    nodes = [Node("n1", "Neg", ("x",), ("t",)), Node("n2", "Neg", ("t",), ("u",)), Node("r", "Relu", ("u",), ("y",))]
    for n in nodes:
        types.update(zip(n.outputs, infer_node(n, Graph([], ["x"], [], types, {}))))
    return Graph(nodes, ["x"], ["y"], types, {}).validate()


def test_the_engine_takes_its_rules_from_the_caller() -> None:
    with pytest.raises(TypeError):
        RewriteEngine()  # type: ignore[call-arg]  # no hidden default rule set
    assert RewriteEngine(NEG_NEG).rules == tuple(NEG_NEG)
    default = RewriteEngine.default(max_growth=3.0)
    assert default.rules == load_rules().rules and default.max_growth == 3.0


def test_searcher_finds_matches_and_builds_nothing() -> None:
    g = chain()
    found = Searcher(NEG_NEG).matches(g)
    assert [(r.name, [n.name for n in m.nodes]) for r, m in found] == [("neg_neg", ["n1", "n2"])]
    assert Searcher([]).matches(g) == []


def test_applier_turns_a_match_into_the_engines_candidate() -> None:
    g = chain()
    index = GraphIndex(g)
    [(rule, match)] = Searcher(NEG_NEG).matches(index)
    built = Applier().apply(index, rule, match)
    assert isinstance(built, Applied) and not built.noop and not creates_cycle(index, built.candidate)
    [cand] = RewriteEngine(NEG_NEG).candidates(g)
    assert built.candidate.step == cand.step
    assert built.candidate.graph.canonical_hash == cand.graph.canonical_hash
    assert [n.op for n in built.candidate.graph.topological_order] == ["Relu"]


def test_applier_rejects_a_target_that_does_not_type_check() -> None:
    g = chain()
    index = GraphIndex(g)
    [(rule, match)] = Searcher(BAD_SHAPE).matches(index)
    assert Applier().apply(index, rule, match) is None
    assert RewriteEngine(BAD_SHAPE).candidates(g) == []


def test_verification_uses_searcher_and_applier() -> None:
    assert verify_rule(NEG_NEG[0]).ok
    bad = verify_rule(BAD_SHAPE[0])
    assert not bad.ok and "does not type-check" in bad.detail


def test_candidate_weights_are_computed_by_the_candidate() -> None:
    rules = load_rules().select(["merge_matmul_2"])
    ws = {f"w{i}": np.random.default_rng(i).standard_normal((4, 4)).astype(np.float32) for i in range(2)}
    types = {"x": TensorType((2, 4))} | {k: TensorType.of(v) for k, v in ws.items()}
    nodes = [Node(f"m{i}", "MatMul", ("x", f"w{i}"), (f"y{i}",)) for i in range(2)]
    for n in nodes:
        types.update(zip(n.outputs, infer_node(n, Graph([], ["x"], [], types, ws))))
    g = Graph(nodes, ["x"], ["y0", "y1"], types, ws).validate()
    [cand] = RewriteEngine(rules).candidates(g)
    [merged] = cand.weight_arrays().values()
    np.testing.assert_array_equal(merged, np.concatenate([ws["w0"], ws["w1"]], axis=1))


# ----- module structure ------------------------------------------------------------------------
def _module_imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every `from xrl... import names` in the file, at any depth (lazy imports too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("xrl"):
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names if a.name.startswith("xrl"))
    return out


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_cycles(folder: str) -> list[list[str]]:
    """Cycles among the modules of xrl/<folder> (the package __init__, which only re-exports, left out)."""
    files = [p for p in sorted((PACKAGE / folder).glob("*.py")) if p.name != "__init__.py"]
    names = {_module_name(p) for p in files}
    edges = {_module_name(p): {m for m, _ in _module_imports(p) if m in names} for p in files}
    cycles, state = [], dict.fromkeys(names, 0)  # 0 unseen, 1 on the stack, 2 done

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(edges[m]):
            if state[n] == 1:
                cycles.append(stack[stack.index(n):] + [n])
            elif state[n] == 0:
                visit(n, [*stack, n])
        state[m] = 2

    for m in sorted(names):
        if state[m] == 0:
            visit(m, [m])
    return cycles


def private_imports(*files: Path) -> list[str]:
    """`module: name` for each private name (`_x`) a file imports from another module."""
    return [f"{p.name}: {m}.{n}" for p in files for m, names in _module_imports(p)
            for n in names if n.startswith("_") and not n.startswith("__")]


@pytest.mark.parametrize("folder", ["rewrite", "nn"])
def test_no_import_cycle(folder: str) -> None:
    assert import_cycles(folder) == []


def test_no_private_imports() -> None:
    files = [*sorted((PACKAGE / "rewrite").glob("*.py")), *sorted((PACKAGE / "nn").glob("*.py")),
             PACKAGE / "policies" / "export.py"]
    assert private_imports(*files) == []
