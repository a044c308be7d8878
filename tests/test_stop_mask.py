"""Issue 32.3: sampled training episodes may not stop while an improving candidate remains (mask_stop="improving"),
and PPO re-applies the recorded mask, so its probability ratio starts at exactly 1."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from xrl.env import GraphRewriteEnv, resolve_graph
from xrl.errors import ConfigError
from xrl.nn.distributions import GroupedCategorical
from xrl.nn.policy import GraphPolicy
from xrl.rl.ppo import PPOConfig, ppo_update
from xrl.rl.rollout import Rollout, check_mask_stop, play_episode, stop_mask


class StopLover(nn.Module):
    """A real residual network whose stop logit is raised by 50: unmasked, it stops at once."""

    def __init__(self, net: GraphPolicy) -> None:
        super().__init__()
        self.net = net

    def forward(self, meta):
        dist, value = self.net(meta)
        logits = dist.logits.clone()
        logits[dist.start] = logits[dist.start] + 50.0
        return GroupedCategorical(logits, dist.group, dist.num_groups), value


@pytest.fixture
def setup(shipped, paper):
    torch.manual_seed(0)
    net = GraphPolicy(dataclasses.replace(shipped.cfg, residual_prior=True, prior_temperature=1.0))
    policy = StopLover(net).eval()
    env = GraphRewriteEnv(resolve_graph("lora_tiny"), paper, horizon=4, observation="summary")
    return policy, net.features(64), env


def test_mask_modes(setup):
    policy, feats, env = setup
    env.reset()
    from xrl.rl.rollout import observe

    meta = observe(env, feats)
    assert (meta.cand_attr[1:, 0] < 0).any()  # lora_tiny's start has an improving rewrite
    assert stop_mask(meta, "improving") and not stop_mask(meta, "none")
    with pytest.raises(ConfigError):
        check_mask_stop("always")


def test_sampled_episode_does_not_stop_while_improving(setup):
    policy, feats, env = setup
    graph = resolve_graph("lora_tiny")
    plain = Rollout()
    play_episode(env, policy, feats, graph, greedy=False, generator=torch.Generator().manual_seed(0),
                 record_to=plain, mask_stop="none")
    assert plain.actions == [0]  # the stop-loving policy stops at once without the mask
    masked = Rollout()
    play_episode(env, policy, feats, graph, greedy=False, generator=torch.Generator().manual_seed(0),
                 record_to=masked, mask_stop="improving")
    assert masked.actions[0] != 0 and masked.stop_masked[0]
    assert len(masked.actions) > 1
    # argmax (evaluation) episodes are never masked
    rec = play_episode(env, policy, feats, graph, greedy=True, generator=None, mask_stop="improving")
    assert rec.length == 1


def test_ppo_reapplies_the_mask(setup):
    policy, feats, env = setup
    roll = Rollout()
    play_episode(env, policy, feats, resolve_graph("lora_tiny"), greedy=False,
                 generator=torch.Generator().manual_seed(1), record_to=roll, mask_stop="improving")
    assert any(roll.stop_masked)
    cfg = PPOConfig(update_epochs=1, minibatch_size=64, lr=0.0)
    opt = torch.optim.SGD(policy.parameters(), lr=0.0)
    stats = ppo_update(policy, opt, roll.to_batch(), cfg, np.random.default_rng(0))
    assert stats["approx_kl"] < 1e-6 and stats["clip_fraction"] == 0.0
    # without the recorded mask the update would score the actions under the unmasked distribution
    batch = dataclasses.replace(roll.to_batch(), stop_masked=None)
    stats = ppo_update(policy, opt, batch, cfg, np.random.default_rng(0))
    assert stats["approx_kl"] > 1.0


def test_masked_entropy_has_finite_gradients():
    logits = torch.tensor([0.5, 1.0, -2.0, 0.0], requires_grad=True)
    dist = GroupedCategorical(logits, torch.tensor([0, 0, 1, 1]), 2, torch.tensor([False, True, True, True]))
    dist.entropy().sum().backward()
    assert torch.isfinite(logits.grad).all()
