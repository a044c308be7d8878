"""`xrl bench`: the research benchmark (`xrl.search.suite`) run by one search or policy at a fixed budget, as one
CompilerGym-style leaderboard row: same graphs, same budget, same cost model, every result verified."""

from __future__ import annotations

import argparse
import math
import sys

from xrl.cli.commands import SearchNamesHelp, add_value_args, value_options
from xrl.cli.output import format_table, print_json

BENCH_POLICY = "research"  # --search rl without --policy: the shipped policy trained for this benchmark

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="the research benchmark: a search or policy on a split at a fixed budget, "
                                     "as a leaderboard row (share of each graph's reference gain, verified)")
    p.add_argument("--split", default="held-out", choices=("train", "validation", "held-out", "all"),
                   help="which graphs (default held-out; split by family)")
    p.add_argument("--graphs", metavar="NAMES", help="comma-separated suite graphs (default: the split's)")
    p.add_argument("--search", help=SearchNamesHelp("the method: {names} (default greedy; rl with --policy)",
                                                    skip=("none",)))
    p.add_argument("--policy", metavar="PATH", help="policy checkpoint (or exported .onnx, or a shipped name) for "
                                                    f"--search rl (implies it; default {BENCH_POLICY})")
    p.add_argument("--budget", type=float, default=10.0, metavar="S", help="seconds per graph and seed (default 10)")
    p.add_argument("--calls", type=int, metavar="N", help="also stop each run after N cost-model calls (the search "
                                                          "option max_cost_calls; the seconds still bound it)")
    add_value_args(p)
    p.add_argument("--seeds", default="1", metavar="N|S1,S2,...",
                   help="a count N (seeds 0..N-1; default 1: seed 0) or a comma-separated list of seeds (3,7)")
    p.add_argument("--list", action="store_true", help="list the suite's graphs and references; run nothing")
    p.add_argument("--json", action="store_true", help="print the rows and the leaderboard row as JSON")
    p.set_defaults(func=cmd_bench)


def parse_seeds(text: str) -> list[int]:
    from xrl.errors import ConfigError

    try:
        items = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds takes integers (0,1,2) or a count, not {text!r}") from None
    if len(items) == 1 and "," not in text:
        if items[0] < 1:
            raise ConfigError(f"--seeds: a count must be at least 1, not {items[0]}")
        return list(range(items[0]))
    if not items:
        raise ConfigError("--seeds: no seed given")
    return items


