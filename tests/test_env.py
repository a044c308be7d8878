"""The rewrite environment: gymnasium's contract, rewards, masks, caps, and its meta-graph."""

from __future__ import annotations

import logging

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import xrl.env
from xrl.cost import get_cost_model
from xrl.env import ENV_ID, GraphRewriteEnv, resolve_graph
from xrl.errors import ConfigError
from xrl.features.metagraph import CAND_DIM, FeatureCache
from xrl.rewrite import RewriteEngine


@pytest.fixture(scope="module")
def engine():
    return RewriteEngine.default()


@pytest.fixture(scope="module")
def mlp():
    return resolve_graph("mlp")


@pytest.fixture(scope="module")
def tiny_cnn():
    return resolve_graph("tiny_cnn")


def _env(graph, engine, **kw) -> GraphRewriteEnv:
    return GraphRewriteEnv(graph, get_cost_model("analytic"), engine=engine, **kw)


def _cheapest_action(env: GraphRewriteEnv) -> int:
    return 1 + int(np.argmin(env.candidate_hints()[1:, 0]))


@pytest.mark.parametrize("name", ["mlp", "tiny_cnn"])
def test_check_env_passes(name, engine):
    env = gym.make(ENV_ID, graph=name, cost="analytic", engine=engine, horizon=5)
    check_env(env.unwrapped, skip_render_check=False)
    env.close()


def test_registered_env_observations_fit_their_space(mlp, engine):
    env = gym.make(ENV_ID, graph=mlp, cost="analytic", engine=engine)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert info["action_mask"].shape == (env.action_space.n,)  # the action space's size
    assert info["action_mask"].sum() == obs["num_actions"] and info["action_mask"][:obs["num_actions"]].all()
    assert obs["num_actions"] > 1, "the mlp should have rewrites"
    obs, reward, terminated, truncated, info = env.step(1)
    assert env.observation_space.contains(obs)
    assert isinstance(reward, float)


def test_reset_is_reproducible_and_switches_graphs(mlp, tiny_cnn, engine):
    env = _env(mlp, engine)
    a, _ = env.reset(seed=3)
    env.step(1)
    b, _ = env.reset(seed=3)
    assert np.array_equal(a["summary"], b["summary"]) and a["num_actions"] == b["num_actions"]
    env.reset(options={"graph": tiny_cnn})
    assert env.graph is tiny_cnn and env.step_count == 0
    env.reset()
    assert env.graph is tiny_cnn  # the switch sticks until the next one


def test_dense_reward_is_the_relative_cost_drop(mlp, engine):
    cost = get_cost_model("analytic")
    env = _env(mlp, engine, horizon=10)
    env.reset()
    rt0 = prev = cost.cost(mlp)
    total = 0.0
    done = False
    while not done:
        _, reward, terminated, truncated, info = env.step(_cheapest_action(env))
        done = terminated or truncated
        now = cost.cost(env.graph)  # from scratch, not from the delta
        assert reward == pytest.approx(100 * (prev - now) / rt0, abs=1e-6)
        assert info["cost"] == pytest.approx(now, rel=1e-9)
        total += reward
        prev = now
    assert total == pytest.approx(100 * (1 - prev / rt0), abs=1e-6)
    assert env.speedup == pytest.approx(rt0 / prev)


def test_noop_and_invalid_actions_end_the_episode_unchanged(mlp, engine):
    env = _env(mlp, engine)
    for action in (0, 10**6, -1):
        env.reset()
        _, reward, terminated, truncated, info = env.step(action)
        assert terminated and not truncated
        assert reward == 0.0 and env.graph is mlp and info["rewrite"] is None


def test_horizon_truncates(mlp, engine):
    env = _env(mlp, engine, horizon=2)
    env.reset()
    _, _, terminated, truncated, _ = env.step(_cheapest_action(env))
    assert not terminated and not truncated
    _, _, terminated, truncated, info = env.step(_cheapest_action(env))
    assert truncated and not terminated and info["step"] == 2


