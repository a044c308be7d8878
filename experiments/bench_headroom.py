"""Is the headroom real? Greedy's result against the best search's, timed under onnxruntime.

For each graph (default: the headroom suite), greedy, beam, TASO, Tensat and (on small graphs)
exhaustive search run under the default target's estimate (ort-cpu; the generic cpu profile where
XRL_NO_CALIBRATION=1). Greedy's graph and the best method's graph are exported to ONNX, checked against
the original under onnxruntime, and timed with it: onnxruntime, ORT_ENABLE_ALL, one thread, four models
in alternating rounds (the original, the original again as an A/A control, greedy's, the best), the
order rotated and every session made afresh each round (two sessions of one file can differ by several
percent for their lives). Each round gives the median of `--runs` calls per model; the speed-up of a
round is the ratio of those medians, and the table gives the median over rounds with the 95% t interval
of the per-round ratios (`xrl.cost.speedup.ratio_interval`). The clock is the CPU time of the calling
thread (with one intra-op thread onnxruntime computes on it), so other processes taking the core away
do not inflate it; the wall clock is in the CSV.

Verdict on the headroom (best / greedy): "real" when its interval lies above 1 and beyond the A/A
control's deviation, "reversed" when it lies below 1 likewise, else "within noise".

    XRL_NO_CALIBRATION=1 .venv/bin/python experiments/bench_headroom.py [--graphs headroom] [--rounds 10] [--runs 30]
        [--time-limit 20] [--out experiments/results/headroom_measured_cpu.md]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from xrl.cost import get_cost_model
from xrl.cost.speedup import ratio_interval
from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.frontends.verify import compare_models
from xrl.rewrite import RewriteEngine
from xrl.search.beam import beam_search, exhaustive_search
from xrl.search.compare import resolve_graphs
from xrl.search.greedy import greedy_search
from xrl.search.result import SearchResult
from xrl.search.taso import taso_search
from xrl.search.tensat import tensat_search

EXHAUSTIVE_MAX_OPS = 60  # as experiments/headroom.py
MODELS = ("original", "a/a", "greedy", "best")


def searches(graph, cost, time_limit: float) -> dict[str, SearchResult]:  # noqa: ANN001 - Graph, CostModel
    """Every method's result on `graph` (exhaustive only where the graph is small)."""
    out = {"greedy": greedy_search(graph, cost, RewriteEngine.default(), time_limit=time_limit),
           "beam": beam_search(graph, cost, RewriteEngine.default(), time_limit=time_limit),
           "taso": taso_search(graph, cost, RewriteEngine.default(), time_limit=time_limit),
           "tensat": tensat_search(graph, cost, time_limit=time_limit / 2, ilp_time_limit=time_limit / 2)}
    if len(graph) <= EXHAUSTIVE_MAX_OPS:
        out["exhaustive"] = exhaustive_search(graph, cost, RewriteEngine.default(), time_limit=time_limit,
                                              max_states=2000)
    return out


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def interleaved(models: dict[str, onnx.ModelProto], feeds: dict[str, np.ndarray], rounds: int, runs: int,
                warmup: int = 3) -> dict[str, dict[str, list[float]]]:
    """Per clock ("cpu": this thread's CPU time, "wall") and model, each round's median of `runs` calls (s)."""
    names = list(models)
    out: dict[str, dict[str, list[float]]] = {c: {n: [] for n in names} for c in ("cpu", "wall")}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        sessions = {n: session(models[n]) for n in order}
        for n in order:
            s = sessions[n]
            for _ in range(warmup):
                s.run(None, feeds)
            cpu, wall = [], []
            for _ in range(runs):
                t0, c0 = time.perf_counter(), time.thread_time()
                s.run(None, feeds)
                cpu.append(time.thread_time() - c0)
                wall.append(time.perf_counter() - t0)
            out["cpu"][n].append(statistics.median(cpu))
            out["wall"][n].append(statistics.median(wall))
    return out


def ratio(before: list[float], after: list[float]) -> tuple[float, float, float]:
    """Median over rounds of before/after (> 1: `after` is faster) and the 95% t interval of the rounds."""
    rs = [b / a for b, a in zip(before, after, strict=True)]
    lo, hi = ratio_interval(rs)
    return statistics.median(rs), lo, hi


def verdict(headroom: tuple[float, float, float], aa: tuple[float, float, float]) -> str:
    noise = max(abs(math.log(aa[1])), abs(math.log(aa[2])))  # how far identical work strayed from 1
    if headroom[1] > 1 and math.log(headroom[1]) > noise:
        return "real"
    if headroom[2] < 1 and -math.log(headroom[2]) > noise:
        return "reversed"
    return "within noise"