def cmd_bench(args: argparse.Namespace) -> int:
    from xrl.errors import ConfigError
    from xrl.search import suite

    names = [n.strip() for n in args.graphs.split(",") if n.strip()] if args.graphs else None
    split = None if args.split == "all" else args.split
    if args.list:
        return _list(suite, split, names, args.json)
    if not args.budget > 0:
        raise ConfigError(f"--budget must be positive, not {args.budget}")
    method = args.search or ("rl" if args.policy else "greedy")
    if args.policy and method != "rl":
        raise ConfigError("--policy applies to --search rl")
    from xrl.search.compare import resolve_methods

    resolve_methods(method)  # an unknown method is one line before any graph is built
    seeds = parse_seeds(args.seeds)
    entries = suite.suite_graphs(split, names)
    suite.load_references()  # a missing reference file is one line too
    if args.calls is not None and args.calls < 1:
        raise ConfigError(f"--calls must be at least 1, not {args.calls}")
    # the benchmark's own default policy: research.pt, trained in its setting (elementary rules, paper cost) and
    # the best on its held-out split (docs/results.md, "Does learning help on the research benchmark?")
    policy = args.policy or (BENCH_POLICY if method == "rl" else None)
    options: dict = {"policy": policy} if policy else {}
    if args.calls is not None:
        options["max_cost_calls"] = args.calls
    if value_options(args):
        if not method.startswith("rl"):
            raise ConfigError("--value-weight and --value-stop apply to --search rl (and its prior variants)")
        options.update(value_options(args))
    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=len(entries) * len(seeds), desc=f"bench {method}", unit="run", file=sys.stderr)

    def progress(row: suite.BenchRow, done: int, total: int) -> None:
        line = (f"{row.graph} seed {row.seed}: " + (row.error if row.error else
                f"{row.speedup:.3f}x, {row.share:.0%} of the reference gain in {row.time_s:.1f} s, "
                f"{'verified' if row.verified else 'NOT verified'}"))
        if bar is not None:
            bar.set_postfix_str(line[:60])
            bar.update(1)
        else:
            print(f"[{done}/{total}] {line}", file=sys.stderr, flush=True)

    try:
        rows = suite.run_bench(method, split=split, names=names, time_limit=args.budget, seeds=seeds,
                               options=options, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    board = suite.leaderboard(rows, method=method, split=split, time_limit=args.budget, policy=policy,
                              max_calls=args.calls)
    if args.json:
        from dataclasses import asdict

        print_json({"leaderboard": board, "rows": [asdict(r) for r in rows]})
        return 0
    print(format_table(["graph", "family", "seed", "speed-up", "share of ref. gain", "ref. gain", "time s",
                        "cost calls", "rewrites", "verified"],
                       [[r.graph, r.family, r.seed, _num(r.speedup, "{:.3f}x"), _num(r.share, "{:.0%}"),
                         _num(r.reference_gain, "{:.3f}x"), f"{r.time_s:.1f}", r.cost_calls, r.rewrites,
                         r.error or ("yes" if r.verified else "NO") + (" (stale reference)" if r.stale else "")]
                        for r in rows]))
    print()
    print(format_table(["method", "policy", "split", "graphs x seeds", "budget", "cost", "verified", "mean share",
                        "at >= 90%", "geomean speed-up", "reference geomean"],
                       [[board["method"], board["policy"] or "-", board["split"],
                         f"{board['graphs']} x {board['seeds']}",
                         f"{board['budget_s']:g} s" + (f", {args.calls} calls" if args.calls else ""), board["cost"],
                         board["verified"], _num(board["mean_share"], "{:.1%}"), _num(board["at_90pct"], "{:.0%}"),
                         _num(board["geomean_speedup"], "{:.3f}x"), _num(board["reference_geomean"], "{:.3f}x")]]))
    if board["stale_references"]:
        print(f"xrl: warning: {board['stale_references']} run(s) on graphs whose reference no longer matches the "
              "graph; recompute with experiments/research_suite_refs.py", file=sys.stderr)
    return 0


def _num(v: float, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def _list(suite, split: str | None, names: list[str] | None, as_json: bool) -> int:  # noqa: ANN001 - the module
    try:
        refs = suite.load_references()
    except Exception:  # noqa: BLE001 - listing works without the data file
        refs = {}
    rows = []
    for e in suite.suite_graphs(split, names):
        r = refs.get(e.name)
        rows.append({"name": e.name, "family": e.family, "split": e.split, "source": e.source,
                     "ops": r.ops if r else None, "reference_gain": r.gain if r else None,
                     "greedy_share": r.greedy_share if r else None,
                     "needs_foresight": r.needs_foresight if r else None, "method": r.method if r else None})
    if as_json:
        print_json(rows)
        return 0
    print(format_table(["graph", "family", "split", "ops", "reference gain", "greedy's share", "needs foresight",
                        "found by"],
                       [[x["name"], x["family"], x["split"], x["ops"] if x["ops"] is not None else "-",
                         _num(x["reference_gain"], "{:.3f}x") if x["reference_gain"] else "-",
                         _num(x["greedy_share"], "{:.0%}") if x["greedy_share"] is not None else "-",
                         {True: "yes", False: "no", None: "-"}[x["needs_foresight"]], x["method"] or "-"]
                        for x in rows]))
    return 0
