"""A large real model end to end (issue 35, item 4): a LLaMA-style decoder of about 1e9 parameters, built in code,
with unmerged PEFT LoRA adapters on every projection, exported by both torch exporters with external data, then
`xrl optimize` with the CLI's defaults: wall time, peak memory (the largest process's RSS and the tree's PSS, per
stage: `bench_memory.run_sampled`), and the measured speed-ups of xrl's file, the hand-merged limit and an A/A
copy against the original (onnxruntime, one thread, alternating rounds: `xrl.cost.speedup`).

    .venv/bin/python experiments/bench_large_decoder.py [--exporters ts,dynamo] [--layers 22] [--rounds 5]
        [--timeout 1500] [--out experiments/results/large_decoder]

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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))

EXPORT_CODE = """
import sys, torch, onnx
from pathlib import Path
from xrl.graphs.families import llama, lora
from xrl.graphs.families.export import Spec, example_args, exporter_key
exporter, out, layers, limit = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "limit"
d = llama.Dims(hidden=2048, heads=32, kv_heads=4, ffn=5632, seq=128, layers=layers)
torch.manual_seed(0)
model = llama.LlamaModel(d, sdpa=True, interleaved=False).eval()
lora.add_lora(model, 8, 0, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
if limit:
    model = lora.merge_and_unload(model)
model.eval()
inputs = [Spec("hidden_states", (1, d.seq, d.hidden))]
args = example_args(inputs)
with torch.no_grad():
    if exporter_key(exporter) == "ts":
        torch.onnx.export(model, args, str(out), input_names=["hidden_states"], output_names=["last_hidden_state"],
                          opset_version=17, do_constant_folding=True, dynamo=False)
    else:
        program = torch.onnx.export(model, args, input_names=["hidden_states"],
                                    output_names=["last_hidden_state"], opset_version=18, dynamo=True)
        program.save(str(out), external_data=True)
print(sum(p.numel() for p in model.parameters()))
"""

SPEED_CODE = """
import json, sys
from xrl.api import measure_model
from xrl.cost.speedup import measure_speedup
from xrl.frontends.onnx_io import load_onnx
before, after, rounds = load_onnx(sys.argv[1]), load_onnx(sys.argv[2]), int(sys.argv[3])
m = measure_speedup(measure_model("ort", threads=1), before, after, rounds=rounds, control=True)
print(json.dumps({"speedup": m.speedup, "interval": m.interval, "control": m.control}))
"""


def export(exporter: str, path: Path, layers: int, limit: bool, timeout: float) -> int:
    """The model (or its hand-merged limit) exported in its own process; returns its parameter count."""
    out = subprocess.run([sys.executable, "-c", EXPORT_CODE, exporter, str(path), str(layers),
                          "limit" if limit else "adapters"], capture_output=True, text=True, timeout=timeout,
                         check=True)
    return int(out.stdout.split()[-1])


def speedup(original: Path, other: Path, rounds: int, timeout: float) -> dict:
    """`other` against `original`, end to end (onnxruntime, one thread, alternating rounds, an A/A control), in
    a process of its own (two graphs of 4 GB and their sessions)."""
    out = subprocess.run([sys.executable, "-c", SPEED_CODE, str(original), str(other), str(rounds)],
                         capture_output=True, text=True, timeout=timeout, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    import bench_memory as bm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exporters", default="ts,dynamo")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=1500.0)
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "large_decoder")
    args = ap.parse_args(argv)
    rows = []
    for exporter in args.exporters.split(","):
        with tempfile.TemporaryDirectory(prefix=f"xrl-large-{exporter}-") as tmp:
            folder = Path(tmp)
            original, limit, written = folder / "original.onnx", folder / "limit" / "limit.onnx", folder / "xrl.onnx"
            limit.parent.mkdir()
            params = export(exporter, original, args.layers, False, args.timeout)
            export(exporter, limit, args.layers, True, args.timeout)
            weights = bm.weight_bytes_of(str(original), "file")
            phases: list = []
            code, peak_rss, single, wall, tail, pss = bm.run_sampled(
                bm.optimize_cmd(str(original), written, None), env=bm.user_env(), timeout=args.timeout,
                cwd=str(folder), phases=phases)
            row = {"exporter": exporter, "params": params, "weight_bytes": weights, "exit": code, "wall_s": wall,
                   "peak_tree_pss": pss, "peak_single_rss": single, "pss_over_weights": pss / weights,
                   "single_over_weights": single / weights, "tail": tail,
                   "phases": [vars(p) for p in phases]}
            if code == 0:
                row["xrl"] = speedup(original, written, args.rounds, args.timeout)
                row["limit"] = speedup(original, limit, args.rounds, args.timeout)
                gain = row["limit"]["speedup"] - 1
                row["share_of_limit_gain"] = (row["xrl"]["speedup"] - 1) / gain if gain > 0 else None
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "large_decoder.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
