"""Hugging Face LLaMA with PEFT LoRA, as the libraries write it (issue 35, item 5): what each variant of its two
exports measures under onnxruntime against the original.

The model is experiments/make_hf_llama_fixtures.py's (transformers' LlamaForCausalLM from a config in code,
seeded weights that look trained, PEFT LoRA r 8 on every projection, unmerged; inputs input_ids and
attention_mask, no KV cache), at `--size small` (hidden 256, 2 layers, 4 heads over 2 key/value heads,
sequence 64) by default. Variants, per exporter (TorchScript "ts", "dynamo"):

- original; A/A (a second session of the same file: the noise floor);
- onnxslim, onnxscript's `optimize_for_ort` (the peers, as experiments/harness.py makes them);
- xrl: `xrl optimize --threads N` as a user runs it (default target, pre-passes and guard on);
- xrl+attn: xrl's file with its masked grouped-query attention fused as well (rewrite_rules/
  contrib_gqa_masked.rules applied to every match; none when xrl's own search already took them), to show
  what that fusion measures where the search left it;
- limit: peft's `merge_and_unload()` of the same model, exported the same way (the hand-merged limit).

Every variant's outputs are checked against the original's (harness.check); timing is harness's: interleaved
rounds in a seeded random order, a fresh session per round, the median of a round's runs, the median over
rounds of original/variant with a 95% bootstrap interval. Needs transformers and peft
(experiments/requirements-libraries.txt):

    PYTHONPATH=/tmp/hfdeps .venv/bin/python experiments/bench_hf_llama.py --out experiments/results/hf_llama.md
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import make_hf_llama_fixtures as hf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("original", "A/A", "onnxslim", "onnxscript-ort", "xrl", "xrl+attn", "limit")
SHOWN_OPS = ("MatMul", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RotaryEmbedding",
             "MultiHeadAttention", "GroupQueryAttention", "Softmax")


def fuse_attention(src: Path, dst: Path) -> int:
    """src with every match of the masked grouped-query attention rules rewritten; the number rewritten."""
    from xrl.frontends.onnx_io import from_onnx, to_onnx
    from xrl.rewrite.engine import RewriteEngine
    from xrl.rewrite.rules import load_rules

    engine = RewriteEngine(load_rules([ROOT / "rewrite_rules" / "contrib_gqa_masked.rules"]))
    graph, n = from_onnx(onnx.load(str(src))), 0
    while cands := engine.candidates(graph):
        graph, n = cands[0].graph, n + 1
    onnx.save(to_onnx(graph), str(dst))
    return n


def make_variants(exporter: str, args, work: Path) -> dict[str, harness.Variant]:
    variants = {v: harness.Variant(v) for v in VARIANTS}
    src, lim = work / f"{exporter}-original.onnx", work / f"{exporter}-limit.onnx"
    onnx.save(hf.export_hf(hf.build(args.size, args.seed, attn=args.attn), args.size, exporter), str(src))
    onnx.save(hf.export_hf(hf.build(args.size, args.seed, merged=True, attn=args.attn), args.size, exporter), str(lim))
    variants["original"].path = variants["A/A"].path = src
    variants["limit"].path = lim
    makers = {
        "xrl": lambda dst: variants["xrl"].extra.update(
            harness.make_xrl(src, dst, args.xrl_time_limit, args.seed, args.threads)),
        "xrl+attn": lambda dst: variants["xrl+attn"].extra.update(fused=fuse_attention(variants["xrl"].path, dst)),
        "onnxslim": lambda dst: harness.make_onnxslim(src, dst),
        "onnxscript-ort": lambda dst: variants["onnxscript-ort"].extra.update(harness.make_onnxscript_ort(src, dst)),
    }
    for name, make in makers.items():
        if name == "xrl+attn" and variants["xrl"].path is None:
            variants[name].error = "no xrl file"
            continue
        dst = work / f"{exporter}-{name.replace('+', '-')}.onnx"
        started = time.perf_counter()
        try:
            make(dst)
            variants[name].path = dst
        except Exception as exc:  # a peer that fails is a cell, not a crash
            variants[name].error = harness.one_line(exc)
        variants[name].extra["make_s"] = round(time.perf_counter() - started, 1)
        print(f"  {exporter}/{name}: {variants[name].error or 'made'} in {variants[name].extra['make_s']} s",
              file=sys.stderr)
    if variants["xrl+attn"].extra.get("fused") == 0:
        variants["xrl+attn"].path = None
        variants["xrl+attn"].error = "no match of the masked attention rules in xrl's file"
    feeds = hf.example_inputs(args.size, seed=args.seed)
    reference = [o.astype(np.float64) for o in harness.run_outputs(src, feeds)]
    for var in variants.values():
        if var.path is not None:
            var.nodes, var.ops = harness.histogram(var.path)
            if var.name != "original":
                harness.check(var, reference, feeds)
    return variants


def time_variants(variants: dict[str, harness.Variant], exporter: str, args) -> dict[str, harness.Timing]:
    """harness.time_result's protocol on these variants."""
    live = {v.name: v for v in variants.values() if v.path is not None and v.error is None}
    feeds = hf.example_inputs(args.size, seed=args.seed)
    rng = random.Random(f"{args.seed}-hf_llama-{exporter}-{args.threads}")
    per_round: dict[str, list[float]] = {name: [] for name in live}
    for r in range(args.rounds):
        order = list(live)
        rng.shuffle(order)
        for name in order:
            sess, times = harness.session(live[name].path, 1 if args.threads == "1" else 0), []
            f = harness.its_feeds(sess, feeds)
            for _ in range(2):
                sess.run(None, f)
            spent = 0.0
            while len(times) < args.runs or spent < args.min_ms / 1e3:
                t0 = time.perf_counter()
                sess.run(None, f)
                times.append(time.perf_counter() - t0)
                spent += times[-1]
            per_round[name].append(float(np.median(times)))
            del sess
        print(f"  {exporter}: round {r + 1}/{args.rounds}", file=sys.stderr)
    out = {}
    for name, times in per_round.items():
        timing = harness.Timing(median_ms=1e3 * float(np.median(times)), rounds_ms=[1e3 * t for t in times])
        if name != "original":
            timing.speedup, timing.lo, timing.hi = harness.ratio_interval(per_round["original"], times, args.seed)
        out[name] = timing
    return out


