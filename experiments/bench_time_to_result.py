"""Time to a result (issue 35, item 2): `xrl optimize` with the CLI's defaults on one model, with a cold and a
warm kernel cache, each beside onnxscript's `optimize_for_ort` timed in the same run, for one or more code
trees (a `git worktree` of an earlier commit as "before", this checkout as "after").

    .venv/bin/python experiments/bench_time_to_result.py MODEL.onnx [--before /tmp/xrl-before] [--after TREE]
        [--timeout 1200] [--out experiments/results/time_to_result.json] [--md TABLE.md]

Each run is a fresh process (`python -m xrl optimize MODEL -o OUT --force --json`), started in its tree's
folder (`python -m` puts the working folder first on sys.path: started elsewhere, a "before" run would import
this checkout's xrl whatever PYTHONPATH says); cold: a new, empty XRL_CACHE_DIR; warm: the same directory
again. The trees are interleaved (cold before, cold after, warm before,
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


def timed(cmd: list[str], env: dict[str, str], timeout: float, cwd: Path | None = None) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, -9, ""
    return time.perf_counter() - t0, p.returncode, p.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--before", type=Path, default=None, help="a checkout of the earlier code (a git worktree)")
    ap.add_argument("--after", type=Path, default=None,
                    help="a checkout of the later code (default: this checkout; a worktree of a commit keeps others' "
                         "uncommitted edits of a shared tree out of the runs)")
    ap.add_argument("--timeout", type=float, default=1200.0)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/time_to_result.json"))
    ap.add_argument("--md", type=Path, default=None, help="also write the rows as a markdown table here")
    args = ap.parse_args(argv)
    args.model = args.model.resolve()  # the runs start in their tree's folder
    here = Path(__file__).resolve().parents[1]
    trees = {"before": args.before, "after": args.after} if args.before else {"after": args.after}
    caches = {name: Path(tempfile.mkdtemp(prefix=f"xrl-time-{name}-")) for name in trees}
    rows = []
    with tempfile.TemporaryDirectory(prefix="xrl-time-out-") as out_dir:
        for cache_state in ("cold", "warm"):
            for name, tree in trees.items():
                env = env_for(tree, caches[name])
                load0 = os.getloadavg()[0]
                peer_s, peer_rc, peer_out = timed([sys.executable, "-c", ONNXSCRIPT, str(args.model)], env,
                                                  args.timeout)
                peer = float(peer_out.split()[-1]) if peer_rc == 0 and peer_out.split() else None
                out = Path(out_dir) / f"{name}-{cache_state}.onnx"
                wall, rc, stdout = timed([sys.executable, "-m", "xrl", "optimize", str(args.model), "-o", str(out),
                                          "--force", "--json"], env, args.timeout, cwd=tree or here)
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
                       "stages": report.get("stages") or report.get("stage_seconds"),
                       "load_before": round(load0, 1), "load_after": round(os.getloadavg()[0], 1),
                       "guard": {k: (report.get("guard") or {}).get(k) for k in ("chosen", "rounds", "time_s",
                                                                                  "settled", "dropped")},
                       "guard_candidates": sorted((report.get("guard") or {}).get("candidates") or {}),
                       "prepasses": [(p.get("name"), p.get("applied"), p.get("detail")) for p in
                                     report.get("prepasses") or []]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": str(args.model), "rows": rows}, indent=2) + "\n")
    if args.md is not None:
        args.md.write_text(markdown(rows))
    return 0


def markdown(rows: list[dict]) -> str:
    """The rows as a table: wall, the peer's time in the same run, their ratio, the stages, the guard's rounds."""
    head = ("| tree | kernel cache | xrl s | onnxscript s | xrl / onnxscript | starts s | search s | candidates s "
            "| guard s | guard rounds | pre-pass children | written | load |\n|---|---|---:|---:|---:|---:|---:|---:"
            "|---:|---:|---:|---|---|\n")
    out = []
    for r in rows:
        st = r.get("stages") or {}
        g = r.get("guard") or {}
        ran = sum(1 for p in r.get("prepasses") or [] if "chain's own run" not in (p[2] or "")
                  and p[0] != "exact merges" and "skipped" not in (p[2] or ""))

        def sec(k: str, st: dict = st) -> str:
            return f"{st[k]:.0f}" if isinstance(st.get(k), (int, float)) else "-"

        out.append(f"| {r['tree']} | {r['cache']} | {r['xrl_wall_s']:.0f} | {r['onnxscript_s']} | "
                   f"{r['ratio_to_onnxscript']} | {sec('starts')} | {sec('search')} | {sec('candidates')} | "
                   f"{sec('guard')} | {g.get('rounds')} | {ran} | {g.get('chosen')} | "
                   f"{r['load_before']}-{r['load_after']} |")
    return head + "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
