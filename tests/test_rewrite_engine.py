"""Candidate generation on hand-built graphs: what matches, what is dropped, and what a candidate holds."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from dataclasses import asdict

import numpy as np
import pytest

from xrl.cost import get_cost_model
from xrl.ir import Graph, Node, TensorType
from xrl.ir.execute import execute
from xrl.ir.ops import infer_node
from xrl.rewrite import RewriteEngine, load_rules, parse_rules


def build(nodes: list[tuple], inputs: dict[str, tuple], weights: dict[str, np.ndarray], outputs: list[str]) -> Graph:
    """A validated graph from (name, op, inputs, outputs[, attrs]) tuples, with inferred types."""
    types = {k: TensorType(s) for k, s in inputs.items()} | {k: TensorType.of(w) for k, w in weights.items()}
    made = [Node(t[0], t[1], tuple(t[2]), tuple(t[3]), t[4] if len(t) > 4 else {}) for t in nodes]
    for n in made:
        probe = Graph([], list(inputs), [], types, weights)
        types.update(zip(n.outputs, infer_node(n, probe)))
    return Graph(made, list(inputs), outputs, types, weights).validate()


def w(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def engine() -> RewriteEngine:
    return RewriteEngine(load_rules())


def same_outputs(a: Graph, b: Graph, seed: int = 0) -> bool:
    rng = np.random.default_rng(seed)
    feeds = {v: rng.standard_normal(a.types[v].shape) for v in a.inputs}
    return all(np.allclose(x, y, rtol=1e-9, atol=1e-9) for x, y in zip(execute(a, feeds), execute(b, feeds)))


def qkv_graph() -> Graph:
    nodes = [(f"m{i}", "MatMul", ["x", f"w{i}"], [f"y{i}"]) for i in range(3)]
    weights = {f"w{i}": w(8, 8, seed=i) for i in range(3)}
    return build(nodes, {"x": (2, 4, 8)}, weights, ["y0", "y1", "y2"])


def test_qkv_merge_is_found_once(engine: RewriteEngine) -> None:
    g = qkv_graph()
    cands = engine.candidates(g)
    by_rule = Counter(c.rule for c in cands)
    assert by_rule["merge_matmul_3"] == 1  # one candidate, not one per ordering of the three
    assert by_rule["merge_matmul_2"] == 3  # one per pair
    merged = next(c for c in cands if c.rule == "merge_matmul_3")
    assert set(merged.location) == {"m0", "m1", "m2"} and merged.step.startswith("merge_matmul_3@")
    assert Counter(n.op for n in merged.added) == {"MatMul": 1, "Split": 1}
    new = merged.graph.validate()
    assert len(new) == 2 and same_outputs(g, new)
    (weight,) = [v for v in new.initializers if v not in g.initializers]
    order = [int(n.inputs[1][1]) for n in merged.removed]
    np.testing.assert_array_equal(new.initializers[weight], np.concatenate([g.initializers[f"w{i}"] for i in order], 1))
    for c in cands:
        assert same_outputs(g, c.graph.validate())


def conv_relu_graph(conv_output_shared: bool) -> Graph:
    nodes = [("c", "Conv", ["x", "k"], ["t"], {"pads": (1, 1, 1, 1)}), ("r", "Relu", ["t"], ["y"])]
    outputs = ["y"]
    if conv_output_shared:
        nodes.append(("n", "Neg", ["t"], ["z"]))
        outputs.append("z")
    return build(nodes, {"x": (1, 3, 6, 6)}, {"k": w(4, 3, 3, 3)}, outputs)


def test_fusion_needs_a_private_intermediate(engine: RewriteEngine) -> None:
    fused = [c for c in engine.candidates(conv_relu_graph(False)) if c.rule == "fuse_conv_Relu"]
    assert len(fused) == 1 and fused[0].graph.nodes[fused[0].added[0].name].attrs["activation"] == "Relu"
    assert not [c for c in engine.candidates(conv_relu_graph(True)) if c.rule == "fuse_conv_Relu"]
    g = conv_relu_graph(False)
    as_output = Graph(g.nodes.values(), g.inputs, ["y", "t"], g.types, g.initializers)  # t is a graph output
    assert not [c for c in engine.candidates(as_output) if c.rule == "fuse_conv_Relu"]


BATCH_RULE = textwrap.dedent("""\
    # Run two convs that share a filter as one conv over the batch-concatenated inputs
    rule batch_conv family=merge
      y1 = Conv(x1, k)
      y2 = Conv(x2, k)
      where shape(x1) == shape(x2)
      =>
      y1, y2 = Split(Conv(Concat(x1, x2, axis=0), k), axis=0, split=(dim(x1, 0), dim(x2, 0)))
    """)


def test_a_rewrite_that_would_create_a_cycle_is_dropped() -> None:
    engine = RewriteEngine(parse_rules(BATCH_RULE))
    k = {"k": w(3, 3, 1, 1)}
    apart = build([("c1", "Conv", ["x1", "k"], ["y1"]), ("c2", "Conv", ["x2", "k"], ["y2"])],
                  {"x1": (1, 3, 4, 4), "x2": (1, 3, 4, 4)}, k, ["y1", "y2"])
    (cand,) = engine.candidates(apart)
    assert same_outputs(apart, cand.graph.validate())
    # conv2 reads (through a Relu) what conv1 computes: one conv cannot compute both.
    chained = build([("c1", "Conv", ["x1", "k"], ["y1"]), ("r", "Relu", ["y1"], ["x2"]),
                     ("c2", "Conv", ["x2", "k"], ["y2"])], {"x1": (1, 3, 4, 4)}, k, ["y2"])
    assert engine.matches(chained)  # the pattern does match ...
    assert engine.candidates(chained) == []  # ... but the rewrite would be cyclic


def test_symmetric_and_repeated_rewrites_are_kept_once(engine: RewriteEngine) -> None:
    g = build([("m1", "MatMul", ["a", "b"], ["p"]), ("m2", "MatMul", ["a", "c"], ["q"]),
               ("s", "Add", ["p", "q"], ["y"])], {"a": (2, 3), "b": (3, 4), "c": (3, 4)}, {}, ["y"])
    assert len(engine.matches(g)) > len(engine.candidates(g))  # a + b and b + a both match
    assert Counter(c.rule for c in engine.candidates(g))["factor_matmul_lhs"] == 1
    twins = parse_rules(textwrap.dedent("""\
        # one
        rule first family=algebraic
          y = Neg(Neg(x))
          =>
          y = x
        # the same rewrite under another name
        rule second family=algebraic
          y = Neg(Neg(x))
          =>
          y = x
        # a rewrite into the same graph
        rule noop family=algebraic
          y = Relu(x)
          =>
          y = Relu(x)
        """))
    g = build([("n1", "Neg", ["x"], ["t"]), ("n2", "Neg", ["t"], ["u"]), ("r", "Relu", ["u"], ["y"])],
              {"x": (3,)}, {}, ["y"])
    assert [c.rule for c in RewriteEngine(twins).candidates(g)] == ["first"]


def test_exact_dedup_also_compares_canonical_hashes() -> None:
    rules = load_rules().select(["remove_relu_relu"])
    g = build([("r1", "Relu", ["x"], ["a"]), ("r2", "Relu", ["a"], ["b"]), ("r3", "Relu", ["b"], ["y"])],
              {"x": (3,)}, {}, ["y"])
    cheap = RewriteEngine(rules).candidates(g)
    assert len(cheap) == 2  # different nodes removed ...
    assert cheap[0].graph.canonical_hash == cheap[1].graph.canonical_hash  # ... the same graph results
    assert len(RewriteEngine(rules, exact_dedup=True).candidates(g)) == 1


def test_candidates_are_deterministic(engine: RewriteEngine) -> None:
    a, b = engine.candidates(qkv_graph()), engine.candidates(qkv_graph())
    assert [(c.rule, c.location) for c in a] == [(c.rule, c.location) for c in b]
    g = qkv_graph()  # the same graph object twice: nothing of the first call leaks into the second
    first, second = engine.candidates(g), engine.candidates(g)
    assert [[n.name for n in c.added] for c in first] == [[n.name for n in c.added] for c in second]
    assert [c.graph.canonical_hash for c in a] == [c.graph.canonical_hash for c in b]
    assert len({c.graph.canonical_hash for c in a}) == len(a)  # and distinct


def test_growth_limit() -> None:
    grow = parse_rules("# grow\nrule grow family=algebraic\n  y = Relu(x)\n  =>\n  y = Relu(Relu(x))\n")
    g = build([("r", "Relu", ["x"], ["y"])], {"x": (3,)}, {}, ["y"])
    assert len(RewriteEngine(grow, max_growth=2.0).candidates(g)) == 1
    assert RewriteEngine(grow, max_growth=1.5).candidates(g) == []
    assert RewriteEngine(grow, max_growth=2.0).candidates(g, original_nodes=0) == []


def test_shared_intermediate_keeps_its_producer(engine: RewriteEngine) -> None:
    g = build([("t1", "Transpose", ["x"], ["t"], {"perm": (1, 0, 2)}), ("t2", "Transpose", ["t"], ["y"],
               {"perm": (1, 0, 2)}), ("n", "Neg", ["t"], ["z"]), ("r", "Relu", ["y"], ["out"])],
              {"x": (2, 3, 4)}, {}, ["out", "z"])
    (cancel,) = [c for c in engine.candidates(g) if c.rule == "transpose_cancel"]
    assert [n.name for n in cancel.removed] == ["t2"] and cancel.added == ()
    new = cancel.graph.validate()
    assert "t1" in new.nodes and new.nodes["r"].inputs == ("x",) and same_outputs(g, new)


def test_a_graph_output_never_becomes_an_input(engine: RewriteEngine) -> None:
    g = build([("i", "Identity", ["x"], ["y"])], {"x": (3,)}, {}, ["y"])
    assert engine.candidates(g) == []
    g2 = build([("i", "Identity", ["x"], ["y"]), ("r", "Relu", ["y"], ["z"])], {"x": (3,)}, {}, ["z"])
    (c,) = engine.candidates(g2)
    assert c.rule == "remove_identity" and c.graph.validate().nodes["r"].inputs == ("x",)


def bn_graph() -> Graph:
    c = 4
    bn = {"s": np.abs(w(c, seed=1)) + 0.5, "b": w(c, seed=2), "m": w(c, seed=3), "v": np.abs(w(c, seed=4)) + 0.5}
    return build([("c", "Conv", ["x", "k"], ["t"], {"pads": (1, 1, 1, 1)}),
                  ("bn", "BatchNormalization", ["t", "s", "b", "m", "v"], ["u"], {"epsilon": 1e-3}),
                  ("r", "Relu", ["u"], ["y"])], {"x": (1, 3, 6, 6)}, {"k": w(c, 3, 3, 3), **bn}, ["y"])


def test_candidate_costs_from_its_delta_without_building_weights(engine: RewriteEngine) -> None:
    g = bn_graph()
    model = get_cost_model("analytic", device="h100")
    base = model.cost(g)
    for cand in engine.candidates(g):
        c = cand.delta_cost(model, base)
        assert "graph" not in cand.__dict__  # costing built nothing
        assert c == pytest.approx(model.cost(cand.graph), rel=1e-12)
        assert cand.skeleton.canonical_hash == cand.graph.canonical_hash


def test_candidate_graph_shares_structure_and_weights_are_exact(engine: RewriteEngine) -> None:
    g = bn_graph()
    (fold,) = [c for c in engine.candidates(g) if c.rule == "fuse_conv_bn"]
    new = fold.graph.validate()
    assert len(fold.weights) == 2 and all(new.initializers[v].dtype == np.float32 for v in fold.weights)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, 3, 6, 6))}
    np.testing.assert_allclose(execute(new, feeds)[0], execute(g, feeds)[0], rtol=1e-5, atol=1e-6)
    again = [c for c in RewriteEngine(load_rules()).candidates(bn_graph()) if c.rule == "fuse_conv_bn"][0]
    assert [fold.digests[v] for v in fold.weights] == [again.digests[v] for v in again.weights]
    json.dumps(asdict(fold.info()))
    untouched = build([("a", "Relu", ["x"], ["p"]), ("b", "Neg", ["p"], ["q"]), ("c", "Neg", ["q"], ["y"])],
                      {"x": (3,)}, {}, ["y"])
    (neg,) = engine.candidates(untouched)
    assert neg.graph.nodes["a"] is untouched.nodes["a"]  # nodes outside the rewrite are shared, not copied


def test_engine_pickles(engine: RewriteEngine) -> None:
    # Vectorised environments ship their engine to worker processes.
    import pickle

    back = pickle.loads(pickle.dumps(engine))
    g = qkv_graph()
    assert [c.step for c in back.candidates(g)] == [c.step for c in engine.candidates(g)]


def test_one_engine_serves_graphs_with_equal_names_and_different_constants(engine: RewriteEngine) -> None:
    # Shape inference is memoised across graphs: a shape input must be keyed by value, not by name.
    def reshapes(second: tuple[int, ...]) -> Graph:
        return build([("r1", "Reshape", ["x", "s1"], ["t"]), ("r2", "Reshape", ["t", "s2"], ["y"]),
                      ("n", "Neg", ["y"], ["z"])], {"x": (2, 3, 4)},
                     {"s1": np.array([6, 4]), "s2": np.array(second)}, ["z"])

    for second in [(2, 12), (12, 2), (4, 6)]:
        g = reshapes(second)
        (c,) = [c for c in engine.candidates(g) if c.rule == "reshape_reshape"]
        assert c.graph.validate().types["y"].shape == second and same_outputs(g, c.graph)
