"""Priors for the guided search (xrl.rl.priors), `--search rl --prior`, and the guided search's stop rule."""

from __future__ import annotations

import time

import pytest
import torch
from cli_helpers import assert_user_error, run

from xrl.env import GraphRewriteEnv, resolve_graph
from xrl.errors import ConfigError
from xrl.rl.guided import guided_search
from xrl.rl.priors import CostPrior, PolicyPrior, UniformPrior, make_prior, untrained_like
from xrl.rl.rl_search import rl_search
from xrl.search.greedy import greedy_search


@pytest.fixture(scope="module")
def mlp_env(paper):
    env = GraphRewriteEnv(resolve_graph("mlp"), paper, horizon=50, observation="summary")
    env.reset()
    return env


def test_uniform_prior_is_equal_over_candidates_and_never_the_noop(mlp_env):
    (j,) = UniformPrior().judge([mlp_env])
    n = len(mlp_env.candidates)
    assert j.log_probs.shape == (n + 1,) and j.value == 0.0
    assert j.log_probs[0] == -float("inf")
    assert torch.allclose(j.log_probs[1:].exp(), torch.full((n,), 1 / n))


def test_cost_prior_prefers_the_largest_estimated_gain_and_stops_where_none_helps(mlp_env):
    hints = mlp_env.candidate_hints()[:, 0]
    sharp, flat = CostPrior(0.01).judge([mlp_env])[0], CostPrior(1e6).judge([mlp_env])[0]
    assert int(sharp.log_probs.argmax()) == int(hints.argmin())  # the no-op's hint is 0: an improving rewrite wins
    assert float(sharp.log_probs.exp().sum()) == pytest.approx(1.0, abs=1e-5)
    assert float(flat.log_probs.max() - flat.log_probs.min()) < 1e-3  # a hot temperature is uniform
    with pytest.raises(ConfigError, match="temperature"):
        CostPrior(0.0)


def test_untrained_prior_has_the_shape_a_seed_and_leaves_the_rng_alone(shipped, mlp_env):
    state = torch.get_rng_state()
    a, b, c = untrained_like(shipped, 1), untrained_like(shipped, 1), untrained_like(shipped, 2)
    assert torch.equal(torch.get_rng_state(), state)
    assert a.cfg == shipped.cfg
    ja, jb, jc = (PolicyPrior(n).judge([mlp_env])[0] for n in (a, b, c))
    jt = PolicyPrior(shipped).judge([mlp_env])[0]
    assert torch.equal(ja.log_probs, jb.log_probs) and not torch.equal(ja.log_probs, jc.log_probs)
    assert not torch.equal(ja.log_probs, jt.log_probs)
    assert make_prior("untrained", policy=shipped, seed=3).name == "untrained-3"
    with pytest.raises(ConfigError, match="unknown prior 'nosuch'"):
        make_prior("nosuch")


def test_every_prior_guides_the_same_search_to_a_verified_path(paper):
    g = resolve_graph("lora_qkv")
    greedy = paper.cost(greedy_search(g, paper, None).graph)
    for name in ("trained", "untrained", "uniform", "cost"):
        trace: list[tuple[float, float]] = []
        res = guided_search(make_prior(name, seed=1), g, paper, horizon=50, time_limit=20, trace=trace)
        assert res.cost == pytest.approx(paper.cost(res.graph), rel=1e-9)
        assert trace[0] == (0.0, res.original_cost) and trace[-1][1] == res.cost  # the anytime curve
        assert all(b[0] >= a[0] and b[1] < a[1] for a, b in zip(trace, trace[1:]))
        if name != "uniform":  # each of the others' argmax rollout is greedy here (the cost prior's by estimate)
            assert res.cost <= greedy * (1 + 1e-9)


