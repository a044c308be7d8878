"""Gymnasium and CompilerGym conventions of the rewrite environment: what an external RL library relies on."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import xrl  # noqa: F401  (registers the environments)
from xrl.env import EnvState, read_states, write_states
from xrl.errors import ConfigError
from xrl.rewrite import RewriteEngine


@pytest.fixture(scope="module")
def engine():
    return RewriteEngine.default()


@pytest.fixture()
def env(engine):
    e = gym.make("xrl/GraphRewrite-v0", engine=engine, horizon=6)
    yield e
    e.close()


def test_import_xrl_registers_every_environment_without_loading_torch():
    code = ("import sys, gymnasium, xrl; ids = [i for i in gymnasium.registry if i.startswith('xrl/')]; "
            "print(sorted(ids), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['xrl/GraphRewrite-v0', 'xrl/PassOrdering-v0'] False"


def test_make_with_defaults_gives_a_bounded_masked_env(env):
    u = env.unwrapped
    assert u.graph.name == "tiny_cnn" and env.action_space.n == 65
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    mask = u.action_masks()
    assert mask.shape == (env.action_space.n,) and mask.dtype == bool
    assert np.array_equal(mask, info["action_mask"]) and np.array_equal(mask, obs["action_mask"].astype(bool))
    assert mask.sum() == obs["num_actions"] > 1
    # the observation is the state: the current graph's nodes and edges, and each candidate
    n, e = int(obs["num_nodes"][0]), int(obs["num_edges"][0])
    assert n == len(u.graph.inputs) + len(u.graph.initializers) + len(u.graph)
    assert obs["node_x"][:n].any(axis=1).all() and not obs["node_x"][n:].any()
    assert (obs["edge_index"][:, :e] < n).all()
    k = int(obs["num_actions"])
    assert (obs["cand_rule"][1:k] > 0).all() and not obs["cand_rule"][k:].any() and obs["cand_rule"][0] == 0
    assert (obs["cand_loc"][1:k, 0] > 0).all()
    env.action_space.seed(0)
    for _ in range(5):
        a = env.action_space.sample(mask=mask.astype(np.int8))
        assert mask[a]


def test_check_env_passes_on_the_registered_default(env):
    check_env(env.unwrapped)


def test_state_replays_validates_and_round_trips(env, engine, tmp_path):
    u = env.unwrapped
    env.reset(seed=0)
    for _ in range(3):
        env.step(int(np.flatnonzero(u.action_masks())[-1]))
    st = u.state
    assert st.graph == "tiny_cnn" and len(st.actions) == 3 and all("@" in a for a in st.actions)
    assert st.reward == pytest.approx(u.episode_reward) and st.graph_hash == u.start_graph.canonical_hash

    other = gym.make("xrl/GraphRewrite-v0", engine=engine, horizon=6).unwrapped
    other.apply(st)
    assert other.state == st and other.graph.canonical_hash == u.graph.canonical_hash

    res = u.validate()
    assert res.ok and res.reward_reproduced and res.outputs_match, str(res)

    for name in ("s.json", "s.csv"):
        path = write_states([st, st], tmp_path / name)
        back = read_states(path)
        assert back == [st]  # a repeated state is replayed once (read_states keeps the distinct states)


def test_a_tampered_state_fails_validation_and_replay(env):
    u = env.unwrapped
    env.reset(seed=0)
    env.step(1)
    st = u.state
    bad_reward = EnvState(st.graph, st.graph_hash, st.actions, st.reward + 1.0, st.cost, st.speedup)
    res = u.validate(bad_reward)
    assert not res.ok and not res.reward_reproduced and res.outputs_match
    with pytest.raises(ConfigError, match="does not apply"):
        u.apply(EnvState(st.graph, st.graph_hash, ("no_such_rule@x",)))
    with pytest.raises(ConfigError, match="different graph"):
        u.apply(EnvState("mlp", "0" * 32, ()))  # the hash decides which graph a state belongs to


def test_fork_is_independent(env):
    u = env.unwrapped
    env.reset(seed=0)
    env.step(1)
    f = u.fork()
    f.step(1)
    assert len(u.actions) == 1 and len(f.actions) == 2
    assert u.state.actions == f.state.actions[:1]
    env.step(1)  # the original goes on by itself
    assert len(f.actions) == 2


def test_graph_observation_needs_a_cap(engine):
    from xrl.env import GraphRewriteEnv

    with pytest.raises(ConfigError, match="max_candidates"):
        GraphRewriteEnv("mlp", engine=engine, observation="graph")
    legacy = GraphRewriteEnv("mlp", engine=engine)  # xrl's own agent: uncapped, summary observation
    assert set(legacy.observation_space.spaces) == {"summary", "num_actions"}


@pytest.mark.parametrize("suffix", ["json", "csv"])
def test_cli_writes_replays_and_validates_states(tmp_path, suffix, capsys):
    from xrl.cli.main import main

    out = tmp_path / f"state.{suffix}"
    assert main(["env", "play", "mlp", "--steps", "3", "-o", str(out)]) == 0
    assert main(["env", "play", "mlp", "--steps", "3", "-o", str(out)]) == 2  # never overwrites without --force
    assert main(["env", "replay", str(out), "--validate", "--json"]) == 0
    assert '"valid": true' in capsys.readouterr().out
    st = read_states(out)[0]
    write_states([EnvState(st.graph, st.graph_hash, st.actions, st.reward + 5.0, st.cost)], out)
    assert main(["env", "replay", str(out), "--validate"]) == 1  # a reward the replay does not earn


def test_an_env_over_several_graphs_draws_one_per_reset_and_pads_for_the_largest(engine):
    env = gym.make("xrl/GraphRewrite-v0", graph=["mlp", "tiny_cnn"], engine=engine, horizon=3)
    seen = set()
    for seed in range(6):
        obs, _ = env.reset(seed=seed)
        assert env.observation_space.contains(obs)
        seen.add(env.unwrapped.state.graph)
    assert seen == {"mlp", "tiny_cnn"}
    first = [env.reset(seed=1)[0]["num_nodes"][0] for _ in range(2)]
    assert first[0] == first[1]


def test_the_uncapped_summary_env_still_passes_check_env(engine):
    from xrl.env import GraphRewriteEnv

    env = GraphRewriteEnv("mlp", engine=engine, horizon=3)  # what xrl's own agent builds
    check_env(env)
    assert env.action_masks().shape == (env.action_space.n,)


def test_a_model_file_is_a_graph_source(engine, tmp_path):
    import onnx
    from xrl.graphs import build

    from xrl.env import GraphRewriteEnv

    path = tmp_path / "mlp.onnx"
    onnx.save(build("mlp"), str(path))
    env = GraphRewriteEnv(str(path), engine=engine, horizon=2, max_candidates=8)
    env.reset(seed=0)
    env.step(1)
    assert env.state.graph == str(path) and env.validate().ok
