"""Foundation benchmark: for every built-in graph, ops, build/import/featurize time, analytic and ort cost.

    .venv/bin/python experiments/bench_foundation.py [--graphs bert,vit] [--device h100] [--repeats 10]
                                                     [--out experiments/results/foundation.md]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from xrl import graphs
from xrl.cli.output import format_table
from xrl.cost import get_cost_model
from xrl.features import featurize
from xrl.frontends.onnx_io import from_onnx


def timed(fn, *args, repeat: int = 1, **kwargs):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - t0)
    return out, best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", help="comma-separated names (default: every built-in graph)")
    ap.add_argument("--device", default="h100", help="analytic device profile")
    ap.add_argument("--repeats", type=int, default=10, help="timed onnxruntime runs per graph")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args()
    names = args.graphs.split(",") if args.graphs else graphs.names()
    analytic = get_cost_model("analytic", device=args.device)
    ort = get_cost_model("ort", device="cpu", repeats=args.repeats)
    rows = []
    for name in names:
        model, t_build = timed(graphs.build, name)
        graph, t_import = timed(from_onnx, model, name=name)
        data, t_feat = timed(featurize, graph, repeat=3)
        a_cost, _ = timed(analytic.cost, graph)
        m = ort.measure(graph)
        rows.append([name, len(graph), graph.num_parameters / 1e6, t_build * 1e3, t_import * 1e3, t_feat * 1e3,
                     a_cost * 1e3, m.median_s * 1e3, m.cv * 100])
        print(f"  {name}: done", flush=True)
    headers = ["graph", "ops", "params (M)", "build ms", "import ms", "featurize ms",
               f"analytic {args.device} ms", "ort cpu ms", "ort CV %"]
    table = format_table(headers, rows)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        md = "| " + " | ".join(headers) + " |\n|" + "---|" * len(headers) + "\n"
        md += "".join("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r) + " |\n"
                      for r in rows)
        args.out.write_text(md)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
