"""Measured cost models against the analytic one: cost, spread, measurement time, and rank agreement.

For each built-in graph: the analytic roofline estimate, the per-op measured `op` model (with a cold
cache, then warm: a new model on the same cache file, as a second process would see it), and the
whole-graph `e2e` model with onnxruntime and with PyTorch. Then, over the rewrite candidates of a few
states of small graphs (a seeded random walk), the Spearman rank correlation between the analytic
costs and the measured ones: how far the analytic model can stand in for measurement when ranking
the actions an agent chooses between.

    .venv/bin/python experiments/bench_measured.py [--graphs tiny_cnn,mlp] [--device cpu|cuda] [--repeats 10]
        [--threads 2] [--corr-graphs tiny_cnn,mlp,squeezenet] [--states 3] [--max-candidates 12]
        [--out experiments/results/measured_cpu.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from xrl import graphs
from xrl.cli.output import format_table
from xrl.cost.analytic import AnalyticCostModel
from xrl.cost.base import CostModel, Measurement
from xrl.cost.e2e import E2ECostModel
from xrl.cost.op_measured import OpMeasuredCostModel
from xrl.errors import ConfigError
from xrl.frontends.onnx_io import from_onnx
from xrl.ir import Graph

DEFAULT_GRAPHS = "mlp,tiny_cnn,squeezenet,resnet50,bert,inception_v3"
DEFAULT_CORR = "tiny_cnn,mlp,squeezenet"


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (scipy's when installed; else Pearson on average ranks); NaN when a
    series holds a NaN (a model that could not run here)."""
    if np.isnan(a).any() or np.isnan(b).any():
        return float("nan")
    try:
        from scipy.stats import spearmanr

        return float(spearmanr(a, b).statistic)
    except ImportError:
        pass

    def ranks(x: Sequence[float]) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):  # ties share their average rank
            tied = x == v
            r[tied] = r[tied].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def measured_options(args: argparse.Namespace) -> dict:
    opts = {"device": args.device, "warmup": args.warmup, "repeats": args.repeats}
    if args.threads:  # else the models' default: one thread on the CPU
        opts["threads"] = args.threads
    return opts


NAN = Measurement(float("nan"), 0, float("nan"))


def timed_measure(model: CostModel | None, graph: Graph) -> tuple[Measurement, float]:
    """The measurement and the seconds it took; NaNs for a model that could not be made here."""
    if model is None:
        return NAN, float("nan")
    t0 = time.perf_counter()
    m = model.measure(graph)
    return m, time.perf_counter() - t0


def e2e_models(args: argparse.Namespace) -> dict[str, E2ECostModel | None]:
    """The e2e model per engine; None where it cannot run (onnxruntime without CUDA on a GPU)."""
    models: dict[str, E2ECostModel | None] = {}
    for engine in ("ort", "torch"):
        try:
            models[engine] = E2ECostModel(engine=engine, **measured_options(args))
        except ConfigError as e:
            print(f"  e2e {engine}: skipped ({e})")
            models[engine] = None
    return models


def cost_rows(names: list[str], args: argparse.Namespace, cache_dir: Path) -> tuple[list[str], list[list]]:
    analytic = AnalyticCostModel(device=args.profile)
    common = measured_options(args)
    e2e = e2e_models(args)
    rows = []
    for name in names:
        g = from_onnx(graphs.build(name), name=name)
        cache = cache_dir / f"{name}.sqlite"  # a fresh, empty cache per graph: the cold run measures every op
        cold, t_cold = timed_measure(OpMeasuredCostModel(cache_path=cache, **common), g)
        warm, t_warm = timed_measure(OpMeasuredCostModel(cache_path=cache, **common), g)
        assert warm.median_s == cold.median_s, "a warm cache must return the cold run's timings"
        ort, t_ort = timed_measure(e2e["ort"], g)
        tor, t_tor = timed_measure(e2e["torch"], g)
        rows.append([name, len(g), analytic.cost(g) * 1e3,
                     cold.median_s * 1e3, cold.cv * 100, t_cold, t_warm, t_cold / max(t_warm, 1e-9),
                     ort.median_s * 1e3, ort.cv * 100, t_ort, tor.median_s * 1e3, tor.cv * 100, t_tor])
        print(f"  {name}: op cold {t_cold:.2f} s, warm {t_warm * 1e3:.1f} ms; e2e ort {t_ort:.2f} s, "
              f"torch {t_tor:.2f} s", flush=True)
    headers = ["graph", "ops", f"analytic {args.profile} ms", "op ms", "op CV %", "op cold s", "op warm s",
               "cold/warm", "e2e ort ms", "ort CV %", "ort s", "e2e torch ms", "torch CV %", "torch s"]
    return headers, rows