def ops_cell(var: harness.Variant) -> str:
    counts = Counter(dict((op, int(n)) for op, n in (p.split(":") for p in var.ops.split(";") if p)))
    short = {"SimplifiedLayerNormalization": "SLN", "SkipSimplifiedLayerNormalization": "SkipSLN",
             "RotaryEmbedding": "Rotary", "MultiHeadAttention": "MHA", "GroupQueryAttention": "GQA"}
    return " ".join(f"{short.get(op, op)} {counts[op]}" for op in SHOWN_OPS if counts[op])


def markdown(rows: dict[str, tuple[dict, dict]], args, elapsed: float) -> str:
    d = hf.SIZES[args.size]
    lines = [f"# Hugging Face LLaMA with PEFT LoRA: `--size {args.size}` (hidden {d.hidden}, {d.layers} layers, "
             f"{d.heads} heads over {d.kv_heads} key/value heads, SwiGLU {d.ffn}, vocab {d.vocab}, sequence {d.seq}), "
             f"{args.attn} attention, threads {args.threads}",
             "",
             f"Speed-up = original / variant under onnxruntime (CPU, ORT_ENABLE_ALL), median over {args.rounds} "
             f"interleaved rounds [95% bootstrap interval]; nodes and the fused ops of each file. A shared, loaded "
             f"2-core machine: compare ratios within this table only. {elapsed / 60:.1f} min.",
             "",
             "| exporter | variant | speed-up | median ms | nodes | ops | note |",
             "|---|---|---:|---:|---:|---|---|"]
    for exporter, (variants, timings) in rows.items():
        for name in VARIANTS:
            var, t = variants[name], timings.get(name)
            if t is None:
                lines.append(f"| {exporter} | {name} | — | — | {var.nodes or '—'} | {ops_cell(var) if var.ops else ''} "
                             f"| {var.error or ''} |")
                continue
            sp = "1" if t.speedup is None else f"{t.speedup:.3f} [{t.lo:.3f}-{t.hi:.3f}]"
            note = ""
            if name == "xrl":
                x = var.extra
                note = (f"wrote {x.get('wrote')}; pre-passes {','.join(x.get('prepasses') or []) or 'none'}; "
                        f"rules {json.dumps(x.get('rules') or {})}; {x.get('make_s')} s")
            elif name == "xrl+attn":
                note = f"{var.extra.get('fused')} masked attention fused"
            lines.append(f"| {exporter} | {name} | {sp} | {t.median_ms:.3f} | {var.nodes} | {ops_cell(var)} | {note} |")
    xs = [(e, tm) for e, (_, tm) in rows.items() if "xrl" in tm and "limit" in tm]
    if xs:
        lines += ["", "xrl's share of the limit's gain ((xrl - 1) / (limit - 1)): " + ", ".join(
            f"{e} {(tm['xrl'].speedup - 1) / (tm['limit'].speedup - 1):.0%}" for e, tm in xs
            if tm["limit"].speedup and tm["limit"].speedup > 1)]
    lines += ["", "```bash", "PYTHONPATH=/tmp/hfdeps .venv/bin/python experiments/bench_hf_llama.py " + " ".join(
        sys.argv[1:]), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="small", choices=sorted(hf.SIZES))
    ap.add_argument("--exporters", default="ts,dynamo")
    ap.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"), help="transformers' attention implementation")
    ap.add_argument("--threads", default="1", help="onnxruntime intra-op threads: N or all (xrl optimises for it)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=5, help="runs per variant per round (at least --min-ms)")
    ap.add_argument("--min-ms", type=float, default=100.0)
    ap.add_argument("--xrl-time-limit", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="the Markdown table (a .json beside it); else printed")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    rows: dict[str, tuple[dict, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="xrl-hf-llama-") as tmp:
        for exporter in args.exporters.split(","):
            variants = make_variants(exporter, args, Path(tmp))
            rows[exporter] = (variants, time_variants(variants, exporter, args))
    text = markdown(rows, args, time.perf_counter() - started)
    if args.out is None:
        print(text)
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    doc = {e: {n: {"speedup": t.speedup, "lo": t.lo, "hi": t.hi, "median_ms": t.median_ms,
                   "nodes": v[n].nodes, "ops": v[n].ops, "error": v[n].error,
                   "extra": {k: x for k, x in v[n].extra.items() if k != "peak_rss"}}
                   for n, t in tm.items()} | {n: {"error": v[n].error} for n in VARIANTS if n not in tm}
           for e, (v, tm) in rows.items()}
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
