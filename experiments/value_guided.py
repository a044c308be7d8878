"""Issue 32.3: the guided search with and without the value head, on a split of the research benchmark.

`xrl bench --search rl` (greedy anchor, stop rule, the research policy) under several settings of the guided search's
value options (xrl.rl.guided: value_weight, value_stop), run interleaved: for each graph and seed every arm runs
once, in turn, so the loaded machine's slow minutes fall on every arm alike. One arm appears twice (an A/A control:
what the machine's noise alone moves). Per arm: the geomean (floored at 1%) and mean share of the reference gain,
mean seconds and cost calls, graphs at >= 90% of the reference gain. The torch import is made before the first run
(it would otherwise fall on the first arm's first graph).

    .venv/bin/python experiments/value_guided.py --split validation --budget 5 \
        --arms "w0:value_weight=0" "w1:value_weight=1" "w1-AA:value_weight=1" "w3:value_weight=3" \
               "w1-s1:value_weight=1,value_stop=1" "w1-s3:value_weight=1,value_stop=3"
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from xrl.search import suite
from xrl.stats import geomean


def parse_arm(text: str) -> tuple[str, dict[str, int | float | str]]:
    name, _, spec = text.partition(":")
    opts: dict[str, int | float | str] = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        for kind in (int, float, str):
            try:
                opts[key.strip()] = kind(value)
                break
            except ValueError:
                continue
    return name, opts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="validation")
    ap.add_argument("--graphs", default=None, help="comma-separated (default: the split's)")
    ap.add_argument("--budget", type=float, default=5.0)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--policy", default="research")
    ap.add_argument("--arms", nargs="+", required=True, help="name:key=value,key=value (search rl options)")
    ap.add_argument("--out", default=None, help="write the rows and the table as JSON here")
    args = ap.parse_args(argv)
    arms = [parse_arm(a) for a in args.arms]
    seeds = [int(s) for s in args.seeds.split(",")]
    names = [e.name for e in suite.suite_graphs(args.split, args.graphs.split(",") if args.graphs else None)]
    import xrl.rl.guided  # noqa: F401 - torch's import before the clock of any arm

    rows: dict[str, list] = {a: [] for a, _ in arms}
    t_start = time.perf_counter()
    for name in names:
        for seed in seeds:
            for arm, opts in arms:
                (row,) = suite.run_bench("rl", split=None, names=[name], time_limit=args.budget, seeds=[seed],
                                         options={"policy": args.policy, **opts})
                rows[arm].append(row)
                print(f"{name} seed {seed} {arm}: share {row.share:.3f} speed-up {row.speedup:.3f}x "
                      f"{row.time_s:.1f} s {row.cost_calls} calls {row.error}", file=sys.stderr, flush=True)
    table = []
    for arm, opts in arms:
        ok = [r for r in rows[arm] if r.verified and not r.error and not math.isnan(r.share)]
        table.append({"arm": arm, "options": opts, "runs": len(rows[arm]), "verified": len(ok),
                      "geomean_share": geomean([max(r.share, 0.01) for r in ok]) if ok else math.nan,
                      "mean_share": sum(r.share for r in ok) / len(ok) if ok else math.nan,
                      "at_90": sum(r.share >= 0.9 for r in ok),
                      "mean_time_s": sum(r.time_s for r in rows[arm]) / len(rows[arm]),
                      "mean_calls": sum(r.cost_calls for r in rows[arm]) / len(rows[arm])})
    print(f"{args.split}, {len(names)} graphs x {len(seeds)} seeds, budget {args.budget} s, policy {args.policy}, "
          f"{time.perf_counter() - t_start:.0f} s")
    print("| arm | options | geomean share | mean share | >= 90% | mean s | mean calls |")
    print("|---|---|---|---|---|---|---|")
    for t in table:
        print(f"| {t['arm']} | {t['options']} | {t['geomean_share']:.3f} | {t['mean_share']:.3f} | "
              f"{t['at_90']}/{t['verified']} | {t['mean_time_s']:.1f} | {t['mean_calls']:.0f} |")
    if args.out:
        from dataclasses import asdict

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "table": table,
                                              "rows": {a: [asdict(r) for r in rs] for a, rs in rows.items()}},
                                             indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
