"""Expert iteration (xrl.rl.expert_iteration): the guided search's best sequences become the policy's targets."""

from __future__ import annotations

import pytest

from xrl.cost import get_cost_model
from xrl.env import resolve_graph
from xrl.errors import ConfigError
from xrl.rl.checkpoint import load_policy
from xrl.rl.evaluate import optimize_with_policy
from xrl.rl.expert_iteration import ExpertIterationConfig, expert_iteration


def test_the_policy_learns_the_searched_sequence_and_experts_only_improve(tmp_path):
    paper = get_cost_model("analytic", device="h100")
    mlp = resolve_graph("mlp")
    cfg = ExpertIterationConfig(iterations=2, search_budget=2.0, epochs=30, lr=3e-3, minibatch_size=8)
    report = expert_iteration({"mlp": mlp}, {}, paper, cfg, out=tmp_path)
    first, second = (r["experts"]["mlp"] for r in report["iterations"])
    assert second["speedup"] >= first["speedup"]  # a worse search never replaces the expert
    assert second["speedup"] > 1.5  # the search found the merges (mlp: greedy 1.857x, best known 2.442x)
    last = report["iterations"][-1]
    assert last["last"]["accuracy"] == 1.0 and last["last"]["nll"] < last["first"]["nll"]
    policy, ckpt = load_policy(tmp_path / "last.pt")
    assert policy.cfg.use_hints is False  # graphs only by default: the X-RLflow setting
    assert ckpt["config"]["env"]["max_candidates"] == cfg.max_candidates
    played = optimize_with_policy(policy, mlp, paper, horizon=50, max_candidates=cfg.max_candidates)
    assert played.speedup == pytest.approx(second["speedup"], rel=1e-9)  # its argmax replays the expert
    assert (tmp_path / "best.pt").exists() and report["best_iteration"] in (1, 2)


def test_bad_settings_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="iterations"):
        ExpertIterationConfig(iterations=0)
    with pytest.raises(ConfigError, match="search_budget"):
        ExpertIterationConfig(search_budget=0)
    with pytest.raises(ConfigError, match="training graph"):
        expert_iteration({}, {}, get_cost_model("analytic"), ExpertIterationConfig(), out=tmp_path)
