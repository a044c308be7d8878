"""Encoders, the candidate-scoring policy and the meta-graph batching, on hand-built graphs."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from xrl.errors import ConfigError
from xrl.features.metagraph import CAND_DIM, MetaGraph, build_metagraph
from xrl.nn import ENCODERS, POOLINGS, EncoderConfig, GraphEncoder, GraphPolicy, PolicyConfig
from xrl.nn.encoders import with_reverse_edges


def _graph(n: int, seed: int) -> Data:
    g = torch.Generator().manual_seed(seed)
    e = 2 * n
    return Data(x=torch.rand(n, 6, generator=g), edge_index=torch.randint(0, n, (2, e), generator=g),
                edge_attr=torch.rand(e, 3, generator=g), u=torch.rand(1, 2, generator=g), num_nodes=n)


def _policy(kind: str = "gat", pooling: str = "mean", **kw) -> GraphPolicy:
    torch.manual_seed(0)
    enc = EncoderConfig(kind=kind, pooling=pooling, hidden=16, heads=2, **kw)
    return GraphPolicy(PolicyConfig(6, 3, 2, enc)).eval()


@pytest.mark.parametrize("kind", ENCODERS)
@pytest.mark.parametrize("pooling", POOLINGS)
def test_encoder_is_invariant_to_node_order(kind, pooling):
    torch.manual_seed(0)
    enc = GraphEncoder(6, 3, 2, EncoderConfig(kind=kind, pooling=pooling, hidden=16, heads=2)).eval()
    d = _graph(7, 1)
    perm = torch.randperm(7)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(7)
    batch = torch.zeros(7, dtype=torch.long)
    out = enc(d.x, d.edge_index, d.edge_attr, d.u, batch)
    out_perm = enc(d.x[perm], inv[d.edge_index], d.edge_attr, d.u, batch)
    assert out.shape == (1, 16)
    assert torch.allclose(out, out_perm, atol=1e-5)


def test_reverse_edges_are_flagged():
    ei = torch.tensor([[0, 1], [1, 2]])
    ea = torch.tensor([[5.0], [6.0]])
    ei2, ea2 = with_reverse_edges(ei, ea)
    assert ei2.tolist() == [[0, 1, 1, 2], [1, 2, 0, 1]]
    assert ea2.tolist() == [[5.0, 0.0], [6.0, 0.0], [5.0, 1.0], [6.0, 1.0]]


def test_edge_features_change_gat_embeddings():
    enc = GraphEncoder(6, 3, 2, EncoderConfig(kind="gat", hidden=16, heads=2)).eval()
    d = _graph(6, 2)
    batch = torch.zeros(6, dtype=torch.long)
    a = enc(d.x, d.edge_index, d.edge_attr, d.u, batch)
    b = enc(d.x, d.edge_index, d.edge_attr + 1.0, d.u, batch)
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("n_cands", [2, 800])
def test_policy_scores_any_number_of_candidates(n_cands):
    policy = _policy()
    cands = [_graph(3 + k % 4, k) for k in range(n_cands)]
    meta = build_metagraph(_graph(5, 99), cands)
    with torch.no_grad():
        dist, value = policy(meta)
    assert dist.log_probs.shape == (n_cands + 1,)
    assert value.shape == (1,)
    assert float(dist.probs.sum()) == pytest.approx(1.0, abs=1e-5)


def test_collated_states_score_as_they_do_alone():
    policy = _policy("gin")
    metas = [build_metagraph(_graph(5, s), [_graph(3 + k, 10 * s + k) for k in range(2 + s)],
                             cand_attr=torch.rand(3 + s, CAND_DIM), state_attr=torch.rand(2)) for s in range(3)]
    with torch.no_grad():
        alone = [policy(m) for m in metas]
        dist, values = policy(MetaGraph.collate(metas))
    assert dist.counts.tolist() == [3, 4, 5]
    assert torch.allclose(dist.log_probs, torch.cat([d.log_probs for d, _ in alone]), atol=1e-5)
    assert torch.allclose(values, torch.cat([v for _, v in alone]), atol=1e-5)


def test_noop_candidate_is_the_current_graph():
    meta = build_metagraph(_graph(5, 0), [_graph(4, 1), _graph(4, 2)])
    assert meta.cand_graph.tolist() == [0, 1, 2]
    assert meta.state_graph.tolist() == [0]
    assert meta.graphs.num_graphs == 3
    with pytest.raises(ValueError):
        build_metagraph(_graph(5, 0), [_graph(4, 1)], cand_attr=torch.zeros(1, CAND_DIM))


def test_hints_are_ignored_when_disabled():
    torch.manual_seed(0)
    policy = GraphPolicy(PolicyConfig(6, 3, 2, EncoderConfig(hidden=16, heads=2), use_hints=False)).eval()
    g, c = _graph(5, 0), [_graph(4, 1)]
    with torch.no_grad():
        a = policy(build_metagraph(g, c, cand_attr=torch.zeros(2, CAND_DIM)))[0].log_probs
        b = policy(build_metagraph(g, c, cand_attr=torch.ones(2, CAND_DIM)))[0].log_probs
    assert torch.equal(a, b)


def test_policy_config_round_trips():
    cfg = PolicyConfig(6, 3, 2, EncoderConfig(kind="gcn", hidden=8, layers=2, heads=1, pooling="max"))
    assert PolicyConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("bad", [dict(kind="transformer"), dict(pooling="median"), dict(hidden=10, heads=4),
                                 dict(layers=0), dict(dropout=1.5)])
def test_bad_encoder_configs_are_user_errors(bad):
    with pytest.raises(ConfigError):
        EncoderConfig(**bad)
