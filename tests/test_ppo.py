"""PPO math against hand-computed values, and a toy problem PPO must learn."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from xrl.features.metagraph import MetaGraph, build_metagraph
from xrl.nn import EncoderConfig, GraphPolicy, GroupedCategorical, PolicyConfig
from xrl.rl.ppo import PPOConfig, RolloutBatch, compute_gae, ppo_losses, ppo_update


def test_gae_matches_hand_computation():
    # Two episodes: steps 0-1 (step 1 ends it), then step 2 cut off and bootstrapped with 0.3.
    rewards = torch.tensor([1.0, 0.0, 2.0])
    values = torch.tensor([0.5, 0.2, 0.1])
    dones = torch.tensor([0.0, 1.0, 0.0])
    adv, ret = compute_gae(rewards, values, dones, gamma=0.9, lam=0.8, last_value=0.3)
    a2 = 2.0 + 0.9 * 0.3 - 0.1  # 2.17
    a1 = 0.0 - 0.2  # the episode ends: no bootstrap, no carry
    a0 = (1.0 + 0.9 * 0.2 - 0.5) + 0.9 * 0.8 * a1  # 0.536
    assert adv.tolist() == pytest.approx([a0, a1, a2])
    assert ret.tolist() == pytest.approx([a0 + 0.5, a1 + 0.2, a2 + 0.1])


def test_gae_with_lambda_one_is_discounted_return_minus_value():
    rewards = torch.tensor([1.0, 2.0, 3.0])
    values = torch.tensor([0.4, -1.0, 2.0])
    adv, ret = compute_gae(rewards, values, torch.tensor([0.0, 0.0, 1.0]), gamma=0.5, lam=1.0)
    assert ret.tolist() == pytest.approx([1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0])


def test_clipped_losses_match_hand_computation():
    cfg = PPOConfig(clip_coef=0.2, norm_adv=False, clip_vloss=True, ent_coef=0.01, vf_coef=0.5)
    old = torch.zeros(3)
    new = torch.log(torch.tensor([1.5, 0.5, 1.1]))
    adv = torch.tensor([1.0, 1.0, -2.0])
    # per entry max(-A r, -A clip(r)): max(-1.5, -1.2), max(-0.5, -0.8), max(2.2, 2.2)
    expected_pg = (-1.2 - 0.5 + 2.2) / 3
    new_v, old_v, ret = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.5, 0.5, 0.0]), torch.tensor([2.0, 0.4, 0.0])
    # clipped values 0.7, 0.3, 0.0: max((1-2)^2, (0.7-2)^2) = 1.69, max(0.16, 0.01) = 0.16, 0
    expected_v = 0.5 * (1.69 + 0.16 + 0.0) / 3
    ent = torch.tensor([0.3, 0.6, 0.9])
    losses = ppo_losses(new, old, adv, new_v, old_v, ret, ent, cfg)
    assert float(losses.policy_loss) == pytest.approx(expected_pg, abs=1e-6)
    assert float(losses.value_loss) == pytest.approx(expected_v, abs=1e-6)
    assert float(losses.entropy) == pytest.approx(0.6)
    assert float(losses.loss) == pytest.approx(expected_pg - 0.01 * 0.6 + 0.5 * expected_v, abs=1e-6)
    assert float(losses.clip_fraction) == pytest.approx(2 / 3)
    r = torch.tensor([1.5, 0.5, 1.1])
    assert float(losses.approx_kl) == pytest.approx(float(((r - 1) - r.log()).mean()), abs=1e-6)


def test_unclipped_value_loss_and_advantage_normalisation():
    cfg = PPOConfig(norm_adv=True, clip_vloss=False)
    adv = torch.tensor([1.0, 3.0])
    same = torch.zeros(2)
    losses = ppo_losses(same, same, adv, torch.tensor([1.0, 2.0]), same, torch.tensor([0.0, 0.0]), same, cfg)
    # ratio 1: the loss is -mean(normalised A) = 0
    assert float(losses.policy_loss) == pytest.approx(0.0, abs=1e-6)
    assert float(losses.value_loss) == pytest.approx(0.5 * (1 + 4) / 2)


def test_masked_grouped_log_probs_and_entropy():
    logits = torch.tensor([0.0, math.log(3.0), 1.0, 1.0, 5.0])
    group = torch.tensor([0, 0, 1, 1, 1])
    mask = torch.tensor([True, True, True, True, False])
    dist = GroupedCategorical(logits, group, 2, mask=mask)
    assert dist.probs.tolist() == pytest.approx([0.25, 0.75, 0.5, 0.5, 0.0])
    assert dist.log_prob(torch.tensor([1, 0])).tolist() == pytest.approx([math.log(0.75), math.log(0.5)])
    h0 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert dist.entropy().tolist() == pytest.approx([h0, math.log(2.0)])
    assert dist.mode().tolist() == [1, 0]  # the masked 5.0 is never chosen
    with pytest.raises(IndexError):
        dist.log_prob(torch.tensor([2, 0]))  # group 0 has two candidates


def test_sampling_follows_the_probabilities_and_never_picks_masked():
    logits = torch.tensor([0.0, 1.0, 2.0, 9.0, 0.0])
    dist = GroupedCategorical(logits, torch.tensor([0, 0, 0, 1, 1]), 2, mask=torch.tensor([True] * 3 + [False, True]))
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([dist.sample(g) for _ in range(4000)])
    freq = torch.bincount(draws[:, 0], minlength=3).float() / 4000
    assert freq.tolist() == pytest.approx(dist.probs[:3].tolist(), abs=0.03)
    assert (draws[:, 1] == 1).all()


def _graph(n: int, seed: int) -> Data:
    g = torch.Generator().manual_seed(seed)
    e = 2 * n
    return Data(x=torch.rand(n, 4, generator=g), edge_index=torch.randint(0, n, (2, e), generator=g),
                edge_attr=torch.rand(e, 3, generator=g), u=torch.rand(1, 2, generator=g), num_nodes=n)


def test_ppo_update_learns_a_contextual_bandit():
    """Three states whose rewarding candidate differs: PPO must raise each one's probability."""
    torch.manual_seed(0)
    states = [build_metagraph(_graph(5, s), [_graph(4 + k, 10 * s + k) for k in range(3)]) for s in range(3)]
    best = [1, 3, 2]
    policy = GraphPolicy(PolicyConfig(4, 3, 2, EncoderConfig(hidden=16, layers=2, heads=2)))
    optim = torch.optim.Adam(policy.parameters(), lr=3e-3)
    cfg = PPOConfig(minibatch_size=6, update_epochs=4, ent_coef=0.0)
    rng = np.random.default_rng(0)
    gen = torch.Generator().manual_seed(0)

    def prob_of_best() -> list[float]:
        with torch.no_grad():
            return [float(policy(m)[0].probs[b]) for m, b in zip(states, best)]

    before = prob_of_best()
    for _ in range(15):
        obs, acts, logps, vals, rews = [], [], [], [], []
        for _rep in range(4):
            for m, b in zip(states, best):
                with torch.no_grad():
                    dist, v = policy(m)
                    a = dist.sample(gen)
                obs.append(m)
                acts.append(a)
                logps.append(dist.log_prob(a))
                vals.append(v)
                rews.append(1.0 if int(a) == b else 0.0)
        batch = RolloutBatch(obs, torch.cat(acts), torch.cat(logps), torch.cat(vals), torch.tensor(rews),
                             torch.ones(len(obs)))
        stats = ppo_update(policy, optim, batch, cfg, rng)
    after = prob_of_best()
    assert all(a > 0.6 for a in after), (before, after)
    assert set(stats) >= {"policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "explained_variance"}


def test_target_kl_stops_early():
    torch.manual_seed(0)
    m = build_metagraph(_graph(5, 0), [_graph(4, 1), _graph(6, 2)])
    policy = GraphPolicy(PolicyConfig(4, 3, 2, EncoderConfig(hidden=16, layers=1, heads=2)))
    optim = torch.optim.SGD(policy.parameters(), lr=5.0)  # huge steps: the KL passes any small target
    actions = torch.tensor([1, 1, 2, 0])
    with torch.no_grad():
        dist, v = policy(MetaGraph.collate([m] * 4))
    batch = RolloutBatch([m] * 4, actions, dist.log_prob(actions), v, torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.ones(4))
    stats = ppo_update(policy, optim, batch, PPOConfig(update_epochs=10, minibatch_size=2, target_kl=1e-6),
                       np.random.default_rng(0))
    assert stats["epochs"] < 10


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_chunked_update_equals_whole_minibatch(chunk: int):
    """Encoding a minibatch `encode_chunk` states at a time (gradients accumulated) is the same update."""
    states = [build_metagraph(_graph(5, s), [_graph(4 + k, 10 * s + k) for k in range(1 + s % 3)]) for s in range(7)]
    torch.manual_seed(0)
    base = GraphPolicy(PolicyConfig(4, 3, 2, EncoderConfig(hidden=16, layers=2, heads=2)))
    with torch.no_grad():
        dist, v = base(MetaGraph.collate(states))
        actions = dist.sample(torch.Generator().manual_seed(1))
    rewards = torch.rand(7, generator=torch.Generator().manual_seed(2))
    batch = RolloutBatch(states, actions, dist.log_prob(actions), v, rewards, torch.tensor([0.0, 0, 1, 0, 0, 0, 1]))
    results = []
    for c in (0, chunk):
        policy = GraphPolicy(base.cfg)
        policy.load_state_dict(base.state_dict())
        optim = torch.optim.SGD(policy.parameters(), lr=0.1)  # (Adam would magnify rounding in ~0 gradients)
        stats = ppo_update(policy, optim, batch, PPOConfig(minibatch_size=5, update_epochs=2, encode_chunk=c),
                           np.random.default_rng(0))
        results.append((stats, policy.state_dict()))
    (s0, w0), (s1, w1) = results
    for k in s0:
        assert s1[k] == pytest.approx(s0[k], rel=1e-4, abs=1e-5), k  # some are sums that nearly cancel
    for k in w0:
        torch.testing.assert_close(w1[k], w0[k], rtol=1e-4, atol=1e-5)