def test_stop_rule_ends_the_search_well_before_its_budget_where_greedy_is_optimal(paper):
    """On tiny_cnn nothing is left beyond what greedy finds: `--search rl` with its defaults (stop on) returns
    greedy's result in a fraction of a 60 s budget; with stop off it runs to its budget."""
    g = resolve_graph("tiny_cnn")
    greedy = greedy_search(g, paper, None)
    t0 = time.perf_counter()
    res = rl_search(g, paper, budget=60)
    took = time.perf_counter() - t0
    assert res.cost <= paper.cost(greedy.graph) * (1 + 1e-9)
    assert took < 15, took  # well before the 60 s budget (the machine is shared: a wide margin)
    t0 = time.perf_counter()
    rl_search(g, paper, budget=4, stop=False, prior="uniform")
    assert time.perf_counter() - t0 >= 3.5  # without the stop rule, the budget is what ends it


def test_prior_options_are_checked(capsys, paper):
    code, _, err = run(capsys, "optimize", "mlp", "--search", "greedy", "--prior", "uniform")
    assert_user_error(code, err, "apply to --search rl")
    g = resolve_graph("mlp")
    with pytest.raises(ConfigError, match="unknown prior"):
        rl_search(g, paper, prior="nosuch")
    with pytest.raises(ConfigError, match="mode argmax plays the trained policy"):
        rl_search(g, paper, prior="uniform", mode="argmax")
    from xrl.rl.rl_search import run_rl

    with pytest.raises(ConfigError, match="stop must be true or false"):
        run_rl(g, paper, seed=0, steps=None, time_limit=None, stop="maybe")


def test_optimize_with_a_uniform_prior_from_the_cli(capsys):
    code, out, err = run(capsys, "optimize", "lora_qkv", "--search", "rl", "--prior", "uniform", "--json",
                         "--time-limit", "10")
    assert code == 0, err
    assert '"prior": "uniform"' in out


def test_the_ablations_are_searches_compare_can_run(paper):
    from xrl.search.compare import resolve_methods
    from xrl.search.registry import run_search

    assert resolve_methods("rl,rl-untrained,rl-uniform,rl-cost,rl-argmax")[1:] == (
        "rl-untrained", "rl-uniform", "rl-cost", "rl-argmax")
    out = run_search("rl-cost", resolve_graph("lora_qkv"), paper, seed=0, steps=None, time_limit=5, options={})
    assert out.details["prior"] == "cost" and out.details["mode"] == "guided"
    out = run_search("rl-argmax", resolve_graph("lora_qkv"), paper, seed=0, steps=None, time_limit=5, options={})
    assert out.details["mode"] == "argmax"


def _experiment(name: str):
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "experiments"
    sys.path.insert(0, str(root))
    spec = importlib.util.spec_from_file_location(name, root / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_split_is_by_family_and_held_out_families_are_never_trained_or_selected_on():
    splits = _experiment("splits")
    trained = {splits.family_of(g) for g in (*splits.TRAIN, *splits.VAL)}
    assert trained == set(splits.TRAIN_FAMILIES)
    assert not trained & {splits.family_of(g) for g in splits.HELD_OUT}
    assert all(splits.family_of(g) for g in splits.HELD_OUT)


def test_ablation_learning_gain_is_over_the_trained_seeds_mean_with_each_seed_and_the_shipped_policy():
    ablation = _experiment("rl_ablation")
    speedups = {"trained-0": 1.2, "trained-1": 1.8, "untrained-0": 1.0, "untrained-1": 1.0, "uniform": 1.0,
                "cost": 1.2, "greedy": 1.5, "shipped": 1.2}
    rows = [{"graph": "g", "split": "held-out", "arm": a, "budget": "3.0", "speedup": str(x)}
            for a, x in speedups.items()]
    text = ablation.summarise(rows, "header")
    gain = next(line for line in text.splitlines() if line.startswith("| held-out | 3 |"))
    cells = [c.strip() for c in gain.strip("|").split("|")]
    # trained = the seeds' geomean 1.470; best non-learned = cost 1.2; per seed 1.000 / 1.500; vs shipped 1.225
    assert cells[2] == "1.470" and cells[6] == "cost" and cells[7] == "1.225" and cells[8] == "1.000 / 1.500"
    assert cells[-1] == "1.225" and cells[-2] == "1.200"
