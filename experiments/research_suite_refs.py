"""The research benchmark's reference optima (issue 32, item 2): recompute graphs/research_suite.json and print
the benchmark table.

Per graph of the suite (`xrl.search.suite`: paper's analytic cost, the elementary rules): greedy search; the
exhaustive search (every reachable graph, each once) up to --max-states graphs; where that does not complete,
beam search (width 16, up to --beam-states graphs), TASO's backtracking search (up to --taso-expansions graphs
expanded) and the composite-guided greedy (the default optimisation's greedy over all rules, each composite
step replaced by its elementary route); every search also stops at --budget seconds, a backstop.
The best is polished by greedy, its sequence minimised (non-improving steps the rest does not need are dropped)
and analysed: the steps that raise the cost, leave it unchanged, or are not the best single step at their
state. Greedy's share is (c0 - greedy) / (c0 - reference) in cost.

    .venv/bin/python experiments/research_suite_refs.py                  # every split; writes the JSON
    .venv/bin/python experiments/research_suite_refs.py --split held-out --no-write
    .venv/bin/python experiments/research_suite_refs.py --table                  # the stored references' table

Prints the markdown table (docs/results.md's "Research benchmark" section) and the held-out summary.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def reference_for(entry, cost, eng, *, budget: float, max_states: int, beam_states: int,  # noqa: ANN001, ANN201
                  taso_expansions: int):
    from xrl.search import suite
    from xrl.search.beam import beam_search, exhaustive_search
    from xrl.search.greedy import greedy_search
    from xrl.search.taso import taso_search

    graph = entry.build()
    c0 = cost.cost(graph)
    greedy = greedy_search(graph, cost, eng, time_limit=120)
    found: dict[str, tuple[float, list[str]]] = {"greedy": (greedy.cost, list(greedy.steps))}
    # Budgets in states and expansions, so that a rerun finds the same (the time limit is a backstop on a loaded
    # machine, which then cuts a search short: the table says how each reference was found)
    ex = exhaustive_search(graph, cost, eng, max_states=max_states, time_limit=budget)
    exhaustive = bool(ex.details.get("exhausted"))
    found["exhaustive" if exhaustive else "exhaustive (partial)"] = (ex.cost, list(ex.steps))
    if not exhaustive:
        b = beam_search(graph, cost, eng, width=16, alpha=1.1, max_states=beam_states, time_limit=budget)
        found["beam16"] = (b.cost, list(b.steps))
        t = taso_search(graph, cost, eng, alpha=1.05, budget=taso_expansions, time_limit=budget)
        found["taso"] = (t.cost, list(t.steps))
        g, steps = suite.composite_guided(graph, cost, eng, time_limit=budget)
        found["composite"] = (cost.cost(g), steps)
    method = min(found, key=lambda m: (found[m][0], len(found[m][1])))
    best_cost, steps = found[method]
    if not exhaustive:  # polish: greedy from the best graph found
        best = suite.replay(graph, steps, eng)
        more = greedy_search(best, cost, eng, time_limit=60)
        if more.steps and more.cost < best_cost * (1 - 1e-9):
            steps, best_cost, method = steps + list(more.steps), more.cost, f"{method}+greedy"
    steps = suite.minimise(graph, steps, cost, eng)
    final = suite.replay(graph, steps, eng)
    err = suite.verify(graph, final)
    if err > suite.VERIFY_TOLERANCE:
        raise AssertionError(f"{entry.name}: the reference graph's outputs differ from the original's ({err:.3g})")
    kinds = suite.analyse(graph, steps, cost, eng)
    return suite.Reference(
        name=entry.name, family=entry.family, split=entry.split, ops=len(graph), hash=graph.canonical_hash,
        original_cost=c0, cost=cost.cost(final), method=method, exhaustive=exhaustive, steps=steps,
        greedy_cost=greedy.cost, greedy_steps=len(greedy.steps), candidates={m: v[0] for m, v in found.items()},
        **kinds)


def table(refs) -> str:  # noqa: ANN001
    lines = ["| graph | split | family | ops | reference gain | found by | greedy's share | raising / neutral / "
             "non-greedy steps | needs foresight |", "|---|---|---|---:|---:|---|---:|---|---|"]
    for r in refs:
        lines.append(f"| {r.name} | {r.split} | {r.family} | {r.ops} | {r.gain:.3f}x | {r.method}"
                     f"{' (optimum)' if r.exhaustive else ''} | {r.greedy_share:.0%} | {r.raising} / {r.neutral} / "
                     f"{r.non_greedy} | {'yes' if r.needs_foresight else 'no'} |")
    return "\n".join(lines)


def summary(refs) -> str:  # noqa: ANN001
    out = []
    for split in ("train", "validation", "held-out"):
        rs = [r for r in refs if r.split == split]
        if not rs:
            continue
        need = [r for r in rs if r.needs_foresight]
        shares = [r.greedy_share for r in need]
        out.append(f"{split}: {len(need)}/{len(rs)} graphs ({len(need) / len(rs):.0%}) need a cost-raising, neutral "
                   f"or ordering step; greedy's share of the reference gain on them: mean "
                   f"{(sum(shares) / len(shares)) if shares else math.nan:.0%}, max "
                   f"{max(shares) if shares else math.nan:.0%}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--split", default="all", help="train | validation | held-out | all (default)")
    p.add_argument("--graphs", help="comma-separated suite graph names (default: the split's)")
    p.add_argument("--budget", type=float, default=120.0,
                   help="backstop: seconds for each search of each graph (default 120)")
    p.add_argument("--max-states", type=int, default=3000, help="exhaustive search's cap (default 3000 graphs)")
    p.add_argument("--beam-states", type=int, default=8000, help="beam search's cap (default 8000 graphs)")
    p.add_argument("--taso-expansions", type=int, default=600, help="TASO's cap (default 600 graphs expanded)")
    p.add_argument("--no-write", action="store_true", help="print only; leave graphs/research_suite.json as it is")
    p.add_argument("--table", action="store_true", help="print the table of the stored references; compute nothing")
    args = p.parse_args(argv)

    from xrl.rewrite.rules import use_rules
    from xrl.search import suite

    if args.table:
        stored = suite.load_references()
        refs = [stored[e.name] for e in suite.suite_graphs(args.split) if e.name in stored]
        print(table(refs))
        print()
        print(summary(refs))
        return 0

    entries = suite.suite_graphs(args.split, args.graphs.split(",") if args.graphs else None)
    cost, eng = suite.cost_model(), suite.engine()
    try:
        old = suite.load_references()
    except Exception:  # noqa: BLE001 - no file yet, or another setting: start afresh
        old = {}
    refs = []
    t0 = time.perf_counter()
    with use_rules(suite.RULES):
        for i, e in enumerate(entries, 1):
            t = time.perf_counter()
            r = reference_for(e, cost, eng, budget=args.budget, max_states=args.max_states,
                              beam_states=args.beam_states, taso_expansions=args.taso_expansions)
            refs.append(r)
            print(f"[{i}/{len(entries)}] {e.name}: {r.gain:.3f}x by {r.method}, greedy's share {r.greedy_share:.0%}, "
                  f"{len(r.steps)} steps ({r.raising} raising, {r.neutral} neutral, {r.non_greedy} non-greedy) in "
                  f"{time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
            if not args.no_write:  # after every graph: an interrupted run keeps what it made
                try:  # what another run (another split) wrote meanwhile is kept
                    old = suite.load_references()
                except Exception:  # noqa: BLE001
                    pass
                merged = {**old, **{x.name: x for x in refs}}
                order = [x.name for x in suite.suite_graphs(None)]
                suite.write_references([merged[n] for n in order if n in merged], budget_s=args.budget,
                                       max_states=args.max_states, beam_states=args.beam_states,
                                       taso_expansions=args.taso_expansions)
    print(table(refs))
    print()
    print(summary(refs))
    print(f"\n{len(refs)} graphs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