def _play(env: GraphRewriteEnv) -> list[float]:
    env.reset()
    rewards, done = [], False
    while not done:
        _, r, terminated, truncated, _ = env.step(_cheapest_action(env))
        rewards.append(r)
        done = terminated or truncated
    return rewards


def test_sparse_reward_pays_every_k_steps_and_at_the_end(mlp, engine):
    dense = _play(_env(mlp, engine, horizon=5))
    sparse = _play(_env(mlp, engine, horizon=5, reward="sparse", reward_every=2))
    assert len(dense) == len(sparse) >= 3
    for t, r in enumerate(sparse, start=1):
        if t % 2 and t != len(sparse):
            assert r == 0.0
    assert sum(sparse) == pytest.approx(sum(dense), abs=1e-6)
    assert sparse[1] == pytest.approx(dense[0] + dense[1], abs=1e-6)


@pytest.mark.parametrize("shaping", ["flops", "ops"])
def test_shaping_telescopes_to_the_unshaped_return(shaping, mlp, engine):
    plain = _play(_env(mlp, engine, horizon=4))
    shaped = _play(_env(mlp, engine, horizon=4, shaping=shaping, gamma=1.0))
    assert sum(shaped) == pytest.approx(sum(plain), abs=1e-6)
    if shaping == "ops":  # the first rewrite of the mlp changes the op count: shaping moves credit
        assert shaped != pytest.approx(plain)


def test_candidate_cap_keeps_the_cheapest_and_says_so(mlp, engine, caplog):
    full = _env(mlp, engine)
    hints = full.candidate_hints()[1:, 0]
    assert len(hints) > 2
    with caplog.at_level(logging.INFO, logger="xrl.env.graph_rewrite"):
        capped = _env(mlp, engine, max_candidates=2)
    assert capped.num_actions == 3 and capped.action_space.n == 3
    assert sorted(capped.candidate_hints()[1:, 0].tolist()) == pytest.approx(sorted(hints)[:2])
    said = [r for r in caplog.records if "keeping the 2" in r.message]
    # a configured cap is a choice, said at INFO (a warning is kept for the built-in action limit)
    assert len(said) == 1 and said[0].levelno == logging.INFO


def test_meta_graph_lines_up_with_the_actions(mlp, engine):
    env = _env(mlp, engine)
    meta = env.meta_graph(FeatureCache())
    assert meta.num_states == 1
    assert meta.num_candidates == env.num_actions
    assert meta.graphs.num_graphs == env.num_actions  # the no-op reuses the current graph
    assert meta.cand_attr.shape == (env.num_actions, CAND_DIM)
    assert np.allclose(meta.cand_attr[0].numpy(), 0.0)
    assert meta.state_attr.tolist() == [[1.0, 1.0]]


def test_render_and_bad_settings(mlp, engine):
    env = _env(mlp, engine, render_mode="ansi")
    env.reset()
    env.step(_cheapest_action(env))
    text = env.render()
    assert "step 1/50" in text and "x)" in text and "last " in text
    for bad in (dict(horizon=0), dict(max_candidates=0), dict(reward="often"), dict(shaping="cost"),
                dict(reward="sparse", reward_every=0), dict(render_mode="video")):
        with pytest.raises(ConfigError):
            _env(mlp, engine, **bad)


def test_importing_registers_the_env():
    assert xrl.env.ENV_ID in gym.registry


def test_render_draws_the_rewritten_region(tmp_path):
    import gymnasium
    from xrl.graphs import build

    import xrl.env  # noqa: F401  (registers the environment)
    from xrl.env.render import region
    from xrl.frontends.onnx_io import from_onnx

    env = gymnasium.make("xrl/GraphRewrite-v0", graph=from_onnx(build("tiny_cnn")), render_mode="rgb_array").unwrapped
    env.reset(seed=0)
    env.step(1)
    assert env.last_added, "a rewrite was applied"
    core, around = region(env.graph, env.last_added)
    assert core == set(env.last_added) and around and not core & around
    image = env.render()
    assert image.ndim == 3 and image.shape[2] == 3 and image.dtype.name == "uint8"
    assert (image != 255).any(), "the picture is not blank"
    png = env.save_region(tmp_path / "region.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