def correlation_rows(names: list[str], args: argparse.Namespace, cache_dir: Path) -> tuple[list[str], list[list]]:
    try:
        from xrl.rewrite import RewriteEngine
    except ImportError as e:
        print(f"  rank correlation skipped: the rewrite engine is not available ({e})")
        return [], []
    rewriter = RewriteEngine.default()
    analytic = AnalyticCostModel(device=args.profile)
    common = measured_options(args)
    op = OpMeasuredCostModel(cache_path=cache_dir / "candidates.sqlite", **common)
    e2e = e2e_models(args)
    rng = np.random.default_rng(args.seed)
    rows = []
    for name in names:
        g = from_onnx(graphs.build(name), name=name)
        costs: dict[str, list[float]] = {"analytic": [], "op": [], "ort": [], "torch": []}
        t0 = time.perf_counter()
        for _ in range(args.states):
            cands = rewriter.candidates(g)
            if not cands:
                break
            # an even spread over the candidate list (it is ordered by rule): every rule kind is represented
            pick = np.unique(np.linspace(0, len(cands) - 1, min(args.max_candidates, len(cands))).astype(int))
            for i in pick:
                cg = cands[i].graph
                costs["analytic"].append(analytic.cost(cg))
                costs["op"].append(op.cost(cg))
                for engine, model in e2e.items():
                    costs[engine].append(model.cost(cg) if model is not None else float("nan"))
            g = cands[int(rng.integers(len(cands)))].graph  # a seeded random walk to the next state
        n = len(costs["analytic"])
        if n < 3:
            print(f"  {name}: too few candidates ({n}) for a rank correlation")
            continue
        rows.append([name, n, spearman(costs["analytic"], costs["op"]), spearman(costs["analytic"], costs["ort"]),
                     spearman(costs["analytic"], costs["torch"]), spearman(costs["op"], costs["ort"]),
                     spearman(costs["ort"], costs["torch"]), time.perf_counter() - t0])
        print(f"  {name}: {n} candidates ranked in {rows[-1][-1]:.1f} s", flush=True)
    headers = ["graph", "candidates", "analytic~op", "analytic~e2e ort", "analytic~e2e torch", "op~e2e ort",
               "ort~torch", "time s"]
    return headers, rows


def markdown(headers: list[str], rows: list[list]) -> str:
    def cell(v: object) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    md = "| " + " | ".join(headers) + " |\n|" + "---|" * len(headers) + "\n"
    return md + "".join("| " + " | ".join(cell(v) for v in r) + " |\n" for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default=DEFAULT_GRAPHS, help=f"comma-separated graphs (default {DEFAULT_GRAPHS})")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where measured models run")
    ap.add_argument("--profile", help="analytic device profile (default: cpu on the CPU, h100 on a GPU)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, help="CPU threads for torch and onnxruntime (default 1)")
    ap.add_argument("--corr-graphs", default=DEFAULT_CORR, help="graphs whose candidates are ranked ('' to skip)")
    ap.add_argument("--states", type=int, default=3, help="states visited per graph for the rank correlation")
    ap.add_argument("--max-candidates", type=int, default=12, help="candidates costed per state")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="also write the tables (markdown) here")
    args = ap.parse_args()
    args.profile = args.profile or ("cpu" if args.device == "cpu" else "h100")

    import torch

    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{platform.processor() or 'cpu'}"
    header = (f"device {args.device} ({where}), torch {torch.__version__}, threads {args.threads or 1}, "
              f"{args.warmup} warm-up + {args.repeats} timed runs, load average {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} cores at the start")
    print(header)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="xrl-bench-") as tmp:
        print("costs:")
        cost_h, cost_r = cost_rows([n for n in args.graphs.split(",") if n], args, Path(tmp))
        print("rank correlation over rewrite candidates:")
        corr_names = [n for n in args.corr_graphs.split(",") if n]
        corr_h, corr_r = correlation_rows(corr_names, args, Path(tmp)) if corr_names else ([], [])
    total = time.perf_counter() - t0
    print()
    print(format_table(cost_h, cost_r))
    if corr_r:
        print()
        print(format_table(corr_h, corr_r))
    print(f"\ntotal {total:.0f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        text = f"{header}; total {total:.0f} s\n\n" + markdown(cost_h, cost_r)
        if corr_r:
            text += "\nSpearman rank correlation over rewrite candidates:\n\n" + markdown(corr_h, corr_r)
        args.out.write_text(text)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
