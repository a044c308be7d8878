"""The pass-ordering environment: passes, fixed-length episodes, rewards and shaping, the default-order evaluation."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import xrl  # noqa: F401  (registers xrl/PassOrdering-v0)
from xrl.env import resolve_graph
from xrl.env.pass_order import PASSES, PassOrderingEnv, cse, dce, default_order, evaluate_orders, geomean
from xrl.errors import ConfigError
from xrl.ir import Node


@pytest.fixture(scope="module")
def mlp():
    return resolve_graph("mlp")


def _duplicate(graph, consumed: bool):
    """The graph with a copy of its first operator; `consumed`: the copy's output replaces one use of the original."""
    first = graph.topological_order[0]
    dup = Node(first.name + "_dup", first.op, first.inputs, tuple(v + "_dup" for v in first.outputs), first.attrs,
               first.domain)
    if not consumed:
        return graph.replace(add=[dup], new_types={v + "_dup": graph.type_of(v) for v in first.outputs}), first
    user = next(n for n in graph.topological_order if first.outputs[0] in n.inputs)
    moved = Node(user.name, user.op, tuple(v + "_dup" if v == first.outputs[0] else v for v in user.inputs),
                 user.outputs, user.attrs, user.domain)
    g = graph.replace(remove=[user.name], add=[dup, moved],
                      new_types={v + "_dup": graph.type_of(v) for v in first.outputs})
    return g, first


def test_dce_and_cse(mlp):
    dead, _ = _duplicate(mlp, consumed=False)
    assert len(dead) == len(mlp) + 1 and len(dce(dead)) == len(mlp)
    twin, _ = _duplicate(mlp, consumed=True)
    assert len(twin) == len(mlp) + 1
    merged = cse(twin)
    assert len(merged) == len(mlp) and merged.canonical_hash == mlp.canonical_hash
    assert cse(mlp) is mlp and dce(mlp) is mlp  # nothing to do: the same graph back


def test_make_and_check_env():
    env = gym.make("xrl/PassOrdering-v0", graph="mlp")
    check_env(env.unwrapped)
    assert env.action_space.n == len(PASSES) and env.unwrapped.action_masks().all()


def test_fixed_length_episode_and_op_count_reward(mlp):
    env = PassOrderingEnv(mlp, horizon=4)
    obs, _ = env.reset(seed=0)
    assert obs["op_counts"].sum() == len(mlp)
    total, steps = 0.0, 0
    for a in (2, 0, 1, 2):  # fusion, cse, dce, fusion again
        obs, r, terminated, truncated, info = env.step(a)
        total, steps = total + r, steps + 1
        assert not terminated and truncated == (steps == 4)
        assert obs["op_counts"].sum() == info["ops"]
    assert total == pytest.approx(100.0 * (len(mlp) - len(env.graph)) / len(mlp))
    assert len(env.graph) < len(mlp)


def test_potential_shaping_telescopes_with_gamma_one(mlp):
    order = (2, 3, 0, 1)
    totals = []
    for shaping in ("none", "potential"):
        env = PassOrderingEnv(mlp, horizon=len(order), shaping=shaping, gamma=1.0)
        env.reset()
        totals.append(sum(env.step(a)[1] for a in order))
    assert totals[0] == pytest.approx(totals[1])  # Phi(s_0) = 0 and Phi(terminal) = 0
    env = PassOrderingEnv(mlp, horizon=3, shaping="potential", gamma=1.0)
    env.reset()
    _, shaped, *_ = env.step(2)
    assert shaped != pytest.approx(100.0 * (len(mlp) - len(env.graph)) / len(mlp))  # credit moved earlier


def test_default_order_against_itself_and_a_bad_order(mlp):
    default = default_order()
    res = evaluate_orders([mlp], lambda e, o: default[e.step_count])
    assert res[0].improvement == 1.0 and res[0].default_ops < res[0].ops0
    bad = evaluate_orders([mlp], lambda e, o: 0)  # cse only
    assert bad[0].ops == bad[0].ops0 and bad[0].improvement < 1.0
    assert geomean([2.0, 0.5]) == pytest.approx(1.0)


def test_bad_configuration():
    with pytest.raises(ConfigError, match="reward"):
        PassOrderingEnv("mlp", reward="speed")
    with pytest.raises(ConfigError, match="horizon"):
        PassOrderingEnv("mlp", horizon=0)


def test_cli_reports_the_geomean(capsys):
    from xrl.cli.main import main

    assert main(["env", "passes", "--graphs", "mlp", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"geomean"' in out and '"default_ops"' in out
    assert np.isfinite(float(out.split('"geomean":')[1].split()[0].strip(",}")))


def test_a_suite_env_draws_its_graph_from_the_reset_seed():
    env = PassOrderingEnv(["mlp", "tiny_cnn"], horizon=2)
    names = {env.reset(seed=s)[1]["ops0"] for s in range(8)}
    assert names == {len(resolve_graph("mlp")), len(resolve_graph("tiny_cnn"))}
    assert env.reset(seed=5)[1]["ops0"] == env.reset(seed=5)[1]["ops0"]


def test_sb3_ppo_runs_on_the_pass_ordering_env():
    pytest.importorskip("stable_baselines3", reason="stable-baselines3 is not installed (pip install 'xrl[rl-ext]')")
    import torch
    from stable_baselines3 import PPO

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        env = gym.make("xrl/PassOrdering-v0", graph=["mlp", "tiny_cnn"], shaping="potential")
        model = PPO("MultiInputPolicy", env, n_steps=40, batch_size=20, n_epochs=1, seed=0,
                    policy_kwargs={"net_arch": [16]})
        model.learn(80)
    finally:
        torch.set_num_threads(threads)
    res = evaluate_orders(["mlp"], lambda e, o: int(model.predict(o, deterministic=True)[0]))
    assert res[0].ops <= res[0].ops0


def test_idle_marks_passes_at_their_fixed_point(mlp):
    env = PassOrderingEnv(mlp, horizon=4)
    env.reset()
    obs = env.step(0)[0]  # cse: nothing to merge in the mlp
    assert obs["idle"][0] == 1 and obs["idle"].sum() == 1
    obs = env.step(2)[0]  # fusion changes the graph: every pass may do something again
    assert not obs["idle"].any()
