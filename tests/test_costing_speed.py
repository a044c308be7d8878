"""The shortcuts that make costing a search's candidates cheap give exactly what computing from scratch gives.

A candidate's graph is built by `Graph.replace` from its parent's and shares its Node objects, so its
structural hash is updated from the parent's (with a per-Node cache of what depends on the node alone),
its `producers` and `consumers` are the parent's patched where the rewrite touched them, and the cost
models find each kernel's written values in one pass (`written_values`) and memoise kernel costs by node
objects. Each test below costs every candidate of a state both ways: the fast path (shared models, graphs
derived from their parents) and a fresh copy of the candidate's graph (new Node objects, no parent, fresh
cost models), recomputed with the plain algorithms written out here, and asks for equal hashes, plans and
float costs.
"""

from __future__ import annotations

import hashlib
import math
import random

import numpy as np
import pytest

from xrl.cost import MeasuredKernelCostModel, TargetCostModel
from xrl.cost.base import Measurement
from xrl.cost.kernel_measured import RunOverhead
from xrl.cost.runtime_fusion import deduplicate, runtime_plan
from xrl.cost.targets import written_values
from xrl.frontends.loader import load_model
from xrl.ir import Graph, Node, TensorType
from xrl.rewrite import RewriteEngine

GRAPHS = ("tiny_cnn", "squeezenet", "fam_repvgg_ts")


# ----- the plain algorithms, as they were before the shortcuts ----------------------------------------
def _digest(obj: object) -> str:
    return hashlib.blake2b(repr(obj).encode(), digest_size=16).hexdigest()


def plain_producers(g: Graph) -> dict[str, tuple[str, int]]:
    return {v: (n.name, i) for n in g.nodes.values() for i, v in enumerate(n.outputs)}


def plain_consumers(g: Graph) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for n in g.nodes.values():
        for v in dict.fromkeys(n.inputs):
            if v:
                out.setdefault(v, []).append(n.name)
    return out


def plain_order(g: Graph) -> list[str]:
    """Kahn's algorithm, ties by insertion order."""
    producers = {v: n.name for n in g.nodes.values() for v in n.outputs}
    consumers: dict[str, list[Node]] = {}
    for n in g.nodes.values():
        for v in dict.fromkeys(n.inputs):
            if v:
                consumers.setdefault(v, []).append(n)
    indeg = {n.name: len({producers[v] for v in n.inputs if v in producers}) for n in g.nodes.values()}
    ready = [n for n in g.nodes.values() if indeg[n.name] == 0]
    order: list[str] = []
    while len(order) < len(ready):
        n = ready[len(order)]
        order.append(n.name)
        seen: set[str] = set()
        for v in n.outputs:
            for c in consumers.get(v, ()):
                if c.name not in seen:
                    seen.add(c.name)
                    indeg[c.name] -= 1
                    if indeg[c.name] == 0:
                        ready.append(c)
    return order


def plain_hashes(g: Graph) -> tuple[dict[str, str], str]:
    """(value -> hash, canonical hash), every node hashed from scratch."""
    h = {v: _digest(("input", i, str(g.types[v]))) for i, v in enumerate(g.inputs)}
    h.update({v: _digest(("weight", g.weight_digest(v))) for v in g.initializers})
    h[""] = "none"
    total = 0
    for name in plain_order(g):
        n = g.nodes[name]
        node_h = _digest((n.domain, n.op, n.attr_key(), tuple(h.get(v, "?" + v) for v in n.inputs)))
        for i, v in enumerate(n.outputs):
            h[v] = _digest((node_h, i))
        total += int(node_h, 16)
    return h, _digest((tuple(h[v] for v in g.outputs), total % (1 << 128)))


def plain_written(kernel, g: Graph, *, by_name: bool) -> tuple[str, ...]:
    if by_name:
        members = {n.name for n in kernel.nodes}
        return tuple(v for n in kernel.nodes for v in n.outputs
                     if v in g.outputs or any(u.name not in members for u in g.consumers.get(v, ())))
    return tuple(v for n in kernel.nodes for v in n.outputs
                 if v in g.outputs or any(u not in kernel.nodes for u in g.consumers.get(v, ())))


