"""Issue 32.4: the factored action (xrl.rl.factored): the rules that match are found without building anything, and
only the best-scored rules' rewrites are built; what it offers is a part of the flat enumeration."""

from __future__ import annotations

import math

import pytest
import torch

from xrl.rewrite.apply import Applier
from xrl.rewrite.rules import use_rules
from xrl.rl.factored import FactoredEngine, factored_engine
from xrl.rl.guided import guided_search
from xrl.rl.priors import CostPrior, PolicyPrior
from xrl.search import suite


def graphs(cands) -> set[str]:
    return {c.graph.canonical_hash for c in cands}


@pytest.fixture(scope="module")
def mixed():
    """gen_mixed_0 under the benchmark's elementary rules: a dozen rules match its input."""
    with use_rules(suite.RULES):
        eng = suite.engine()
        yield suite.suite_graphs(None, ["gen_mixed_0"])[0].build(), eng, suite.cost_model()


def test_matching_rules_builds_nothing(mixed, monkeypatch):
    g, eng, cost = mixed
    flat_rules = {c.step.split("@")[0] for c in eng.candidates(g)}

    def no_build(*args, **kwargs):
        raise AssertionError("a candidate was built")

    monkeypatch.setattr(Applier, "apply", no_build)
    found = FactoredEngine(eng, cost).matching_rules(g)
    assert len(found) >= 4 and flat_rules <= set(found)


def test_factored_builds_fewer_candidates_than_flat_and_offers_flat_ones(mixed):
    g, eng, cost = mixed
    fac = FactoredEngine(eng, cost, top=1)
    first = fac.candidates(g)  # no rule built yet: each matching rule once (its prior is unknown)
    flat_first = eng.candidates(g)
    # the same rewrites (one another rule's label where the flat enumeration kept the first rule's of two equal ones)
    assert graphs(first) == graphs(flat_first) and fac.built == len(first)
    # the child of the input's best rewrite: rules with a prior now, and only the best one is built
    child = min(flat_first, key=lambda c: c.delta_cost(cost, cost.cost(g))).graph
    flat = eng.candidates(child)
    before = fac.built
    offered = fac.candidates(child)
    assert 0 < fac.built - before < len(flat)
    assert len({c.step.split("@")[0] for c in flat}) > 1  # several rules match the child
    assert graphs(offered) <= graphs(flat)
    # the rewrite the cost prior picks among the factored candidates is a flat candidate, with the same cost
    c0 = cost.cost(child)
    pick = min(offered, key=lambda c: c.delta_cost(cost, c0))
    same = next(c for c in flat if c.graph.canonical_hash == pick.graph.canonical_hash)
    assert same.delta_cost(cost, c0) == pytest.approx(pick.delta_cost(cost, c0))
    # the rule it came from is the one whose rewrites paid most at the input
    best_rule = max(fac.gain, key=lambda r: fac.gain[r] if r in {c.step.split("@")[0] for c in flat} else -math.inf)
    assert {c.step.split("@")[0] for c in offered} <= {best_rule} | (
        {c.step.split("@")[0] for c in flat} - {c.step.split("@")[0] for c in flat_first})


def test_the_untrained_rule_head_adds_nothing(mixed, shipped):
    g, eng, cost = mixed
    with_head = factored_engine(eng, cost, policy=shipped, top=1)
    plain = FactoredEngine(eng, cost, top=1)
    for fac in (with_head, plain):
        fac.candidates(g)
    rules = with_head.matching_rules(g)
    assert with_head.rule_logits(g, rules) == plain.rule_logits(g, rules)
    h = with_head.encode(g)
    assert h.shape == (shipped.cfg.encoder.hidden,)
    with torch.no_grad():
        with_head.head.embedding.weight.fill_(1.0)
    moved = with_head.head(h, [rules[0], "no_such_rule"])
    assert moved[0] != 0 and moved[1] == 0  # a rule outside the head's vocabulary gets no correction


@pytest.mark.parametrize("prior", ["cost", "policy"])
def test_the_guided_search_runs_on_the_factored_action(mixed, shipped, prior):
    g, eng, cost = mixed
    p = CostPrior() if prior == "cost" else PolicyPrior(shipped)
    run = guided_search(p, g, cost, engine=eng, time_limit=2.0, action="factored", top_rules=1)
    assert run.cost <= cost.cost(g) and run.steps
    assert suite.replay(g, run.steps, eng).canonical_hash == run.graph.canonical_hash
    with pytest.raises(ValueError, match="action"):
        guided_search(p, g, cost, engine=eng, time_limit=1.0, action="diagonal")


def test_search_rl_takes_the_action_option(mixed):
    from xrl.errors import ConfigError
    from xrl.search.registry import run_search

    g, _, cost = mixed
    with use_rules(suite.RULES):
        res = run_search("rl", g, cost, seed=0, steps=None, time_limit=3.0,
                         options={"action": "factored", "top_rules": "1"})
        assert res.cost <= cost.cost(g) and res.details["policy_loaded"]
        for bad in ({"action": "diagonal"}, {"action": "factored", "mode": "argmax"}, {"top_rules": 0}):
            with pytest.raises(ConfigError):
                run_search("rl", g, cost, seed=0, steps=None, time_limit=3.0, options=bad)