def bench(name: str, rounds: int, runs: int, time_limit: float) -> dict[str, object]:
    from xrl import graphs

    model = graphs.build(name)
    graph = from_onnx(model, name=name)
    cost = get_cost_model("target", device="auto", target="ort-cpu")
    results = searches(graph, cost, time_limit)
    # the written file is what is costed and timed (as xrl optimize and compare report it)
    files = {m: to_onnx(r.graph.validate()) for m, r in results.items()}
    est = {m: cost.cost(graph) / cost.cost(from_onnx(f, name=name)) for m, f in files.items()}
    best = max(est, key=lambda m: (est[m], m == "greedy"))  # a tie goes to greedy: no headroom is invented
    for m in ("greedy", best):
        check = compare_models(model, files[m], trials=1)
        if not check.ok:
            raise RuntimeError(f"{name}: {m}'s result differs from the original ({check.detail})")
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim], dtype=np.float32)
             for i in model.graph.input}
    t = interleaved({"original": model, "a/a": model, "greedy": files["greedy"], "best": files[best]}, feeds,
                    rounds, runs)
    cpu = t["cpu"]
    row = {"graph": name, "best_method": best, "est_greedy": est["greedy"], "est_best": est[best],
           "est_headroom": est[best] / est["greedy"], "original_us": statistics.median(cpu["original"]) * 1e6,
           "greedy": ratio(cpu["original"], cpu["greedy"]), "best": ratio(cpu["original"], cpu["best"]),
           "headroom": ratio(cpu["greedy"], cpu["best"]), "aa": ratio(cpu["original"], cpu["a/a"]),
           "wall_headroom": ratio(t["wall"]["greedy"], t["wall"]["best"]),
           "ops": {m: len(files[m].graph.node) for m in ("greedy", best)}, "original_ops": len(model.graph.node)}
    row["verdict"] = verdict(row["headroom"], row["aa"])
    return row


def _iv(r: tuple[float, float, float]) -> str:
    return f"{r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]"


def table(rows: list[dict[str, object]]) -> str:
    lines = ["| graph | original us | best method | estimated: greedy | best | headroom | measured: greedy | best | "
             "**headroom** | A/A | verdict |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['graph']} | {r['original_us']:.1f} | {r['best_method']} | {r['est_greedy']:.3f} | "
                     f"{r['est_best']:.3f} | {r['est_headroom']:.3f} | {_iv(r['greedy'])} | {_iv(r['best'])} | "
                     f"**{_iv(r['headroom'])}** | {_iv(r['aa'])} | {r['verdict']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", default="headroom", help="graph names or a suite (default: the headroom suite)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--runs", type=int, default=30, help="timed calls per model and round")
    p.add_argument("--time-limit", type=float, default=20.0, help="seconds per search")
    p.add_argument("--out", default="experiments/results/headroom_measured_cpu.md")
    args = p.parse_args(argv)
    if args.rounds < 2 or args.runs < 1:
        print("bench_headroom: --rounds must be at least 2 and --runs at least 1", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows = []
    for name in resolve_graphs(args.graphs):
        rows.append(bench(name, args.rounds, args.runs, args.time_limit))
        r = rows[-1]
        print(f"[{time.perf_counter() - t0:5.0f} s] {name}: estimated headroom {r['est_headroom']:.3f} "
              f"({r['best_method']}), measured {_iv(r['headroom'])}, A/A {_iv(r['aa'])}: {r['verdict']}",
              file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - t0
    text = (f"# Headroom above greedy, measured under onnxruntime (CPU, one thread)\n\n"
            f"Searches under the ort-cpu estimate (generic cpu profile where XRL_NO_CALIBRATION=1), "
            f"{args.time_limit:g} s each; onnxruntime {ort.__version__}, ORT_ENABLE_ALL, 1 thread; "
            f"{args.rounds} alternating rounds x "
            f"{args.runs} runs, fresh sessions each round, CPU time of the calling thread. Speed-ups over the "
            f"original; headroom = greedy's time / the best's time (median over rounds, 95% t interval). "
            f"Whole run {elapsed / 60:.1f} min. Command: `XRL_NO_CALIBRATION=1 .venv/bin/python "
            f"experiments/bench_headroom.py --graphs {args.graphs} --rounds {args.rounds} --runs {args.runs} "
            f"--time-limit {args.time_limit:g} --out {args.out}`.\n\n" + table(rows))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    with out.with_suffix(".csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["graph", "best_method", "est_greedy", "est_best", "est_headroom", "original_us", "greedy",
                    "greedy_lo", "greedy_hi", "best", "best_lo", "best_hi", "headroom", "headroom_lo", "headroom_hi",
                    "aa", "aa_lo", "aa_hi", "wall_headroom", "wall_headroom_lo", "wall_headroom_hi", "verdict",
                    "original_ops", "greedy_ops", "best_ops"])
        for r in rows:
            w.writerow([r["graph"], r["best_method"], r["est_greedy"], r["est_best"], r["est_headroom"],
                        r["original_us"], *r["greedy"], *r["best"], *r["headroom"], *r["aa"], *r["wall_headroom"],
                        r["verdict"], r["original_ops"], r["ops"]["greedy"], r["ops"][r["best_method"]]])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
