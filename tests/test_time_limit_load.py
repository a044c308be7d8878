"""Issue 32.4: `--search rl --time-limit T` includes the policy's load: what torch's import and the policy file take
comes out of the search's time, and a limit that leaves no time for them returns greedy's result unloaded."""

from __future__ import annotations

import time

import pytest

import xrl.rl.checkpoint as checkpoint
import xrl.rl.evaluate as evaluate
from xrl.env import resolve_graph
from xrl.errors import ConfigError
from xrl.rl import guided, rl_search
from xrl.search.registry import run_search

LOAD_S = 0.5


@pytest.fixture(scope="module", autouse=True)
def rules_parsed():
    """The built-in rules parsed once (2 s the first time in a process, inside a run's limit otherwise)."""
    from xrl.rewrite import RewriteEngine

    RewriteEngine.default()


@pytest.fixture
def slow_load(monkeypatch):
    real = checkpoint.load_policy

    def load(path):
        time.sleep(LOAD_S)  # a slow import and load
        return real(path)

    monkeypatch.setattr(checkpoint, "load_policy", load)


def given_time(monkeypatch, module, name):
    """Wrap module.name to record the seconds left to its deadline when it was called."""
    real, seen = getattr(module, name), []

    def wrapped(*args, **kwargs):
        now = time.perf_counter()
        t0 = kwargs.get("t0") or now
        seen.append(t0 + kwargs["time_limit"] - now)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)
    return seen


@pytest.mark.parametrize("options", [{}, {"stop": False}])  # anchored on greedy (the default), and the prior alone
def test_the_guided_search_gets_the_time_limit_less_the_load(monkeypatch, slow_load, paper, options):
    seen = given_time(monkeypatch, guided, "guided_search")
    t = time.perf_counter()
    res = run_search("rl", resolve_graph("lora_tiny"), paper, seed=0, steps=None, time_limit=1.0, options=options)
    assert res.details["policy_loaded"] and len(seen) == 1
    assert seen[0] <= 1.0 - LOAD_S + 0.05, seen  # the load's 0.5 s came out of the search's second
    assert time.perf_counter() - t < 1.0 + 2.0  # the whole run: the limit and a step or batch beyond (loaded machine)


def test_the_argmax_rollout_gets_the_time_limit_less_the_load(monkeypatch, slow_load, paper):
    seen = given_time(monkeypatch, evaluate, "optimize_with_policy")
    run_search("rl", resolve_graph("lora_tiny"), paper, seed=0, steps=None, time_limit=1.0, options={"mode": "argmax"})
    assert len(seen) == 1 and seen[0] <= 1.0 - LOAD_S + 0.05, seen


def test_a_limit_with_no_time_for_the_load_returns_greedys_result_unloaded(monkeypatch, paper):
    def no_load(path):
        raise AssertionError("the policy was loaded with no time left for it")

    monkeypatch.setattr(checkpoint, "load_policy", no_load)
    monkeypatch.setattr(rl_search, "expected_load_s", lambda: 5.0)  # a cold torch import on a slow machine
    g = resolve_graph("lora_tiny")
    # greedy to its end (no limit: a first call in a process parses the rule files, which on a loaded machine can
    # take the second a limit of 1 s gives); the fallback below then runs with the rules parsed
    greedy = run_search("greedy", g, paper, seed=0, steps=None, time_limit=None, options={})
    t = time.perf_counter()
    res = run_search("rl", g, paper, seed=0, steps=None, time_limit=1.0, options={})
    assert time.perf_counter() - t < 2.0  # greedy on a small graph, no import
    assert res.details["policy_loaded"] is False and res.cost == pytest.approx(greedy.cost)
    assert res.cost < res.original_cost
    assert res.steps == greedy.steps


def test_value_options_reach_the_guided_search(monkeypatch, paper):
    seen = []
    real = guided.guided_search

    def wrapped(*args, **kwargs):
        seen.append((kwargs.get("value_weight"), kwargs.get("value_stop")))
        return real(*args, **kwargs)

    monkeypatch.setattr(guided, "guided_search", wrapped)
    run_search("rl", resolve_graph("mlp"), paper, seed=0, steps=None, time_limit=5.0,
               options={"value_weight": "0.5", "value_stop": 2})
    assert seen == [(0.5, 2.0)]
    for bad in ({"value_weight": "lots"}, {"value_stop": -1}):
        with pytest.raises(ConfigError, match="value_"):
            run_search("rl", resolve_graph("mlp"), paper, seed=0, steps=None, time_limit=5.0, options=bad)
