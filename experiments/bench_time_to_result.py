"""Time to a result (issue 35, item 2): `xrl optimize` with the CLI's defaults on one model, with a cold and a
warm kernel cache, each beside onnxscript's `optimize_for_ort` timed in the same run, for one or more code
trees (a `git worktree` of an earlier commit as "before", this checkout as "after").

    .venv/bin/python experiments/bench_time_to_result.py MODEL.onnx [--before /tmp/xrl-before] [--timeout 1200]
        [--out experiments/results/time_to_result.json]

Each run is a fresh process (`python -m xrl optimize MODEL -o OUT --force --json`); cold: a new, empty
XRL_CACHE_DIR; warm: the same directory again. The trees are interleaved (cold before, cold after, warm before,
warm after) so that a change in the machine's load falls on both; onnxscript's pass is timed right before each
xrl run, in its own process, as the peer's time under the same load. Wall seconds include the interpreter's start.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ONNXSCRIPT = ("import sys, time, onnx, onnxscript.ir as ir\n"
              "from onnxscript.rewriter.ort_fusions import optimize_for_ort\n"
              "t = time.perf_counter(); m = onnx.load(sys.argv[1])\n"
              "out, _ = optimize_for_ort(ir.from_proto(m)); ir.to_proto(out)\n"
              "print(time.perf_counter() - t)\n")


def env_for(tree: Path | None, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XRL_TARGET_COST", "XRL_GUARD", "XRL_NO_PREPASS")}
    env["XRL_CACHE_DIR"] = str(cache)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def timed(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, -9, ""
    return time.perf_counter() - t0, p.returncode, p.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--before", type=Path, default=None, help="a checkout of the earlier code (a git worktree)")
    ap.add_argument("--timeout", type=float, default=1200.0)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/time_to_result.json"))
    args = ap.parse_args(argv)
    trees = {"before": args.before, "after": None} if args.before else {"after": None}
    caches = {name: Path(tempfile.mkdtemp(prefix=f"xrl-time-{name}-")) for name in trees}
    rows = []
    with tempfile.TemporaryDirectory(prefix="xrl-time-out-") as out_dir:
        for cache_state in ("cold", "warm"):
            for name, tree in trees.items():
                env = env_for(tree, caches[name])
                peer_s, peer_rc, peer_out = timed([sys.executable, "-c", ONNXSCRIPT, str(args.model)], env,
                                                  args.timeout)
                peer = float(peer_out.split()[-1]) if peer_rc == 0 and peer_out.split() else None
                out = Path(out_dir) / f"{name}-{cache_state}.onnx"
                wall, rc, stdout = timed([sys.executable, "-m", "xrl", "optimize", str(args.model), "-o", str(out),
                                          "--force", "--json"], env, args.timeout)
                report = {}
                try:
                    report = json.loads(stdout) if rc == 0 else {}
                except json.JSONDecodeError:
                    pass
                row = {"tree": name, "cache": cache_state, "xrl_wall_s": round(wall, 1), "exit": rc,
                       "onnxscript_s": None if peer is None else round(peer, 2),
                       "onnxscript_process_s": round(peer_s, 1),
                       "ratio_to_onnxscript": None if not peer else round(wall / peer, 1),
                       "speedup_measured": (report.get("measured") or {}).get("speedup")
                       if isinstance(report.get("measured"), dict) else None,
                       "stages": report.get("stages") or report.get("stage_seconds")}
                rows.append(row)
                print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": str(args.model), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
