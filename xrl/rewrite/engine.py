"""Candidate generation: every distinct rewrite of a graph under a rule set, as cheap deltas.

The engine orchestrates: the Searcher (xrl.rewrite.search) finds each rule's matches, the Applier
(xrl.rewrite.apply) turns a match into a `Candidate` (xrl.rewrite.candidate), and the engine keeps
the candidates worth searching. Enumerating costs matching plus a few (memoised) shape inferences per
match; no new weight is computed or hashed (see `Candidate`).

Dropped while enumerating: candidates whose target does not type-check, that would create a
cycle, that would grow the graph past `max_growth` x its original op count, that rewrite the
graph into itself, and duplicates (the same nodes replaced by the same structure, whichever rule
or binding got there first).

The rules are always the caller's: `RewriteEngine(rules)`, or `RewriteEngine.default()` for the
verified built-in rule set (the one place the engine loads it).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence

from xrl.ir import Graph
from xrl.rewrite.apply import Applier, creates_cycle
from xrl.rewrite.candidate import Candidate
from xrl.rewrite.lang import Rule
from xrl.rewrite.match import GraphIndex, Match, on_step, past_deadline
from xrl.rewrite.rules import RuleSet, load_rules
from xrl.rewrite.search import Searcher

log = logging.getLogger(__name__)

MAX_MATCHES_ENV = "XRL_MAX_MATCHES"
# Candidates one rule may contribute per graph. Real graphs stay far below it; N ops sharing one input
# give a merge rule O(N^2) or O(N^3) matches (80 MatMuls: 85,320 candidates), which it cuts.
DEFAULT_MAX_MATCHES = 1000


def max_matches_default() -> int:
    raw = os.environ.get(MAX_MATCHES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_MATCHES
    try:
        value = int(raw)
    except ValueError:
        from xrl.errors import ConfigError

        raise ConfigError(f"{MAX_MATCHES_ENV}={raw!r} is not a whole number") from None
    return value if value > 0 else 2**62  # 0 or less: no cap


class RewriteEngine:
    """Enumerates the candidates of a graph under the rule set it is given."""

    def __init__(self, rules: RuleSet | Sequence[Rule], *, max_growth: float = 2.0,
                 exact_dedup: bool = False, max_matches: int | None = None) -> None:
        """max_growth: drop candidates with more than max_growth x the original graph's op count.
        exact_dedup: also drop candidates whose rewritten graph has the canonical hash of the current
        graph or of an earlier candidate, when different nodes were rewritten (see `candidates`).
        max_matches: candidates one rule may give per graph (default $XRL_MAX_MATCHES, else
        DEFAULT_MAX_MATCHES); the rest of its matches are not enumerated, and the cut is logged."""
        self.max_matches = max_matches if max_matches is not None else max_matches_default()
        self.cut_rules: Counter[str] = Counter()  # rule -> graphs where the cap cut its matches
        self.timed_out = 0  # enumerations stopped by a search's deadline
        self.rules: tuple[Rule, ...] = tuple(rules)
        self.max_growth = max_growth
        self.exact_dedup = exact_dedup
        self.searcher = Searcher(self.rules)
        self.applier = Applier()

    @classmethod
    def default(cls, *, max_growth: float = 2.0, exact_dedup: bool = False,
                max_matches: int | None = None) -> RewriteEngine:
        """An engine over the verified built-in rules (`load_rules()`), the one place they are loaded for one."""
        return cls(load_rules(), max_growth=max_growth, exact_dedup=exact_dedup, max_matches=max_matches)

    def __repr__(self) -> str:
        return f"RewriteEngine({len(self.rules)} rules, max_growth={self.max_growth})"

    def matches(self, graph: Graph) -> list[tuple[Rule, Match]]:
        """Every raw match (before building, deduplication and the cycle check)."""
        return self.searcher.matches(graph)

    def candidates(self, graph: Graph, *, original_nodes: int | None = None) -> list[Candidate]:
        """Every distinct rewrite of `graph`, in a deterministic order (rule order, then match order).

        Two candidates are the same when they replace the same nodes by the same structure (whatever
        rule or variable binding produced them): only the first is kept, and a candidate that puts
        back what it removes is dropped. That key is exact and cheap. Different rewrites that happen to
        give isomorphic graphs (possible only where a graph computes something twice) are told apart
        only by the canonical hash, which `exact_dedup=True` also compares, at the price of building
        and hashing each candidate's structure.
        """
        on_step(graph)  # a search step: the progress display, if one is shown
        index = GraphIndex(graph)
        limit = self.max_growth * (original_nodes if original_nodes is not None else len(graph))
        seen: set[tuple] = set()
        hashes = {graph.canonical_hash} if self.exact_dedup else set()
        out: list[Candidate] = []
        for rule, found in self.searcher.by_rule(index):
            if past_deadline():
                self.timed_out += 1
                if self.timed_out == 1:  # once: a search past its deadline would log this for every state it sees
                    log.info("candidate enumeration stopped at the time limit (%d candidates, before rule %s)",
                             len(out), rule.name)
                break
            node_sets: set[frozenset[str]] = set()
            for match in found:
                key = frozenset(n.name for n in match.nodes)
                if key in node_sets:
                    continue  # the same nodes under a symmetric binding (a+b vs b+a, Q/K/V in any order)
                if len(node_sets) >= self.max_matches:
                    self._cut(rule.name)
                    break
                built = self.applier.apply(index, rule, match)
                if built is None:
                    continue
                node_sets.add(key)
                cand = built.candidate
                if built.noop or built.delta_key in seen:
                    continue
                seen.add(built.delta_key)
                if len(graph) - len(cand.removed) + len(cand.added) > limit:
                    continue
                if creates_cycle(index, cand):
                    continue
                if self.exact_dedup:
                    h = cand.skeleton.canonical_hash
                    if h in hashes:
                        continue
                    hashes.add(h)
                out.append(cand)
        return out

    def _cut(self, rule: str) -> None:
        first = rule not in self.cut_rules
        self.cut_rules[rule] += 1
        log.log(logging.WARNING if first else logging.INFO,
                "rule %s matched more than %d places in one graph; only the first %d are candidates "
                "(raise %s to see more)", rule, self.max_matches, self.max_matches, MAX_MATCHES_ENV)
