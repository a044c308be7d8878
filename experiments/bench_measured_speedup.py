"""Does greedy search make the suite faster on this machine? Estimated against measured speed-ups.

For each graph and each cost model that guides the search (the analytic roofline, the per-op
measured `op` model, and, on graphs with few enough weights, whole-graph timing `e2e`, screened as
`xrl optimize --cost e2e` screens it: the device's analytic model picks the candidates timed), greedy
search rewrites the graph; the result is verified against the original under onnxruntime, and then
the original and the rewritten graph are timed end to end with onnxruntime and with the PyTorch
executor in alternating rounds (`xrl.cost.speedup.measure_speedup`). The table gives the speed-up
the search believed, the measured speed-up with its 95% interval over the rounds, and the verdict.

    .venv/bin/python experiments/bench_measured_speedup.py [--graphs mlp,tiny_cnn] [--device cpu|cuda]
        [--search-costs analytic,op,e2e] [--e2e-max-params 10] [--screen-top 8] [--rounds 5] [--repeats 10]
        [--out experiments/results/measured_speedup_cpu.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

from bench_measured import markdown

from xrl import graphs
from xrl.api import measure_model
from xrl.cli.output import format_table
from xrl.cost import get_cost_model
from xrl.cost.speedup import measure_speedup
from xrl.errors import ConfigError
from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.frontends.verify import compare_models
from xrl.rewrite import RewriteEngine
from xrl.search.greedy import greedy_search
from xrl.search.registry import measured_screen
from xrl.stats import geomean

DEFAULT_GRAPHS = "mlp,tiny_cnn,squeezenet,resnet50,bert,inception_v3"
SEARCH_COSTS = ("analytic", "op", "e2e")


def search_cost_model(name: str, args: argparse.Namespace, cache: Path):
    if name == "analytic":
        return get_cost_model("analytic", device=args.profile)
    common = {"device": args.device, "warmup": args.warmup, "repeats": args.repeats}
    if name == "op":
        return get_cost_model("op", cache_path=cache, **common)
    return get_cost_model("e2e", **common)


def timers(args: argparse.Namespace) -> dict[str, object]:
    """The end-to-end timers, by engine; an engine that cannot run on the device is left out."""
    out = {}
    for engine in ("ort", "torch"):
        try:
            out[engine] = measure_model(engine, args.device, repeats=args.repeats, warmup=args.warmup)
        except ConfigError as e:
            print(f"  measuring with {engine}: skipped ({e})")
    return out


def cell(m) -> str:
    lo, hi = m.interval
    return f"{m.speedup:.3f} [{lo:.2f}-{hi:.2f}] {m.verdict}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default=DEFAULT_GRAPHS,
                    help=f"comma-separated graphs, or 'all' (default {DEFAULT_GRAPHS})")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the measured models run")
    ap.add_argument("--profile", help="analytic device profile (default: cpu on the CPU, h100 on a GPU)")
    ap.add_argument("--search-costs", default=",".join(SEARCH_COSTS), help="cost models that guide greedy search")
    ap.add_argument("--e2e-max-params", type=float, default=10,
                    help="search under e2e only on graphs of at most this many million parameters (every "
                         "candidate timed is exported and loaded)")
    ap.add_argument("--screen-top", type=int, default=8,
                    help="under e2e, candidates timed per step (the analytic model's best; 0: all)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating measurement rounds")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10, help="timed runs per round")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args()
    args.profile = args.profile or ("cpu" if args.device == "cpu" else "h100")
    names = graphs.names() if args.graphs == "all" else [n for n in args.graphs.split(",") if n]
    costs = [c for c in args.search_costs.split(",") if c]
    unknown = sorted(set(costs) - set(SEARCH_COSTS))
    if unknown:
        ap.error(f"unknown search cost {', '.join(unknown)}; choose from {', '.join(SEARCH_COSTS)}")

    import torch

    where = torch.cuda.get_device_name() if args.device == "cuda" else (platform.processor() or "cpu")
    header = (f"device {args.device} ({where}), torch {torch.__version__}, 1 thread, {args.rounds} alternating "
              f"rounds of {args.warmup} warm-up + {args.repeats} timed runs, load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start")
    print(header)
    engines = timers(args)
    rewriter = RewriteEngine.default()
    rows, t_all = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="xrl-speedup-") as tmp:
        for name in names:
            g = from_onnx(graphs.build(name), name=name)
            reference = to_onnx(g)
            for cost_name in costs:
                if cost_name == "e2e" and g.num_parameters > args.e2e_max_params * 1e6:
                    continue
                model = search_cost_model(cost_name, args, Path(tmp) / "ops.sqlite")
                t0 = time.perf_counter()
                screen = measured_screen(model) if cost_name == "e2e" and args.screen_top > 0 else None
                res = greedy_search(g, model, rewriter, screen=screen, screen_top=max(args.screen_top, 1))
                search_s = time.perf_counter() - t0
                check = compare_models(reference, to_onnx(res.graph), seed=0, trials=2)
                if not check.ok:
                    raise SystemExit(f"{name} under {cost_name}: the rewritten graph is wrong ({check.detail})")
                measured = {e: measure_speedup(m, g, res.graph, rounds=args.rounds) for e, m in engines.items()}
                rows.append([name, len(g), cost_name, res.speedup, len(res.steps), search_s]
                            + [cell(measured[e]) if e in measured else "-" for e in ("ort", "torch")])
                print(f"  {name} / {cost_name}: estimated {res.speedup:.3f}x in {search_s:.1f} s; "
                      + ", ".join(f"{e} {cell(m)}" for e, m in measured.items()), flush=True)
    total = time.perf_counter() - t_all
    headers = ["graph", "ops", "search cost", "estimated", "rewrites", "search s", "measured ort", "measured torch"]
    print()
    print(format_table(headers, rows))
    summary = summarize(rows, engines)
    print(summary)
    print(f"total {total:.0f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"{header}; total {total:.0f} s\n\nMeasured cells: speed-up [95% interval over the "
                            f"rounds] verdict.\n\n{markdown(headers, rows)}\n{summary}\n")
        print(f"wrote {args.out}")


def summarize(rows: list[list], engines: dict) -> str:
    """Per search cost and engine: the geometric mean of the measured speed-ups and the verdict counts."""
    lines = []
    for cost_name in dict.fromkeys(r[2] for r in rows):
        sel = [r for r in rows if r[2] == cost_name]
        parts = []
        for col, engine in ((6, "ort"), (7, "torch")):
            if engine not in engines:
                continue
            vals = [float(r[col].split()[0]) for r in sel]
            verdicts = [r[col].split("] ")[1] for r in sel]
            geo = geomean(vals)
            parts.append(f"{engine} geomean {geo:.3f} ({verdicts.count('faster')} faster, "
                         f"{verdicts.count('slower')} slower, {verdicts.count('within noise')} within noise)")
        est = geomean(r[3] for r in sel)
        lines.append(f"- greedy under {cost_name} ({len(sel)} graphs): estimated geomean {est:.3f}; "
                     + "; ".join(parts))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
