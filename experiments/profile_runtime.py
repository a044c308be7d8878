"""Where onnxruntime spends its time on a model: the share of kernel time per op type.

Graph rewriting can remove kernels, merge them and shrink what they move; it cannot make a float32
GEMM do fewer FLOPs. This script answers how much of a model's run time is left for rewriting once
the runtime has applied its own optimisations: it runs the model under onnxruntime's profiler
(ORT_ENABLE_ALL, the given thread count) and sums the kernel time of each op type (the names are
those of the optimised graph onnxruntime runs: FusedMatMul, FusedConv, SkipLayerNormalization, ...).

    .venv/bin/python experiments/profile_runtime.py MODEL.onnx [MODEL2.onnx ...] [--threads 1] [--runs 20]
    .venv/bin/python experiments/profile_runtime.py --deploy bert,gpt,vit,resnet,effnet [--exporter torchscript]

`--deploy` exports the deployment benchmark's base-size models (graphs/deploy_models.py, cached).
Prints one Markdown table per model and a summary: the share of GEMM-like kernels (MatMul, Gemm,
Conv and their fused and attention forms).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

GEMM_LIKE = {"MatMul", "Gemm", "Conv", "FusedMatMul", "FusedGemm", "FusedConv", "Attention", "MultiHeadAttention",
             "QAttention", "NhwcConv"}


def profile(path: Path, threads: int, runs: int, seed: int = 0) -> dict[str, float]:
    """op type -> microseconds of kernel time per run (median run of the profile)."""
    import onnxruntime as ort

    from xrl.frontends.onnx_io import load_onnx
    from xrl.frontends.verify import input_specs

    specs = input_specs(load_onnx(path))
    rng = np.random.default_rng(seed)
    feeds = {s.name: (rng.standard_normal(s.shape).astype(s.dtype) if np.issubdtype(np.dtype(s.dtype), np.floating)
                      else np.ones(s.shape, dtype=s.dtype)) for s in specs}
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = threads
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "ort")
        so.log_severity_level = 3
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        for _ in range(3):  # warm-up runs are profiled too: they are dropped below
            sess.run(None, feeds)
        for _ in range(runs):
            sess.run(None, feeds)
        trace = json.loads(Path(sess.end_profiling()).read_text())
    per_run: list[collections.Counter] = []
    for ev in trace:
        if ev.get("cat") == "Session" and ev.get("name") == "model_run":
            per_run.append(collections.Counter())
        elif ev.get("cat") == "Node" and ev.get("name", "").endswith("_kernel_time") and per_run:
            per_run[-1][ev["args"].get("op_name", "?")] += ev["dur"]
    kept = per_run[3:] or per_run
    totals = [sum(c.values()) for c in kept]
    median = kept[int(np.argsort(totals)[len(totals) // 2])]
    return dict(median)


def table(name: str, times: dict[str, float]) -> str:
    total = sum(times.values()) or 1.0
    rows = [f"### {name}: {total / 1e3:.2f} ms of kernel time per run", "", "| op | ms | share |", "|---|---:|---:|"]
    for op, t in sorted(times.items(), key=lambda kv: -kv[1])[:12]:
        rows.append(f"| {op} | {t / 1e3:.2f} | {t / total:.1%} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", type=Path)
    p.add_argument("--deploy", default="", help="deployment benchmark models to export and profile")
    p.add_argument("--exporter", default="torchscript", choices=("torchscript", "dynamo"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--out", type=Path, help="also write the tables to this Markdown file")
    args = p.parse_args(argv)
    paths: list[tuple[str, Path]] = [(m.stem, m) for m in args.models]
    if args.deploy:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from xrl.graphs import deploy_models

        cache = Path(os.environ.get("XRL_DEPLOY_CACHE", Path.home() / ".cache/xrl/deploy"))
        for name in args.deploy.split(","):  # the deployment benchmark's cache: exported once
            paths.append((f"{name} ({args.exporter})", deploy_models.cached_export(name, "base", args.exporter, cache)))
    if not paths:
        p.error("give ONNX files or --deploy NAMES")
    out, summary = [], ["| model | kernel ms | GEMM-like share | rest |", "|---|---:|---:|---:|"]
    for name, path in paths:
        times = profile(path, args.threads, args.runs)
        total = sum(times.values()) or 1.0
        gemm = sum(t for op, t in times.items() if op in GEMM_LIKE)
        summary.append(f"| {name} | {total / 1e3:.2f} | {gemm / total:.1%} | {1 - gemm / total:.1%} |")
        out.append(table(name, times))
        print(out[-1] + "\n", flush=True)
    text = (f"onnxruntime profile, ORT_ENABLE_ALL, {args.threads} thread(s), median of {args.runs} runs\n\n"
            + "\n".join(summary) + "\n\n" + "\n\n".join(out) + "\n")
    print("\n".join(summary))
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
