"""The comparison tables of docs/results.md: every search method on the whole built-in suite, for one target.

`--target paper` (default) is the research setting of TASO/Tensat/X-RLflow (an H100 kernel per op,
the unfused graph as baseline); `--target ort-cpu` is what onnxruntime on a CPU runs (its own fusions
applied before costing, the written file costed).

Each method runs on each graph through the same dispatch as `xrl optimize --search M`; every number
is recomputed from the returned graph, and every graph is checked against the original under
onnxruntime (see `xrl.search.compare`). Per-method time limits are chosen so that the whole suite
(11 graphs x 5 methods) runs in under 30 minutes on a 2-core CPU machine:

    taso    60 s   (budget 1000 expansions, alpha 1.05: the time limit binds on the larger graphs)
    tensat  40 s   (half saturation, half ILP extraction; 10,000 e-nodes, 8 iterations, k_multi 1)
    greedy  60 s   (to convergence; it converges in seconds on every graph)
    random  30 steps, seed 0 (one random walk; its time is the rewrites' enumeration)
    rl      60 s   (the shipped policy, when `--search rl` is available)

    .venv/bin/python experiments/compare_suite.py [--target paper|ort-cpu|ort-cuda] [--device h100] [--graphs all]
                                                  [--methods rl,taso,...]
                                                  [--out results/compare_suite] [--seed 0]

Prints the Markdown table and writes results.csv, results.md and the two plots to --out.
"""

from __future__ import annotations

import argparse
import sys
import time

from xrl.search.compare import (
    CompareConfig,
    markdown_table,
    resolve_graphs,
    resolve_methods,
    run_compare,
    write_results,
)

TIME_LIMITS = {"taso": 60.0, "tensat": 40.0, "greedy": 60.0, "rl": 60.0}
STEPS = {"random": 30}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="paper", help="paper (default), ort-cpu or ort-cuda")
    p.add_argument("--device", default=None, help="device profile of the estimate (default: the target's)")
    p.add_argument("--graphs", default="all", help="graph names or a suite: xrlflow, taso, small, all (default all)")
    p.add_argument("--methods", default="rl,taso,tensat,greedy,random")
    p.add_argument("--out", default="results/compare_suite", help="output folder (default results/compare_suite)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    config = CompareConfig(graphs=resolve_graphs(args.graphs), methods=resolve_methods(args.methods),
                           device=args.device, target=args.target, seed=args.seed, method_time_limits=TIME_LIMITS,
                           steps=STEPS)
    t0 = time.perf_counter()

    def progress(rec, done: int, total: int) -> None:
        what = f"{rec.speedup:.3f}x in {rec.time_s:.1f} s" if rec.status in ("ok", "wrong output") else rec.error
        print(f"[{done}/{total}] {rec.graph} / {rec.method}: {rec.status}: {what}", file=sys.stderr, flush=True)

    records = run_compare(config, progress=progress)
    elapsed = time.perf_counter() - t0
    header = (f"Target `{args.target}`, device profile `{args.device or 'the target profile'}`; seed {args.seed}; "
              "time limits per run: "
              + ", ".join(f"{m} {s:g} s" for m, s in TIME_LIMITS.items()) + f", random {STEPS['random']} steps. "
              f"Whole run: {elapsed / 60:.1f} min. Regenerate with `.venv/bin/python experiments/compare_suite.py"
              f" --target {args.target}{' --device ' + args.device if args.device else ''}`.")
    write_results(records, args.out, title="Search methods on the built-in suite", header=header)
    print(markdown_table(records, title="Search methods on the built-in suite", header=header))
    print(f"wrote {args.out}/results.csv, results.md, speedup.png, speedup_vs_time.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
