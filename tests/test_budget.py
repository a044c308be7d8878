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
