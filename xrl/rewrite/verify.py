"""Numerical verification of rules: a rule that changes what a graph computes is never loaded.

For each rule and trial: draw a random instance of its source pattern (`instantiate`), find the
rule's matches in it (Searcher) and build every rewrite (Applier), and run the source graph and each
rewritten graph in float64 with the reference executor on the same random inputs. The outputs
must agree to 1e-9 (relative to the output's magnitude). New weights are computed in float64 too,
so a correct rule is exact up to summation order.

A trial only counts if the rule matches the *whole* instance; draws that do not fit (shapes that
break inference, conditions that do not hold) are retried, and a rule that cannot be instantiated
in `attempts` draws fails: an unverifiable rule is as good as a wrong one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xrl.errors import XrlError
from xrl.ir import Graph
from xrl.ir.execute import execute
from xrl.rewrite.apply import Applier, creates_cycle
from xrl.rewrite.candidate import Candidate
from xrl.rewrite.instantiate import InstanceError, instantiate
from xrl.rewrite.lang import Rule
from xrl.rewrite.match import GraphIndex
from xrl.rewrite.search import Searcher

TOLERANCE = 1e-9


@dataclass(frozen=True)
class RuleCheck:
    """The verification outcome of one rule, JSON-ready."""

    name: str
    family: str
    ok: bool
    max_err: float  # largest relative output difference over all trials
    trials: int  # trials that instantiated and were checked
    detail: str  # why it failed, or a note ("" when fine)
    time_s: float = 0.0


def verify_rules(rules: Sequence[Rule], *, seed: int = 0, trials: int = 3, attempts: int = 300) -> list[RuleCheck]:
    """Check every rule; the result is in rule order."""
    return [verify_rule(r, seed=seed, trials=trials, attempts=attempts) for r in rules]


def verify_rule(rule: Rule, *, seed: int = 0, trials: int = 3, attempts: int = 300) -> RuleCheck:
    t0 = time.perf_counter()
    # The rule's name seeds its stream: adding a rule does not change how the others are drawn.
    rng = np.random.default_rng([seed, *rule.name.encode()])
    searcher, applier = Searcher([rule]), Applier()
    done, max_err, last = 0, 0.0, "no instance drawn"
    for _ in range(attempts):
        if done >= trials:
            break
        present = {v: (done + i) % 2 == 0 for i, v in enumerate(sorted(rule.optional))}
        try:
            inst = instantiate(rule, rng, present=present)
            ref = execute(inst.graph, inst.feeds)
        except InstanceError as e:
            last = f"could not instantiate: {e}"
            continue
        except XrlError as e:
            last = f"source instance does not run: {e}"
            continue
        if not all(np.all(np.isfinite(a)) for a in ref):
            last = "source instance produced non-finite values"
            continue
        cands, rejected = _rewrites(searcher, applier, inst.graph)
        if not any(set(c.location) == inst.pattern for c in cands):
            if any(set(k) == set(inst.pattern) for k in rejected):
                # it matched, but its result does not type-check: a wrong rule (its shapes are off), not a
                # draw to retry, or a rule would pass on the draws where its mistake happens to cancel
                return _fail(rule, done, max_err, f"it matched its own instance but the rewrite does not type-check "
                                                  f"(it changes a shape?) on shapes {_shapes(inst)}", t0)
            last = "the rule did not match its own instance (conditions false for this draw?)"
            continue
        for cand in cands:
            try:
                new = cand.graph.validate()
                got = execute(new, inst.feeds)
            except XrlError as e:
                return _fail(rule, done, max_err, f"rewritten graph is invalid: {e}", t0)
            for name, a, b in zip(inst.graph.output_names, ref, got):
                if a.shape != b.shape:
                    return _fail(rule, done, max_err, f"output {name}: shape {a.shape} became {b.shape}", t0)
                err = float(np.max(np.abs(a - b), initial=0.0) / max(1.0, float(np.max(np.abs(a), initial=0.0))))
                max_err = max(max_err, err)
                if not err <= TOLERANCE:
                    return _fail(rule, done, max_err, f"output {name} differs by {err:.3g} (relative) at "
                                                      f"{cand.step} on shapes {_shapes(inst)}", t0)
        done += 1
    if done < trials:
        return _fail(rule, done, max_err, f"only {done} of {trials} trials instantiated; last: {last}", t0)
    return RuleCheck(rule.name, rule.family, True, max_err, done, "", time.perf_counter() - t0)


def _rewrites(searcher: Searcher, applier: Applier,
              graph: Graph) -> tuple[list[Candidate], list[frozenset[str]]]:
    """(the distinct rewrites of `graph`, the node sets of matches whose rewrite does not type-check).

    What `RewriteEngine.candidates` keeps with no growth limit, match cap or deadline: the first binding
    of each node set that builds, less no-ops, duplicates and rewrites that would close a cycle.
    """
    index = GraphIndex(graph)
    cands: list[Candidate] = []
    rejected: list[frozenset[str]] = []
    node_sets: set[frozenset[str]] = set()
    seen: set[tuple] = set()
    for rule, match in searcher.matches(index):
        key = frozenset(n.name for n in match.nodes)
        if key in node_sets:
            continue
        built = applier.apply(index, rule, match)
        if built is None:
            rejected.append(key)
            continue
        node_sets.add(key)
        if built.noop or built.delta_key in seen or creates_cycle(index, built.candidate):
            continue
        seen.add(built.delta_key)
        cands.append(built.candidate)
    return cands, rejected


def _fail(rule: Rule, done: int, max_err: float, detail: str, t0: float) -> RuleCheck:
    return RuleCheck(rule.name, rule.family, False, max_err, done, detail, time.perf_counter() - t0)


def _shapes(inst: object) -> str:
    g = inst.graph  # type: ignore[attr-defined]
    return ", ".join(f"{v}{list(g.types[v].shape)}" for v in (*g.inputs, *g.initializers))
