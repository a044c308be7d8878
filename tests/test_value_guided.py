"""Issue 32.3: the guided search ranks its beam by the value head (value_weight) and stops where the value head
says nothing is left (value_stop); a value head fitted on states read as an episode's start is read so."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from xrl.env import GraphRewriteEnv, resolve_graph
from xrl.nn.encoders import EncoderConfig
from xrl.nn.policy import GraphPolicy
from xrl.rl.guided import guided_search
from xrl.rl.priors import PolicyPrior
from xrl.search.budget import CallBudget


def small_net(shipped, value_scale: float, **cfg) -> GraphPolicy:
    """A small residual network (its policy is the cost prior) whose value head is set by hand:
    V(s) = value_scale * (estimated cost of s / the input's), read from the state scalars (0: V = 0 everywhere)."""
    torch.manual_seed(0)
    net = GraphPolicy(dataclasses.replace(shipped.cfg, encoder=EncoderConfig(hidden=16, layers=1, heads=1),
                                          residual_prior=True, **cfg)).eval()
    first, second, last = net.value[0], net.value[2], net.value[4]
    h = first.in_features - 2  # the value head reads [h_s, state scalars]; scalar 1 is the cost ratio
    with torch.no_grad():
        for layer in (first, second, last):
            layer.weight.zero_()
            layer.bias.zero_()
        first.weight[0, h + 1] = 1.0
        second.weight[0, 0] = 1.0
        last.weight[0, 0] = value_scale
    return net


@pytest.fixture(scope="module")
def qkv(paper):
    """lora_qkv's input and its children: five rewrites of distinct estimated gains (-36% to +0.01%)."""
    env = GraphRewriteEnv(resolve_graph("lora_qkv"), paper, horizon=20, observation="summary")
    env.reset()
    children = []
    for a in range(1, len(env.candidates) + 1):
        child = env.fork()
        child.step(a)
        children.append((child.cost, child.last_rewrite))
    assert len({c for c, _ in children}) == len(children) >= 4
    return env, children


def test_the_value_head_picks_the_child_the_beam_expands_first(shipped, paper, qkv):
    env, children = qkv
    # V grows with the cost: the dearest child (a step that is not worth taking by cost) has the largest value
    prior = PolicyPrior(small_net(shipped, 1000.0))
    cheapest, dearest = min(children)[1], max(c for c in children if c[0] < 1.1 * env.cost)[1]
    order = {}
    for weight in (0.0, 1.0):
        expanded: list[list[str]] = []
        budget = CallBudget(paper, 100)  # the budget in cost calls, not seconds: the same on a loaded machine
        guided_search(prior, env.graph, budget.model, width=1, expand=8, time_limit=60.0, value_weight=weight,
                      expanded=expanded)
        assert expanded[0] == []  # the input first
        order[weight] = expanded[1]
    assert order[0.0] == [cheapest]  # ranked by the cost reached alone
    assert order[1.0] == [dearest]  # ranked by the value head


def test_value_stop_ends_the_search_where_the_value_head_sees_nothing_left(shipped, paper, qkv):
    env, _ = qkv
    calls, costs = {}, {}
    for scale, stop in ((1000.0, None), (0.0, 0.5), (1000.0, 0.5)):
        budget = CallBudget(paper, 300)  # without a stop the search spends all 300 calls
        run = guided_search(PolicyPrior(small_net(shipped, scale)), env.graph, budget.model, time_limit=60.0,
                            value_stop=stop)
        calls[scale, stop], costs[scale, stop] = budget.calls, run.cost
        assert run.cost <= env.cost  # never worse than the input (the argmax rollout runs first)
    assert calls[1000.0, None] == 300
    # V = 0 everywhere: nothing is expanded after the argmax rollout
    assert calls[0.0, 0.5] < 30 < calls[1000.0, 0.5], calls
    # V large everywhere: the search goes on until nothing is left open (here: every state the beam can reach,
    # after which the passes without a value stop repeat themselves at steeper alphas), and finds the same best
    assert calls[1000.0, 0.5] < 300 and costs[1000.0, 0.5] == costs[1000.0, None], (calls, costs)


def test_a_state_unit_value_reads_the_state_as_an_episode_start(shipped, paper, qkv):
    env, _ = qkv
    net = small_net(shipped, 10.0, value_unit="state")
    child = env.fork()
    child.step(1)  # a step down: the env's cost ratio and horizon left are no longer 1
    fresh = GraphRewriteEnv(child.graph, paper, horizon=20, observation="summary")
    fresh.reset()
    forked_v, fresh_v = (PolicyPrior(net).judge([e])[0].value for e in (child, fresh))
    assert forked_v == pytest.approx(fresh_v) == pytest.approx(10.0)
    start = small_net(shipped, 10.0)  # a critic's value reads the env's scalars
    assert PolicyPrior(start).judge([child])[0].value < 10.0 - 1e-3
    with pytest.raises(ValueError, match="value_unit"):
        small_net(shipped, 1.0, value_unit="nosuch")


def test_the_research_policy_value_head_is_read_in_state_units():
    from xrl.rl.checkpoint import load_policy
    from xrl.rl.policy_files import existing_policy_path

    net, ckpt = load_policy(existing_policy_path("research"))
    assert "value_head" in ckpt["metadata"] and net.cfg.value_unit == "state"


def test_the_value_flags_are_search_rl_options(capsys):
    from cli_helpers import assert_user_error, run

    assert_user_error(*run(capsys, "bench", "--graphs", "gen_branch_trap_0", "--value-weight", "1")[::2],
                      "--search rl")
    assert_user_error(*run(capsys, "optimize", "mlp", "--value-stop", "1")[::2], "--search rl only")
    code, out, _ = run(capsys, "bench", "--policy", "research", "--graphs", "gen_branch_trap_0", "--budget", "0.5",
                       "--value-weight", "0", "--value-stop", "1", "--json")
    assert code == 0 and '"verified": true' in out
