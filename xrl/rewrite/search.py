"""The Searcher: a rule set's source patterns in, their matches in a graph out (egg's Searcher).

It holds one compiled `Matcher` per rule (xrl.rewrite.match) and yields matches rule by rule, in rule
order, so that its caller (the engine) can stop between rules at a deadline or cap one rule's matches.
Finding a match builds nothing: turning a match into a rewrite is the Applier's job (xrl.rewrite.apply).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from xrl.ir import Graph
from xrl.rewrite.lang import Rule
from xrl.rewrite.match import GraphIndex, Match, Matcher


class Searcher:
    """Every match of each rule's source pattern, rule by rule."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self._matchers = tuple(Matcher(r) for r in rules)

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(m.rule for m in self._matchers)

    def by_rule(self, index: GraphIndex) -> Iterator[tuple[Rule, Iterator[Match]]]:
        """(rule, its matches, found lazily) for each rule in order."""
        for m in self._matchers:
            yield m.rule, m.matches(index)

    def matches(self, graph: Graph | GraphIndex) -> list[tuple[Rule, Match]]:
        """Every raw match of every rule (nothing built, checked or deduplicated)."""
        index = graph if isinstance(graph, GraphIndex) else GraphIndex(graph)
        return [(rule, match) for rule, found in self.by_rule(index) for match in found]
