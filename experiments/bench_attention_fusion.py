"""What fusing attention into onnxruntime's contrib ops is worth, measured (issue 23).

For each graph, every candidate of the attention fusion rules (rewrite_rules/contrib_attention.rules into
MultiHeadAttention, rewrite_rules/contrib_gqa.rules into GroupQueryAttention) is applied, one layer after the
next, with no other rewrite; the result is verified against the original under onnxruntime, then both are
timed end to end in alternating rounds with an A/A copy of the original (`xrl.cost.speedup.measure_speedup`):
with onnxruntime on the CPU, or with xrl's PyTorch executor on a GPU (the contrib ops lowered to
`F.scaled_dot_product_attention`, replayed as a CUDA graph). The table gives the fused ops, the node counts,
the measured speed-up with its 95% interval, the A/A interval and the verdict.

    .venv/bin/python experiments/bench_attention_fusion.py [--graphs fam_attn_sdpa_ts,...] [--device cpu|cuda]
        [--engine ort|torch] [--rounds 6] [--repeats 10] [--out experiments/results/attention_fusion_cpu.md]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections import Counter
from pathlib import Path

from xrl.api import measure_model
from xrl.cli.output import format_table
from xrl.cost.speedup import measure_speedup
from xrl.errors import XrlError
from xrl.frontends.loader import load_model
from xrl.frontends.onnx_io import to_onnx
from xrl.frontends.verify import compare_models
from xrl.ir import Graph
from xrl.rewrite import RewriteEngine
from xrl.stats import geomean

DEFAULT_GRAPHS = ("fam_attn_sdpa_ts,fam_attn_sdpa_dynamo,fam_attn_mha_ts,fam_attn_mha_causal_dynamo,"
                  "fam_llama_ts,fam_llama_eager_dynamo")
FUSION_RULES = ("fuse_mha", "fuse_gqa")  # rule-name prefixes
FUSED_OPS = ("MultiHeadAttention", "GroupQueryAttention")
MAX_FUSIONS = 64  # layers: a bound, never reached by the families


def fuse_attention(graph: Graph, engine: RewriteEngine) -> tuple[Graph, list[str]]:
    """`graph` with every attention fusion applied (the first candidate each time, until none is left)."""
    steps: list[str] = []
    for _ in range(MAX_FUSIONS):
        cand = next((c for c in engine.candidates(graph) if str(c.step).startswith(FUSION_RULES)), None)
        if cand is None:
            break
        graph = cand.graph
        steps.append(str(cand.step).split("@")[0])
    return graph, steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", default=DEFAULT_GRAPHS)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--engine", default=None, choices=("ort", "torch"), help="default: ort on cpu, torch on cuda")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    engine_name = args.engine or ("ort" if args.device == "cpu" else "torch")
    try:
        timer = measure_model(engine_name, args.device, repeats=args.repeats, warmup=3)
    except XrlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    engine = RewriteEngine.default()
    rows, speedups = [], []
    t_all = time.perf_counter()
    for name in [g for g in args.graphs.split(",") if g]:
        try:
            graph = load_model(name).graph
        except XrlError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        fused, steps = fuse_attention(graph, engine)
        ops = Counter(n.op for n in fused.nodes.values())
        if not steps:
            rows.append([name, "-", len(graph), len(fused), "-", "-", "no attention fusion matches"])
            continue
        check = compare_models(to_onnx(graph), to_onnx(fused))
        if not check.ok:
            rows.append([name, ", ".join(sorted(set(steps))), len(graph), len(fused), "-", "-",
                         f"failed verification: {check.detail}"])
            continue
        try:
            m = measure_speedup(timer, graph, fused, rounds=args.rounds, control=True)
        except XrlError as e:  # an op this engine cannot run (the torch executor and an opaque Gather, say)
            rows.append([name, ", ".join(sorted(set(steps))), len(graph), len(fused), "-", "-",
                         f"not timed: {str(e).splitlines()[0][:100]}"])
            continue
        lo, hi = m.interval
        clo, chi = m.control or (float("nan"), float("nan"))
        speedups.append(m.speedup)
        fused_ops = ", ".join(f"{ops[o]} {o}" for o in FUSED_OPS if ops[o])
        rows.append([name, fused_ops, len(graph), len(fused), f"{m.speedup:.3f} [{lo:.3f}-{hi:.3f}]",
                     f"[{clo:.3f}-{chi:.3f}]", m.verdict])
        print(f"  {name}: {fused_ops}; {m.speedup:.3f} [{lo:.3f}-{hi:.3f}] {m.verdict}", flush=True)
    header = ["graph", "fused", "nodes", "fused nodes", "measured", "A/A", "verdict"]
    where = f"{args.device} ({platform.processor() or platform.machine()})"
    if args.device == "cuda":
        import torch

        where = f"cuda ({torch.cuda.get_device_name()})"
    lines = [f"device {where}, engine {engine_name}, {timer.describe()}, {args.rounds} alternating rounds with an "
             f"A/A copy of the original; total {time.perf_counter() - t_all:.0f} s", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    if speedups:
        lines += ["", f"geomean over {len(speedups)} graphs: {geomean(speedups):.3f}"]
    print(format_table(header, rows))
    print(lines[-1] if speedups else "")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
