"""Issue 32.4: a search given N cost-model calls makes at most N (xrl.search.budget.CallBudget)."""

from __future__ import annotations

import pytest

from xrl.env import resolve_graph
from xrl.search.budget import CallBudget
from xrl.search.greedy import greedy_search
from xrl.search.suite import CallCounter


@pytest.mark.parametrize("n", [1, 3, 6])
def test_greedy_makes_at_most_its_cost_call_budget(paper, n):
    g = resolve_graph("lora_qkv")
    free = CallCounter(paper)
    full = greedy_search(g, free.model, None)
    assert free.calls > 6  # the budgets below bind
    budget = CallBudget(paper, n)
    res = greedy_search(g, budget.model, None)
    assert budget.calls <= n and budget.refused > 0
    # what it kept was priced within the budget: never worse than the start, never better than the unbounded run
    assert paper.cost(full.graph) <= paper.cost(res.graph) <= paper.cost(g) * (1 + 1e-9)


def test_an_unbounded_budget_changes_nothing(paper):
    g = resolve_graph("lora_qkv")
    counted, budget = CallCounter(paper), CallBudget(paper, None)
    a, b = greedy_search(g, counted.model, None), greedy_search(g, budget.model, None)
    assert budget.calls == counted.calls and budget.refused == 0
    assert paper.cost(a.graph) == paper.cost(b.graph)


def test_the_guided_search_keeps_its_budget(paper):
    from xrl.rl.guided import guided_search
    from xrl.rl.priors import CostPrior

    g = resolve_graph("lora_qkv")
    budget = CallBudget(paper, 30)
    res = guided_search(CostPrior(), g, budget.model, time_limit=5.0)
    assert budget.calls <= 30
    assert paper.cost(res.graph) <= paper.cost(g) * (1 + 1e-9)


@pytest.mark.parametrize("method,options", [("greedy", {}), ("beam", {}), ("taso", {}), ("random", {}),
                                            ("rl-cost", {}), ("rl", {"mode": "argmax"})])
def test_every_search_keeps_max_cost_calls(paper, method, options):
    """The registry's option: what reaches the real model (counted below the budget) is at most N calls, for
    every search, so a search that priced graphs past the budget (bypassing it) fails here."""
    from xrl.search.registry import run_search

    g = resolve_graph("lora_qkv")
    n = 5
    below = CallCounter(paper)  # counts what gets through the budget to the model
    res = run_search(method, g, below.model, seed=0, steps=None, time_limit=10.0,
                     options={**options, "max_cost_calls": n})
    assert 0 < below.calls <= n
    assert res.details["cost_calls"] == below.calls
    assert paper.cost(res.graph) <= paper.cost(g) * (1 + 1e-9)


def test_the_counter_sees_every_call_a_search_makes(paper):
    """Without a budget the same searches make more than N calls: the test above binds."""
    from xrl.search.registry import run_search

    g = resolve_graph("lora_qkv")
    for method in ("greedy", "beam", "taso"):
        below = CallCounter(paper)
        run_search(method, g, below.model, seed=0, steps=None, time_limit=3.0, options={})
        assert below.calls > 5, method


def test_max_cost_calls_is_checked(paper):
    from xrl.errors import ConfigError
    from xrl.search.registry import run_search

    g = resolve_graph("lora_qkv")
    for bad in (0, -3, "x", 2.5):
        with pytest.raises(ConfigError):
            run_search("greedy", g, paper, seed=0, steps=None, time_limit=1.0, options={"max_cost_calls": bad})


def test_the_guided_search_stops_when_its_calls_are_spent(paper):
    """It does not spin to its time limit on +inf answers."""
    import time

    from xrl.rl.guided import guided_search
    from xrl.rl.priors import CostPrior

    g = resolve_graph("lora_qkv")
    budget = CallBudget(paper, 10)
    t0 = time.perf_counter()
    guided_search(CostPrior(), g, budget.model, time_limit=20.0)
    assert budget.exhausted and time.perf_counter() - t0 < 10.0
