"""The factored action (issue 32.4): a rule first, then where to apply it; only the chosen rules' rewrites are built.

A flat step enumerates every rewrite of a state (match every rule, then build each match's candidate: shape
inference, the cycle check, deduplication), costs them all and encodes every candidate's region for the policy. A
factored step asks first which rules match at all (the rule matchers alone, nothing built: the engine's Searcher
finds matches lazily, so a rule's first match ends its check), scores those rules, and builds, costs and encodes
only the candidates of the `top` best-scored ones:

    rules(s)      = {r : r has a match in s}                   match-only (xrl.rewrite.search.Searcher)
    logit(r | s)  = prior(r) / T + correction(r, h_s)           h_s: the policy's encoding of the state alone
    candidates(s) = the candidates of the `top` rules by logit  (ties: the engine's rule order)

prior(r) is the cost prior at the rule level as far as it can be known without building: the best estimated gain
(percent of the state's cost) among r's candidates the last time they were built in this search; a rule not yet
built has an infinite prior and is built whatever `top` says, so each matching rule is built once (the first state
is enumerated as a flat step would) and from then on a state builds the rules whose rewrites paid most where last
seen (and any rule matching for the first time). The correction is
`xrl.nn.rule_head.RuleHead`, a learned score per rule read from h_s whose embedding starts at zero: untrained, the
factored policy is this cost prior at the rule level (it is not trained yet: the PPO and expert-iteration
collectors play the flat action).

`FactoredEngine` is a drop-in engine (`candidates(graph, original_nodes=)`): the RL environment and the guided
search (`guided_search(action="factored")`) take it as they take a RewriteEngine. `built` counts the candidates it
built and `states` the states it enumerated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from xrl.cost.base import CostModel
from xrl.ir import Graph

ACTIONS = ("flat", "factored")
TOP_RULES = 2  # rules built per state
RULE_TEMPERATURE = 1.0  # percent of the state's cost: a rule whose best rewrite gained 1% more is e times likelier


class FactoredEngine:
    """A RewriteEngine's candidates, built only for the `top` rules a state's rule scores pick (the module's doc)."""

    def __init__(self, engine: Any, cost_model: CostModel, *, top: int = TOP_RULES, head: Any = None,
                 encode: Any = None, temperature: float = RULE_TEMPERATURE) -> None:
        """`engine`: the flat RewriteEngine whose rules, growth limit and match cap are used; `cost_model` prices the
        built candidates for the rule prior; `head` (an xrl.nn.rule_head.RuleHead, or None: the prior alone) and
        `encode` (graph -> h_s [H], the policy's encoding of a state) give the learned correction."""
        if top < 1:
            raise ValueError(f"top must be at least 1, not {top}")
        if not temperature > 0:
            raise ValueError(f"the rule temperature must be positive, not {temperature}")
        if (head is None) != (encode is None):
            raise ValueError("a rule head needs the state encoder, and the encoder a head")
        self.engine, self.cost_model, self.top, self.head, self.encode = engine, cost_model, top, head, encode
        self.temperature = temperature
        self.rules = tuple(engine.rules)
        self.max_growth, self.max_matches = engine.max_growth, engine.max_matches
        self._one: dict[str, Any] = {}  # rule name -> an engine over that rule alone
        self.gain: dict[str, float] = {}  # rule name -> best estimated gain (%) of its candidates where last built
        self.built = self.states = 0

    @property
    def timed_out(self) -> int:
        """Enumerations a search's deadline stopped (MemoEngine keeps no list cut short)."""
        return sum(e.timed_out for e in self._one.values())

    def matching_rules(self, graph: Graph) -> list[str]:
        """The rules with at least one match in `graph`, in the engine's order; nothing is built."""
        from xrl.rewrite.match import GraphIndex

        index = GraphIndex(graph)
        return [rule.name for rule, found in self.engine.searcher.by_rule(index) if next(iter(found), None) is not None]

    def rule_logits(self, graph: Graph, rules: Sequence[str]) -> list[float]:
        """logit(r | s) for each of `rules` (the module's doc)."""
        prior = [self.gain.get(r, math.inf) / self.temperature for r in rules]
        if self.head is None:
            return prior
        import torch

        with torch.no_grad():
            correction = self.head(self.encode(graph), list(rules)).tolist()
        return [p + c for p, c in zip(prior, correction)]

    def ranked(self, graph: Graph) -> list[str]:
        """The rules that match `graph`, best logit first (ties: the engine's order)."""
        rules = self.matching_rules(graph)
        logits = self.rule_logits(graph, rules)
        return [rules[i] for i in sorted(range(len(rules)), key=lambda i: -logits[i])]

    def candidates(self, graph: Graph, *, original_nodes: int | None = None) -> list:
        """The candidates of the `top` best-ranked rules that give any (a match may build nothing: a cycle, a
        no-op), in rank order; each built rule's best estimated gain becomes its prior."""
        self.states += 1
        out: list = []
        c0, used = math.nan, 0
        for name in self.ranked(graph):
            if used >= self.top and name in self.gain:
                break  # past the top rules; a rule never built yet (infinite prior) is built once all the same
            cands = self._engine_for(name).candidates(graph, original_nodes=original_nodes)
            self.built += len(cands)
            if not cands:
                continue
            if math.isnan(c0):
                c0 = self.cost_model.cost(graph)
            self.gain[name] = max(100.0 * (c0 - c.delta_cost(self.cost_model, c0)) / c0 for c in cands)
            out.extend(cands)
            used += 1
        return out

    def _engine_for(self, name: str) -> Any:
        if name not in self._one:
            rule = next(r for r in self.rules if r.name == name)
            self._one[name] = type(self.engine)([rule], max_growth=self.max_growth, max_matches=self.max_matches)
        return self._one[name]


def factored_engine(engine: Any, cost_model: CostModel, *, policy: Any = None, top: int = TOP_RULES,
                    seed: int = 0) -> FactoredEngine:
    """A FactoredEngine over `engine`'s rules; with `policy` (a GraphPolicy), the rule head reads its encoder's
    state embedding (a fresh, zero-initialised RuleHead: the factored policy starts as the rule-level cost prior)."""
    if policy is None:
        return FactoredEngine(engine, cost_model, top=top)
    from xrl.nn.rule_head import RuleHead, state_encoder

    head = RuleHead([r.name for r in engine.rules], policy.cfg.encoder.hidden, seed=seed)
    return FactoredEngine(engine, cost_model, top=top, head=head, encode=state_encoder(policy))


__all__ = ["ACTIONS", "RULE_TEMPERATURE", "TOP_RULES", "FactoredEngine", "factored_engine"]