def fresh_copy(g: Graph) -> Graph:
    """The same graph with new Node objects and no parent: nothing cached or derived applies to it."""
    nodes = [Node(n.name, n.op, n.inputs, n.outputs, dict(n.attrs), n.domain) for n in g.nodes.values()]
    return Graph(nodes, g.inputs, g.outputs, g.types, g.initializers, name=g.name, output_names=g.output_names,
                 weight_digests={w: g.weight_digest(w) for w in g.initializers}, domain_opsets=g.domain_opsets)


def kernel_rows(kernels) -> list[tuple]:
    return [(k.op, k.anchor.name, tuple(n.name for n in k.nodes)) for k in kernels]


class StubTimings(MeasuredKernelCostModel):
    """The measured model with a made-up timing per kernel model key: nothing is run, and a kernel's cost
    depends on its nodes and on the values it writes (the kernel model's key), as a measured one does."""

    def __init__(self, tmp_path) -> None:
        super().__init__(target="ort-cpu", cache_path=tmp_path / "kernels.sqlite")
        self._overhead = RunOverhead(3e-5, 1e-6)

    def _timing_of(self, key: str, roofline=None) -> Measurement:
        return Measurement(int(key[:8], 16) * 1e-12 + 1e-6, 1, 0.0)


def graph_of(name: str) -> Graph:
    m = load_model(name)
    return m.graph if hasattr(m, "graph") else m


@pytest.fixture(scope="module")
def engine() -> RewriteEngine:
    return RewriteEngine.default()


def check_state(g: Graph, engine: RewriteEngine, roofline: TargetCostModel, measured: StubTimings, tmp_path) -> list:
    cands = list(engine.candidates(g, original_nodes=len(g)))
    assert cands, "a state with candidates"
    for c in cands:
        for derived in (c.skeleton, c.graph):
            fresh = fresh_copy(derived)
            what = f"{c.step} ({'skeleton' if derived is c.skeleton else 'graph'})"
            # structure: the maps patched from the parent's, and the order computed from them
            assert own_nodes(derived), what
            assert {v: (n.name, i) for v, (n, i) in derived.producers.items()} == plain_producers(fresh), what
            assert {v: [n.name for n in ns] for v, ns in derived.consumers.items()} == plain_consumers(fresh), what
            assert [n.name for n in derived.topological_order] == plain_order(fresh), what
            # hash: updated from the parent's, with cached node prefixes, vs from scratch with new nodes
            hashes, canonical = plain_hashes(fresh)
            assert derived.canonical_hash == canonical == fresh.canonical_hash, what
            assert {v: derived.value_hashes[v] for v in hashes} == hashes, what
            # the runtime's plan
            plan, kernels = runtime_plan(derived)
            fresh_plan, fresh_kernels = runtime_plan(fresh)
            assert kernel_rows(kernels) == kernel_rows(fresh_kernels), what
            assert plan.canonical_hash == fresh_plan.canonical_hash, what
            assert written_values(kernels, plan, by_name=True) == \
                [plain_written(k, plan, by_name=True) for k in kernels], what
            assert written_values(kernels, derived) == [plain_written(k, derived, by_name=False) for k in kernels]
        # costs: shared models (memoised across candidates) vs fresh models on the fresh copy
        fresh = fresh_copy(c.skeleton)
        ref = TargetCostModel(target="ort-cpu")
        assert roofline.cost(c.skeleton) == math.fsum(ref.kernel_cost(k, fresh) for k in ref.kernels(fresh)), c.step
        ref_m = StubTimings(tmp_path)
        plan, kernels = runtime_plan(fresh)
        expected = ref_m.overhead().fixed_s + math.fsum(ref_m.kernel_cost(k, plan) for k in kernels)
        assert measured.cost(c.skeleton) == expected, c.step
    return cands


@pytest.mark.parametrize("name", GRAPHS)
def test_every_candidate_costs_as_computed_from_scratch(name, engine, tmp_path) -> None:
    roofline, measured = TargetCostModel(target="ort-cpu"), StubTimings(tmp_path)
    g = graph_of(name)
    cands = check_state(g, engine, roofline, measured, tmp_path)
    # and one step on: a state that is itself derived, whose candidates derive from it
    best = min(cands, key=lambda c: roofline.cost(c.skeleton))
    check_state(best.graph, engine, roofline, measured, tmp_path)


