"""issue 35 item 4: the 1e9-parameter LoRA decoder end to end

A large real model end to end (issue 35, item 4): a LLaMA-style decoder of about 1e9 parameters, built in code,
with unmerged PEFT LoRA adapters on every projection, exported by both torch exporters with external data, then
`xrl optimize` with the CLI's defaults: wall time, peak memory (the largest process's RSS and the tree's PSS, per
stage: `bench_memory.run_sampled`), and the measured speed-ups of xrl's file, the hand-merged limit and an A/A
copy against the original (onnxruntime, one thread, alternating rounds: `xrl.cost.speedup`).

    .venv/bin/python experiments/bench_large_decoder.py [--exporters ts,dynamo] [--size 1b] [--rounds 5]
        [--timeout 1500] [--cache /tmp/xrl-large-cache] [--out experiments/results/large_decoder]

The model is `xrl.graphs.families.llama_xl` (sizes tiny, small, half, 1b); its exports, its limit's and the peers'
files (onnxslim, onnxscript's optimize_for_ort) are cached under --cache (outside the repository) by size and
exporter. The variants are timed in one process of their own, interleaved with the original and an A/A copy of
it in each round (order rotated), one session alive at a time, with the guard's timing (one warm-up run, the
median of three, thread CPU time), so every row's ratio comes from the same rounds.

Dimensions (TinyLlama-1.1B's body without its embedding and head): hidden 2048, 32 heads, 4 key/value heads,
SwiGLU 5632, 22 layers, sequence 128: 0.97e9 parameters (3.9 GB float32) plus LoRA r 8 on q/k/v/o/gate/up/down.
Memory: the export holds the weights two to three times in this script's child (torch's exporters), so each
export runs in its own process, and the optimisation runs alone. Goals (issue 35): at most 20 minutes, at most
3x the weights (largest process and tree), at least 90% of the limit's gain.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))

EXPORT_CODE = """
import sys
from pathlib import Path
from xrl.graphs.families import llama_xl
exporter, out, size, merged = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "limit"
model = llama_xl.build(size, seed=0, merged=merged)
llama_xl.export_to(model, size, out, exporter)
print(llama_xl.parameters(model))
"""

PEER_CODE = """
import sys, onnx
peer, src, dst = sys.argv[1], sys.argv[2], sys.argv[3]
if peer == "onnxslim":
    import onnxslim
    model = onnxslim.slim(src)
    onnx.save_model(model, dst, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=dst.rsplit("/", 1)[-1] + ".data", size_threshold=1024)
else:
    import onnxscript.ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort
    model = ir.load(src)
    model, stats = optimize_for_ort(model)
    ir.save(model, dst, external_data=dst.rsplit("/", 1)[-1] + ".data")
"""

SPEED_CODE = """
import json, math, sys, time
import numpy as np, onnxruntime as ort
from xrl.cost.speedup import MeasuredSpeedup
from xrl.cost.timing import summarize
rounds, files = int(sys.argv[1]), json.loads(sys.argv[2])  # {"original": path, name: path, ...}
names = ["original", "A/A", *(k for k in files if k != "original")]
paths = {"A/A": files["original"], **files}
rng = np.random.default_rng(0)

def feeds(sess):
    out = {}
    for i in sess.get_inputs():
        shape = [int(d) for d in i.shape]
        out[i.name] = rng.standard_normal(shape).astype(np.float32) if "float" in i.type else np.zeros(shape, np.int64)
    return out

inputs, timed = None, {k: [] for k in names}
for r in range(rounds):
    k = r % len(names)
    for name in names[k:] + names[:k]:  # rotated: no variant always first or last in a round
        so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
        so.log_severity_level = 3
        sess = ort.InferenceSession(paths[name], so, providers=["CPUExecutionProvider"])
        inputs = inputs or feeds(sess)
        sess.run(None, inputs)  # the guard's timing: one warm-up run, the median of three (thread CPU time)
        runs = []
        for _ in range(3):
            t = time.thread_time(); sess.run(None, inputs); runs.append(time.thread_time() - t)
        timed[name].append(summarize(runs))
        del sess
    print(json.dumps({"round": r + 1}), file=sys.stderr, flush=True)
ratio = lambda n: tuple(a.median_s / b.median_s for a, b in zip(timed["original"], timed[n]))
out = {}
for n in names[1:]:
    m = MeasuredSpeedup("ort(cpu, 1+3 runs, threads=1)", timed["original"][0], timed[n][0], ratio(n),
                        control_speedups=() if n == "A/A" else ratio("A/A"))
    out[n] = {"speedup": m.speedup, "interval": list(m.interval), "verdict": m.verdict,
              "control": list(m.control) if m.control else None}
print(json.dumps(out))
"""


def export(exporter: str, path: Path, size: str, limit: bool, timeout: float) -> int:
    """The model (or its hand-merged limit) exported in its own process, once (cached by path); returns its
    parameter count."""
    count = path.with_suffix(".params")
    if not (path.exists() and count.exists()):
        out = subprocess.run([sys.executable, "-c", EXPORT_CODE, exporter, str(path), size,
                              "limit" if limit else "adapters"], capture_output=True, text=True, timeout=timeout,
                             check=True)
        count.write_text(out.stdout.split()[-1])
    return int(count.read_text())


def peer(name: str, src: Path, dst: Path, timeout: float) -> str | None:
    """A peer's file (cached); None when written, else the peer's one-line error."""
    if dst.exists():
        return None
    out = subprocess.run([sys.executable, "-c", PEER_CODE, name, str(src), str(dst)], capture_output=True,
                         text=True, timeout=timeout)
    return None if out.returncode == 0 else (out.stderr.strip().splitlines() or ["failed"])[-1][:200]


def report_json(text: str) -> dict:
    """xrl's --json report from the end of its output ({} when there is none)."""
    start = text.rfind("\n{")
    try:
        return json.loads(text[start + 1 if start >= 0 else 0:])
    except ValueError:
        return {}


