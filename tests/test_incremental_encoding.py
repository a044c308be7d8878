"""Incremental candidate encoding equals encoding every candidate graph whole (xrl.features.incremental)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xrl.env import GraphRewriteEnv, resolve_graph
from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM, featurize
from xrl.features.incremental import IncrementalFeatures, IncrementalMeta, StateIndex, region
from xrl.features.metagraph import MetaGraph, build_metagraph
from xrl.nn import ENCODERS, POOLINGS, EncoderConfig, GraphPolicy, PolicyConfig
from xrl.nn.encoders import gcn_propagate, node_degree, with_reverse_edges
from xrl.rl.checkpoint import default_policy_path, load_policy

GRAPHS = ("mlp", "tiny_cnn", "squeezenet", "bert")
MAX_CANDS = 6  # per state, from each end of the engine's order (rules of several families), to stay fast


@pytest.fixture(scope="module")
def states():
    """(graph, candidates) pairs: each graph's start and the state one rewrite on (a graph made by `replace`)."""
    out = []
    for name in GRAPHS:
        env = GraphRewriteEnv(resolve_graph(name), "analytic", horizon=10)
        env.reset()
        out.append((env.graph, _some(env.candidates)))
        env.step(len(env.candidates) // 2 + 1)
        out.append((env.graph, _some(env.candidates)))
    return out


def _some(cands: list) -> list:
    return cands if len(cands) <= 2 * MAX_CANDS else cands[:MAX_CANDS] + cands[-MAX_CANDS:]


@pytest.fixture(scope="module")
def full_features(states):
    """Each state's candidates featurised whole (built graphs), once for the module."""
    return [build_metagraph(featurize(g), [featurize(c.graph) for c in cands]) for g, cands in states]


def _names(graph) -> list[str]:
    return [*graph.inputs, *graph.initializers, *(n.name for n in graph.topological_order)]


def test_regions_reproduce_the_candidate_features(states):
    """Every region node's feature row and degree, the node count and the global features are the candidate's."""
    for graph, cands in states:
        st = StateIndex(graph)
        for c in cands:
            r = region(st, c, 3)
            cg = c.graph
            d = featurize(cg)
            pos = {k: i for i, k in enumerate(_names(cg))}
            assert r.count == d.num_nodes
            np.testing.assert_allclose(r.u, d.u[0].numpy(), rtol=1e-6)
            deg = np.bincount(d.edge_index.flatten().numpy(), minlength=d.num_nodes)
            for i, key in enumerate(r.keys):
                if r.level[i] > 3:
                    continue
                x = r.x_new[r.xnew[i]] if r.xnew[i] >= 0 else st.data.x[r.prow[i]].numpy()
                np.testing.assert_array_equal(x, d.x[pos[key]].numpy(), err_msg=f"{c.rule}: {key}")
                assert r.deg[i] == deg[pos[key]], (c.rule, key)
            names = _names(graph)
            assert not any(names[row] in pos for row in r.rem)


# Every encoder with mean pooling (the default), every pooling with an attention and a degree-normalised encoder.
COMBOS = [(k, "mean") for k in ENCODERS] + [(k, p) for k in ("gat", "gcn") for p in POOLINGS if p != "mean"]


@pytest.mark.parametrize(("kind", "pooling"), COMBOS)
def test_incremental_embeddings_equal_full_reencoding(states, full_features, kind, pooling):
    torch.manual_seed(0)
    enc = EncoderConfig(kind=kind, pooling=pooling, hidden=16, heads=2, layers=3)
    policy = GraphPolicy(PolicyConfig(NODE_DIM, EDGE_DIM, GLOBAL_DIM, enc)).eval()
    feats = IncrementalFeatures(enc.layers)
    for (graph, cands), full in zip(states, full_features):
        meta = feats(graph, cands)
        g = full.graphs
        with torch.no_grad():
            h_s, h_r = policy.encoder.encode_incremental(meta)
            ref = policy.encoder(g.x, g.edge_index, g.edge_attr, g.u, g.batch)
            torch.testing.assert_close(h_s, ref[:1], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(h_r, ref[1:], rtol=1e-4, atol=1e-5)
            # the policy's distribution and value too
            d_inc, v_inc = policy(meta)
            d_full, v_full = policy(full)
            torch.testing.assert_close(d_inc.log_probs, d_full.log_probs, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(v_inc, v_full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ENCODERS)
def test_incremental_node_states_equal_full_reencoding(states, kind):
    """Node states of the region (not only the pooled embedding), layer by layer, by node name."""
    torch.manual_seed(1)
    enc = EncoderConfig(kind=kind, hidden=16, heads=2, layers=2)
    encoder = GraphPolicy(PolicyConfig(NODE_DIM, EDGE_DIM, GLOBAL_DIM, enc)).eval().encoder
    graph, cands = states[3]  # squeezenet, one rewrite on
    st = StateIndex(graph)
    for c in cands[:6]:
        r = region(st, c, enc.layers)
        meta = IncrementalFeatures(enc.layers)(graph, [c])
        captured: list[torch.Tensor] = []
        norm = encoder.norms[-1]
        hook = norm.register_forward_hook(lambda _m, _i, out, into=captured: into.append(out))
        with torch.no_grad():
            encoder.encode_incremental(meta)
            hook.remove()
            cg = c.graph
            d = featurize(cg)
            full = encoder.node_states(d.x, d.edge_index, d.edge_attr)[-1]
        last = captured[-1]  # the region's last layer, before the state's rows are put back
        pos = {k: i for i, k in enumerate(_names(cg))}
        inside = [i for i in range(len(r.keys)) if r.level[i] <= enc.layers]
        torch.testing.assert_close(last[inside], full[[pos[r.keys[i]] for i in inside]], rtol=1e-4, atol=1e-5)


def test_gcn_propagate_is_gcnconv():
    from torch_geometric.nn import GCNConv

    torch.manual_seed(0)
    conv = GCNConv(8, 8)
    h = torch.rand(6, 8)
    ei, _ = with_reverse_edges(torch.tensor([[0, 1, 2, 2, 3], [1, 2, 3, 4, 5]]), torch.zeros(5, 1))
    torch.testing.assert_close(gcn_propagate(conv, h, ei, node_degree(ei, 6)), conv(h, ei))


def test_collated_observations_equal_separate_ones(states):
    torch.manual_seed(0)
    policy = GraphPolicy(PolicyConfig(NODE_DIM, EDGE_DIM, GLOBAL_DIM, EncoderConfig(hidden=16, heads=2))).eval()
    feats = IncrementalFeatures(3)
    metas = [feats(g, c, cand_attr=torch.rand(len(c) + 1, 3), state_attr=torch.rand(2)) for g, c in states[:4]]
    with torch.no_grad():
        dist, value = policy(IncrementalMeta.collate(metas))
        parts = [policy(m) for m in metas]
    torch.testing.assert_close(dist.log_probs, torch.cat([d.log_probs for d, _ in parts]))
    torch.testing.assert_close(value, torch.cat([v for _, v in parts]))
    assert IncrementalMeta.collate(metas).candidate_counts().tolist() == [m.num_candidates for m in metas]


def test_incremental_gradients_match(states):
    """Training reads the same function: the gradients of the two paths agree."""
    torch.manual_seed(0)
    graph, cands = states[2]
    policy = GraphPolicy(PolicyConfig(NODE_DIM, EDGE_DIM, GLOBAL_DIM, EncoderConfig(hidden=16, heads=2, layers=2)))
    grads = []
    for meta in (IncrementalFeatures(2)(graph, cands), build_metagraph(featurize(graph),
                                                                      [featurize(c.graph) for c in cands])):
        policy.zero_grad()
        dist, value = policy(meta)
        (dist.log_probs[1:].sum() + value.sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-3, atol=1e-4)


def test_shipped_policy_acts_identically_on_both_paths():
    """The shipped policy's scores agree on both paths, so its argmax does up to exact ties: BERT's identical
    layers give identical rewrites whose scores differ in the last float bits, and either may win."""
    policy, ckpt = load_policy(default_policy_path())
    cap = ckpt["config"]["env"]["max_candidates"]
    for name in ("mlp", "tiny_cnn", "squeezenet", "bert"):
        env = GraphRewriteEnv(resolve_graph(name), "analytic", horizon=4, max_candidates=cap)
        env.reset()
        inc = IncrementalFeatures(policy.cfg.encoder.layers)
        for _ in range(4):
            with torch.no_grad():
                d_new, v_new = policy(inc.observe(env))
                d_old, v_old = policy(_full(env))
            torch.testing.assert_close(d_new.log_probs, d_old.log_probs, rtol=1e-4, atol=1e-5)
            a_new, a_old = int(d_new.mode()), int(d_old.mode())
            assert a_new == a_old or abs(float(d_old.logits[a_new] - d_old.logits[a_old])) < 1e-5
            _, _, term, trunc, _ = env.step(a_old)
            if term or trunc:
                break


def _full(env) -> MetaGraph:
    from xrl.features.metagraph import FeatureCache

    return env.meta_graph(FeatureCache(0))