def test_a_changed_node_changes_the_hash_and_changing_it_back_restores_it() -> None:
    g = graph_of("tiny_cnn")
    assert g.canonical_hash and g.consumers and g.producers  # the parent as a search holds it: hashed, maps built
    node = next(n for n in g.topological_order if n.op == "Relu")
    for changed in (Node(node.name, "Sigmoid", node.inputs, node.outputs, node.attrs, node.domain),
                    Node(node.name, node.op, node.inputs, node.outputs, {**node.attrs, "alpha": 0.5}, node.domain)):
        child = g.replace([node.name], [changed])
        assert child.canonical_hash != g.canonical_hash
        assert child.canonical_hash == plain_hashes(fresh_copy(child))[1]
        assert child.value_hashes[node.outputs[0]] != g.value_hashes[node.outputs[0]]
        back = child.replace([node.name], [node])  # the parent's own node object again
        assert back.canonical_hash == g.canonical_hash


def test_a_rewrite_that_writes_a_value_twice_raises_on_use() -> None:
    """The patched maps are not made where an added node writes a value another node writes: the graph
    raises when its producers are read, as one computed from scratch does."""
    from xrl.errors import InvalidGraphError

    g = graph_of("tiny_cnn")
    assert g.consumers and g.producers
    node = next(n for n in g.topological_order if n.op == "Relu")
    twin = Node(node.name + "_twin", node.op, node.inputs, node.outputs, node.attrs, node.domain)
    child = g.replace([], [twin])
    with pytest.raises(InvalidGraphError, match="is produced by both"):
        _ = child.producers


def own_nodes(g: Graph) -> bool:
    """Whether the maps hold this graph's own Node objects (a rewritten node is a new one)."""
    return all(g.nodes[n.name] is n for n, _ in g.producers.values()) and \
        all(g.nodes[n.name] is n for ns in g.consumers.values() for n in ns)


def check_structure(g: Graph) -> None:
    assert own_nodes(g)
    fresh = fresh_copy(g)
    assert {v: (n.name, i) for v, (n, i) in g.producers.items()} == plain_producers(fresh)
    assert {v: [n.name for n in ns] for v, ns in g.consumers.items()} == plain_consumers(fresh)
    assert [n.name for n in g.topological_order] == plain_order(fresh)
    hashes, canonical = plain_hashes(fresh)
    assert g.canonical_hash == canonical
    assert {v: g.value_hashes[v] for v in hashes} == hashes


