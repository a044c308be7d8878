"""Issue 32.3: the residual policy (cost prior + a learned correction whose last layer starts at zero) is, untrained,
exactly the cost prior; training moves it away."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from xrl.env import GraphRewriteEnv, resolve_graph
from xrl.nn.policy import GraphPolicy
from xrl.rl.priors import CostPrior, PolicyPrior


def residual_net(shipped, temperature: float, *, use_hints: bool = True, seed: int = 0) -> GraphPolicy:
    torch.manual_seed(seed)
    cfg = dataclasses.replace(shipped.cfg, residual_prior=True, prior_temperature=temperature, use_hints=use_hints)
    return GraphPolicy(cfg).eval()


@pytest.mark.parametrize("graph", ["mlp", "lora_qkv", "lora_tiny"])
@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_untrained_residual_policy_equals_the_cost_prior(shipped, paper, graph, temperature):
    env = GraphRewriteEnv(resolve_graph(graph), paper, horizon=20, observation="summary")
    env.reset()
    assert len(env.candidates) > 1
    want = CostPrior(temperature).judge([env])[0].log_probs
    for use_hints in (True, False):  # the graphs-only network starts at the same prior
        got = PolicyPrior(residual_net(shipped, temperature, use_hints=use_hints)).judge([env])[0].log_probs
        assert torch.allclose(got, want, atol=1e-5), (got, want)
    # the plain network is not the prior: the equality is the residual design's, not a coincidence
    plain = PolicyPrior(GraphPolicy(dataclasses.replace(shipped.cfg, residual_prior=False)).eval())
    assert not torch.allclose(plain.judge([env])[0].log_probs, want, atol=1e-3)


def test_the_correction_learns(shipped, paper):
    env = GraphRewriteEnv(resolve_graph("mlp"), paper, horizon=20, observation="summary")
    env.reset()
    net = residual_net(shipped, 1.0).train()
    prior = PolicyPrior(net)
    meta = prior.featurize.observe(env)
    target = 0  # push the no-op up: a gradient step must change the distribution
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    before = net(meta)[0].log_probs.detach().clone()
    for _ in range(3):
        dist, _ = net(meta)
        loss = -dist.log_prob(torch.tensor([target]))
        opt.zero_grad()
        loss.sum().backward()
        opt.step()
    after = net(meta)[0].log_probs.detach()
    assert after[target] > before[target]