def speedups(files: dict[str, Path], rounds: int, timeout: float) -> dict:
    """Every variant against the original (`files["original"]`), interleaved in one process: in each round a
    fresh onnxruntime session of each file in turn (one alive at a time: each holds 4 GB), one thread, an A/A
    control of the original; the guard's timing per session (one warm-up run, the median of three)."""
    out = subprocess.run([sys.executable, "-c", SPEED_CODE, str(rounds), json.dumps({k: str(v) for k, v in
                                                                                   files.items()})],
                         capture_output=True, text=True, timeout=timeout, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    import bench_memory as bm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exporters", default="ts,dynamo")
    ap.add_argument("--size", default="1b", help="llama_xl's size: tiny, small, half, 1b")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=1500.0)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "xrl-large-cache")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "large_decoder")
    args = ap.parse_args(argv)
    rows, lines = [], []
    for exporter in args.exporters.split(","):
        folder = args.cache / f"{args.size}-{exporter}"
        folder.mkdir(parents=True, exist_ok=True)
        original, limit, written = folder / "original.onnx", folder / "limit" / "limit.onnx", folder / "xrl.onnx"
        started = time.perf_counter()
        params = export(exporter, original, args.size, False, args.timeout)
        export(exporter, limit, args.size, True, args.timeout)
        export_s = time.perf_counter() - started
        weights = bm.weight_bytes_of(str(original), "file")
        variants = {"A/A": original, "limit": limit}
        for name in ("onnxslim", "onnxscript"):
            dst = folder / name / f"{name}.onnx"
            dst.parent.mkdir(exist_ok=True)
            err = peer(name, original, dst, args.timeout)
            variants[name] = dst if err is None else err
        phases: list = []
        report_file = folder / "xrl-report.json"  # --json goes to stdout; stderr's tail is the text around it
        code, _, single, wall, tail, pss = bm.run_sampled(
            bm.optimize_cmd(str(original), written, None), env=bm.user_env(), timeout=args.timeout,
            cwd=str(folder), phases=phases, stdout=report_file)
        report = report_json(report_file.read_text() if report_file.exists() else tail)
        row = {"exporter": exporter, "size": args.size, "params": params, "weight_bytes": weights,
               "export_s": export_s, "exit": code, "wall_s": wall, "peak_tree_pss": pss, "peak_single_rss": single,
               "pss_over_weights": pss / weights, "single_over_weights": single / weights, "tail": tail[-2000:],
               "stage_seconds": report.get("stage_seconds"),
               "prepasses": [{k: p.get(k) for k in ("name", "applied", "timed_out", "detail")}
                             for p in report.get("prepasses", [])],
               "phases": [vars(p) for p in phases], "speedups": {}}
        if code == 0:
            variants["xrl"] = written
        files = {"original": original, **{k: v for k, v in variants.items() if isinstance(v, Path) and k != "A/A"}}
        try:
            row["speedups"] = speedups(files, args.rounds, args.timeout * 3)
        except (subprocess.SubprocessError, ValueError) as exc:
            row["speedups"] = {k: {"error": str(exc)[:200]} for k in ("A/A", *files)}
        row["speedups"].update({k: {"error": v} for k, v in variants.items() if not isinstance(v, Path)})
        gain = row["speedups"]["limit"].get("speedup", 1.0) - 1
        if "speedup" in row["speedups"].get("xrl", {}) and gain > 0:
            row["share_of_limit_gain"] = (row["speedups"]["xrl"]["speedup"] - 1) / gain
        rows.append(row)
        print(json.dumps(row), flush=True)
        lines.append(f"### {args.size} ({params / 1e9:.2f}e9 parameters, {weights / 2**30:.2f} GiB), {exporter}\n")
        lines.append("| variant | speed-up [95% interval] |\n|---|---|")
        lines.append("| original | 1 |")
        for name, m in row["speedups"].items():
            cell = (f"{m['speedup']:.3f}x [{m['interval'][0]:.3f}-{m['interval'][1]:.3f}]" if "speedup" in m
                    else f"failed: {m['error']}")
            lines.append(f"| {name} | {cell} |")
        lines.append(f"\nxrl: exit {code}, {wall:.0f} s wall (export {export_s:.0f} s), peak largest-process RSS "
                     f"{single / weights:.2f}x and tree PSS {pss / weights:.2f}x the weights; share of the limit's "
                     f"gain {row.get('share_of_limit_gain')}; stage seconds {row['stage_seconds']}; pre-passes "
                     + "; ".join(f"{p['name']}: {'timed out' if p['timed_out'] else 'done'}" for p in row["prepasses"])
                     + "\n")
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"large_decoder_{args.size}.json").write_text(json.dumps(rows, indent=2) + "\n")
    (args.out / f"large_decoder_{args.size}.md").write_text(table + "\n")
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
