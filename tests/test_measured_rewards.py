"""Rewards from measurement: the environment under the default target cost (kernels timed on this machine)
and X-RLflow's sparse end-to-end reward (the whole graph timed every k steps, cached by its hash)."""

from __future__ import annotations

import numpy as np
import pytest

from xrl.cost import get_cost_model
from xrl.cost.e2e import E2ECostModel
from xrl.env import GraphRewriteEnv, resolve_graph


class CountingE2E(E2ECostModel):
    """The e2e model, counting its (uncached) timings."""

    def __init__(self, **kw) -> None:  # noqa: ANN003
        super().__init__(**kw)
        self.timed: list[str] = []

    def _time(self, graph):  # noqa: ANN001, ANN202
        self.timed.append(graph.canonical_hash)
        return super()._time(graph)


def play(env: GraphRewriteEnv, steps: int) -> list[float]:
    env.reset(seed=0)
    rewards = []
    for _ in range(steps):
        mask = env.action_masks()
        action = int(np.flatnonzero(mask[1:])[0]) + 1 if mask[1:].any() else 0
        _, r, terminated, truncated, _ = env.step(action)
        rewards.append(r)
        if terminated or truncated:
            break
    return rewards


def test_the_default_target_cost_rewards_measured_kernel_time(measured_defaults) -> None:
    cost = get_cost_model("target", target="ort-cpu", warmup=1, repeats=3)
    assert "measured kernels" in cost.describe()
    env = GraphRewriteEnv(resolve_graph("tiny_cnn"), cost, horizon=3)
    rewards = play(env, 3)
    assert rewards and env.hint_model is cost  # the hints come from the same measured kernels
    assert sum(rewards) == pytest.approx(100 * (env.cost0 - cost.cost(env.graph)) / env.cost0, abs=1e-9)
    assert cost.report()["kernels_measured"] > 0


def test_sparse_end_to_end_reward_times_the_graph_every_k_steps_once_per_graph() -> None:
    cost = CountingE2E(device="cpu", engine="ort", warmup=1, repeats=3)
    env = GraphRewriteEnv(resolve_graph("mlp"), cost, horizon=4, reward="sparse", reward_every=2)
    rewards = play(env, 4)
    assert len(rewards) >= 2 and rewards[0] == 0.0  # nothing timed between the k-th steps
    assert len(cost.timed) <= 1 + (len(rewards) + 1) // 2
    before = len(cost.timed)
    play(env, 4)  # the same episode again: every graph it reaches is in the cache
    assert len(cost.timed) == before