@pytest.mark.parametrize("seed", range(6))
def test_chains_of_random_rewrites_with_renames_keep_maps_order_and_hash(seed) -> None:
    """The search's rules rename nothing, but `deduplicate` and other callers do: random rewrites that
    replace a node and redirect its readers (and others' readers to an earlier value), add readers, drop
    unread nodes and replace a weight, twelve deep, each checked against the plain algorithms."""
    rng = random.Random(seed)
    t = TensorType((2, 3), "float32")
    ops = ("Add", "Mul", "Relu", "Split")
    weights = {"w0": np.ones((2, 3), np.float32), "w1": np.full((2, 3), 2.0, np.float32)}
    values = ["in0", "in1", *weights]
    nodes = []
    for i in range(30):
        outs = (f"v{i}",) if rng.random() < 0.8 else (f"v{i}", f"v{i}b")
        ins = tuple(rng.choice(values) for _ in range(rng.randint(1, 3)))  # a value read twice, sometimes
        nodes.append(Node(f"n{i}", rng.choice(ops), ins, outs, {"k": rng.randint(0, 2)}))
        values += outs
    g = Graph(nodes, ["in0", "in1"], [values[-1], "v10"], {v: t for v in values}, weights)
    check_structure(g)
    for step in range(12):
        order = list(g.topological_order)
        k = rng.randrange(len(order))
        victim = order[k]
        earlier = [*g.inputs, *g.initializers, *(v for n in order[:k] for v in n.outputs)]
        kind = rng.random()
        if kind < 0.6:  # replace a node, its readers redirected to the new node's outputs
            new = Node(f"a{step}", rng.choice(ops), tuple(rng.choice(earlier) for _ in range(rng.randint(1, 3))),
                       tuple(f"a{step}_{o}" for o in range(len(victim.outputs))), {"k": rng.randint(0, 2)})
            rename = dict(zip(victim.outputs, new.outputs))
            if k > 1 and rng.random() < 0.7:  # and a later value's readers to an earlier value
                p = rng.randrange(k)
                later = [v for n in order[p + 1:] for v in n.outputs if v not in rename]
                if later:
                    rename[rng.choice(later)] = rng.choice(order[p].outputs)
            child = g.replace([victim.name], [new], rename=rename, new_types={v: t for v in new.outputs})
        elif kind < 0.8:  # add a reader, drop nodes nobody reads (dropping a read one leaves an invalid graph)
            dead = [n for n in order if not any(v in g.consumers or v in g.outputs for v in n.outputs)][:1]
            new = Node(f"a{step}", "Relu", (rng.choice([v for v in earlier if not dead or v not in dead[0].outputs]),),
                       (f"a{step}_0",))
            child = g.replace([n.name for n in dead], [new], new_types={f"a{step}_0": t})
        else:  # a weight replaced: its readers are rehashed
            child = g.replace(new_weights={"w0": np.full((2, 3), float(step), np.float32)})
        check_structure(child)
        g = child


def test_a_kernel_whose_written_values_change_is_costed_anew(tmp_path) -> None:
    """Kernel costs are memoised by their node objects and written values: a rewrite that leaves a Split
    with one output nobody reads costs that Split again (its kernel model, and its bytes, differ)."""
    t, half = TensorType((4, 8), "float32"), TensorType((4, 4), "float32")
    nodes = [Node("split", "Split", ("x",), ("s0", "s1"), {"axis": 1, "num_outputs": 2}),
             Node("a", "Relu", ("s0",), ("r0",)), Node("b", "Relu", ("s1",), ("r1",))]
    g = Graph(nodes, ["x"], ["r0", "r1"], {"x": t, "s0": half, "s1": half, "r0": half, "r1": half})
    assert g.consumers and g.producers
    child = g.replace(["b"], [Node("b2", "Sigmoid", ("s0",), ("r1",))])
    roofline, measured = TargetCostModel(target="ort-cpu"), StubTimings(tmp_path)
    for graph in (g, child):
        fresh = fresh_copy(graph)
        ref = TargetCostModel(target="ort-cpu")
        assert roofline.cost(graph) == math.fsum(ref.kernel_cost(k, fresh) for k in ref.kernels(fresh))
        ref_m = StubTimings(tmp_path)
        plan, kernels = runtime_plan(fresh)
        assert measured.cost(graph) == ref_m.overhead().fixed_s + math.fsum(ref_m.kernel_cost(k, plan) for k in kernels)
    assert written_values(runtime_plan(child)[1], child) == [("s0",), ("r0",), ("r1",)]


def test_deduplicate_merges_equal_scalar_weights_and_what_reads_them() -> None:
    t = TensorType((4,), "float32")
    two, also_two, three = (np.array([v], np.float32) for v in (2.0, 2.0, 3.0))
    nodes = [Node("m1", "Mul", ("x", "w1"), ("a",)), Node("m2", "Mul", ("x", "w2"), ("b",)),
             Node("m3", "Mul", ("x", "w3"), ("c",)), Node("r1", "Relu", ("a",), ("d",)),
             Node("r2", "Relu", ("b",), ("e",)), Node("r3", "Relu", ("c",), ("f",))]
    g = Graph(nodes, ["x"], ["d", "e", "f"], {v: t for v in "xabcdef"} | {w: t for w in ("w1", "w2", "w3")},
              {"w1": two, "w2": also_two, "w3": three})
    assert g.consumers and g.producers
    plan = deduplicate(g)
    assert sorted(plan.nodes) == ["m1", "m3", "r1", "r3"] and plan.outputs == ("d", "d", "f")
    check_structure(plan)
