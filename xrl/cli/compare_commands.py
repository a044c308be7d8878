"""`xrl compare`: every search method on every graph, with results.csv, results.md and plots."""

from __future__ import annotations

import argparse
import sys

from xrl.cli.commands import SearchNamesHelp
from xrl.cli.output import format_table, print_json
from xrl.search.compare import SUITES

DEFAULT_METHODS = "rl,taso,tensat,greedy,random"  # beam and exhaustive on request: exhaustive runs to its cap


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="run search methods on built-in graphs and tabulate verified speedups")
    p.add_argument("--graphs", default="small", metavar="NAMES|SUITE",
                   help=f"comma-separated built-in graph names, or a suite: {', '.join(SUITES)} (default small)")
    p.add_argument("--methods", default=DEFAULT_METHODS, metavar="M1,M2,...", help=SearchNamesHelp(
        f"comma-separated registered searches: {{names}} (default {DEFAULT_METHODS})", skip=("none",)))
    from xrl.cost.targets import TARGETS

    p.add_argument("--target", default="paper", choices=(*TARGETS, "auto"),
                   help="what the graphs are optimised for (default paper: the research setting of TASO/Tensat/"
                        "X-RLflow, an H100 kernel per op; ort-cpu/ort-cuda: what onnxruntime runs, after its fusions)")
    p.add_argument("--cost", default="target", choices=("target", "analytic", "ort"),
                   help="cost backend (default target: the target's estimate)")
    p.add_argument("--device", default=None, help="device profile of the estimate (default: the target's)")
    p.add_argument("--time-limit", type=float, metavar="S", help="seconds each method may search on each graph")
    p.add_argument("--out", default="compare-results", metavar="DIR",
                   help="where results.csv, results.md and the plots go (default ./compare-results)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rules", default="all", metavar="SET",
                   help="rule set every method searches with: all (default), elementary, composite, a rule file's "
                        "stem (lora, reparam, ...), or several joined with + (elementary+lora)")
    p.add_argument("--policy", metavar="PATH",
                   help="policy checkpoint (or exported .onnx policy, or a shipped name) for the rl method")
    p.add_argument("--json", action="store_true", help="print the records as JSON instead of a table")
    p.set_defaults(func=cmd_compare)


def check_out_dir(out: str) -> None:
    """OutputPathError unless `out` is a folder, or can be made one: nothing on its way is a file, and the
    nearest folder that exists is writable."""
    import os
    from pathlib import Path

    from xrl.errors import OutputPathError

    path = Path(out)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"--out {out} is a file, not a folder; give a folder for results.csv, results.md "
                              "and the plots")
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                raise OutputPathError(f"--out {out}: {parent} is a file, so no folder can be made under it")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise OutputPathError(f"--out {out}: the folder {parent} is not writable")
            return


def cmd_compare(args: argparse.Namespace) -> int:
    from xrl.errors import XrlError
    from xrl.search.compare import (
        TABLE_HEADERS,
        CompareConfig,
        resolve_graphs,
        resolve_methods,
        run_compare,
        table_rows,
        write_results,
    )

    if args.time_limit is not None and not args.time_limit > 0:
        raise XrlError(f"--time-limit must be positive, not {args.time_limit}")
    check_out_dir(args.out)  # before the work, not after it
    from xrl.rewrite.rules import check_rule_set

    methods = resolve_methods(args.methods)
    if args.policy and "rl" not in methods:
        raise XrlError("--policy applies to the rl method; add rl to --methods")
    config = CompareConfig(graphs=resolve_graphs(args.graphs), methods=methods, cost=args.cost,
                           device=args.device, target=args.target, seed=args.seed, time_limit=args.time_limit,
                           rules=check_rule_set(args.rules),
                           method_options={"rl": {"policy": args.policy}} if args.policy else None)

    def progress(rec, done: int, total: int) -> None:
        detail = (f"{rec.speedup:.3f}x in {rec.time_s:.2f} s, {rec.rewrites} rewrites, "
                  f"{'verified' if rec.verified else 'NOT verified'}") if rec.status in ("ok", "wrong output") \
            else rec.error
        print(f"[{done}/{total}] {rec.graph} / {rec.method}: {rec.status}: {detail}", file=sys.stderr, flush=True)

    records = run_compare(config, progress=progress)
    header = (f"Target: {args.target}; cost model: {args.cost} ({args.device or 'the target profile'}); "
              f"seed {args.seed}; time limit per run: "
              f"{args.time_limit if args.time_limit is not None else 'method default'}; rules: {config.rules}"
              f"{'; policy: ' + args.policy if args.policy else ''}.")
    paths = write_results(records, args.out, header=header)
    if args.json:
        from dataclasses import asdict

        print_json({"records": [asdict(r) for r in records], "files": {k: str(v) for k, v in paths.items()}})
        return 0
    print(format_table(TABLE_HEADERS, table_rows(records)))
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0
