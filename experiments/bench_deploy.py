"""Deployment benchmark (issue 10): is xrl's output faster under onnxruntime than the original and the peers?

For each model of `xrl.graphs.deploy_models` and each torch exporter (TorchScript-based and dynamo), the
variants are: the exported original; an A/A copy (a second session of the identical file: the noise floor);
onnxslim; onnx-simplifier; onnxruntime's transformers optimizer (transformer models only, opt_level 0 so
it writes its ONNX-level fusions); and `xrl optimize` (the CLI, default target). Every variant's outputs
are checked against the original's under onnxruntime on seeded inputs (rtol 1e-3, atol 1e-4).

Timing is onnxruntime with ORT_ENABLE_ALL, for one thread and for all threads, interleaved: each round runs
every variant `--runs` times, in a seeded random order, each in a session made fresh for the round (two
sessions of one file can differ by several percent for their whole lives); a variant's time in a round
is the median of its runs. Its speed-up is the per-round ratio original/variant; the table gives the
median ratio over rounds and a 95% percentile-bootstrap interval of that median (2000 seeded resamples).

    .venv/bin/python experiments/bench_deploy.py [--models bert,gpt,vit,resnet,effnet]
        [--exporters torchscript,dynamo] [--size base|tiny] [--threads 1,all] [--rounds 7] [--runs 5]
        [--seed 0] [--cache ~/.cache/xrl/deploy] [--xrl-time-limit 120] [--out experiments/results/deploy_cpu.md]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import platform
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from xrl.stats import geomean, geomean_values

VARIANTS = ("original", "A/A", "onnxslim", "onnx-simplifier", "ort-transformers", "xrl")
PEERS = VARIANTS[1:]
RTOL, ATOL = 1e-3, 1e-4
BOOTSTRAP = 2000


class UserError(Exception):
    """A bad option: one line on stderr, exit 2."""


class PeerError(RuntimeError):
    """A variant could not be made; its message is the note, without a type name."""


@dataclass
class Variant:
    name: str
    path: Path | None = None
    error: str | None = None  # why this variant has no valid model (a peer failed, or its outputs differ)
    nodes: int | None = None
    ops: str = ""  # the op histogram, "Op:count;..."
    max_abs_err: float | None = None
    extra: dict = field(default_factory=dict)  # xrl's own report (estimated speed-up, time)


@dataclass
class Timing:
    median_ms: float
    rounds_ms: list[float] = field(default_factory=list)  # the median of each round's runs
    speedup: float | None = None
    lo: float | None = None
    hi: float | None = None


@dataclass
class Result:
    model: str
    exporter: str
    variants: dict[str, Variant]
    timings: dict[str, dict[str, Timing]] = field(default_factory=dict)  # threads -> variant -> timing
    error: str | None = None  # the export itself failed


# --------------------------------------------------------------------------- variants


def one_line(exc: BaseException | str) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else ""
    name = "" if isinstance(exc, (str, PeerError)) else type(exc).__name__ + ": "
    return (name + line)[:240]


def histogram(path: Path) -> tuple[int, str]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    counts = Counter(n.op_type for n in model.graph.node)
    return sum(counts.values()), ";".join(f"{op}:{n}" for op, n in sorted(counts.items()))


@contextlib.contextmanager
def quiet():
    """Peers print progress and tables; the benchmark's stdout is the table."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def make_onnxslim(src: Path, dst: Path) -> None:
    import onnx
    import onnxslim

    with quiet():
        model = onnxslim.slim(str(src))
    onnx.save(model, str(dst))


def make_onnxsim(src: Path, dst: Path) -> None:
    import onnx
    import onnxsim

    with quiet():
        model, ok = onnxsim.simplify(onnx.load(str(src)))
    if not ok:
        raise PeerError("onnxsim's own check failed")
    onnx.save(model, str(dst))


def make_ort_transformers(src: Path, dst: Path, info) -> None:
    import logging

    from onnxruntime.transformers.optimizer import optimize_model

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    with quiet():
        model = optimize_model(str(src), model_type=info.ort_model_type, num_heads=info.num_heads,
                               hidden_size=info.hidden_size, opt_level=0, use_gpu=False)
        model.save_model_to_file(str(dst))


def xrl_binary() -> str:
    local = Path(sys.executable).parent / "xrl"
    return str(local) if local.exists() else (shutil.which("xrl") or "xrl")


def make_xrl(src: Path, dst: Path, time_limit: float, seed: int) -> dict:
    """Run `xrl optimize` as a user would; returns its JSON report (extra fields are kept, none required)."""
    cmd = [xrl_binary(), "optimize", str(src), "-o", str(dst), "--force", "--json",
           "--time-limit", str(time_limit), "--seed", str(seed)]
    try:
        proc, peak = run_with_peak(cmd, timeout=time_limit + 900)
    except subprocess.TimeoutExpired:
        raise PeerError(f"xrl optimize did not finish within {time_limit + 900:.0f} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise PeerError(f"xrl optimize exit {proc.returncode}: {lines[-1].strip() if lines else '(no message)'}")
    report = parse_json(proc.stdout)
    if report.get("verified") is False:
        raise PeerError(f"xrl optimize reports verified=false (max_abs_err {report.get('max_abs_err')})")
    if not dst.exists():
        raise PeerError("xrl optimize exited 0 but wrote no file")
    return {**report, "peak_rss": peak}


def run_with_peak(cmd: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, int]:
    """subprocess.run(cmd, capture_output=True, text=True), and the peak resident memory of its process tree
    (children included: the pre-passes run in one), summed over the tree every 50 ms."""
    import threading

    import psutil

    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, done = [0], threading.Event()

    def sample() -> None:
        root = psutil.Process(popen.pid)
        while not done.is_set():
            total = 0
            with contextlib.suppress(psutil.Error):
                for proc in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        total += proc.memory_info().rss
            peak[0] = max(peak[0], total)
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.communicate()
        raise
    finally:
        done.set()
        sampler.join()
    return subprocess.CompletedProcess(cmd, popen.returncode, out, err), peak[0]


def parse_json(text: str) -> dict:
    start = text.find("{")
    if start < 0:
        return {}
    try:
        doc, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def session(path: Path, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads  # 0: onnxruntime's default, all cores
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def run_outputs(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = session(path, 0)
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


def check(variant: Variant, reference: list[np.ndarray], feeds: dict[str, np.ndarray]) -> None:
    """Outputs against the original's; sets max_abs_err, and error when they differ."""
    try:
        outs = run_outputs(variant.path, feeds)
    except Exception as exc:  # a peer's file onnxruntime cannot load or run
        variant.error = f"onnxruntime: {one_line(exc)}"
        return
    if len(outs) != len(reference) or any(o.shape != r.shape for o, r in zip(outs, reference)):
        variant.error = "outputs differ in number or shape from the original's"
        return
    variant.max_abs_err = max(float(np.max(np.abs(o.astype(np.float64) - r))) if o.size else 0.0
                              for o, r in zip(outs, reference))
    if not all(np.allclose(o, r, rtol=RTOL, atol=ATOL) for o, r in zip(outs, reference)):
        variant.error = (f"outputs differ from the original's beyond rtol {RTOL:g} / atol {ATOL:g} "
                         f"(max abs error {variant.max_abs_err:.3g})")


def prepare(model: str, exporter: str, args, workdir: Path, bar) -> Result:
    """Export, make every variant, check its outputs. Failures are recorded, never raised."""
    from xrl.graphs import deploy_models as dm

    variants = {v: Variant(v) for v in VARIANTS}
    bar.set_description(f"{model}/{exporter}: export")
    try:
        src = dm.cached_export(model, args.size, exporter, args.cache, seed=args.seed)
    except Exception as exc:
        bar.update(len(VARIANTS))
        return Result(model, exporter, variants, error=f"{exporter} export failed: {one_line(exc)}")
    info = dm.model_info(model, args.size)
    variants["original"].path = variants["A/A"].path = src
    makers = {  # xrl first, while this process is small: it runs beside it
        "xrl": lambda dst: variants["xrl"].extra.update(make_xrl(src, dst, args.xrl_time_limit, args.seed)),
        "onnxslim": lambda dst: make_onnxslim(src, dst),
        "onnx-simplifier": lambda dst: make_onnxsim(src, dst),
        "ort-transformers": (lambda dst: make_ort_transformers(src, dst, info)) if info.ort_model_type else None,
    }
    bar.update(2)
    for name, make in makers.items():
        bar.set_description(f"{model}/{exporter}: {name}")
        var = variants[name]
        if make is None:
            var.error = "n/a"
        else:
            dst = workdir / f"{model}-{exporter}-{name}.onnx"
            started = time.perf_counter()
            try:
                make(dst)
                var.path = dst
            except Exception as exc:
                var.error = one_line(exc)
            var.extra["make_s"] = time.perf_counter() - started
        bar.update(1)
    feeds = dm.input_feeds(model, args.size, seed=args.seed)
    reference = [o.astype(np.float64) for o in run_outputs(src, feeds)]
    for var in variants.values():
        if var.path is not None:
            var.nodes, var.ops = histogram(var.path)
            if var.name != "original":
                check(var, reference, feeds)
    variants["original"].max_abs_err = 0.0
    return Result(model, exporter, variants)


# --------------------------------------------------------------------------- timing and statistics


def time_result(result: Result, threads: str, args, bar) -> dict[str, Timing]:
    from xrl.graphs import deploy_models as dm

    live = {v.name: v for v in result.variants.values() if v.path is not None and v.error is None}
    feeds = dm.input_feeds(result.model, args.size, seed=args.seed)
    rng = random.Random(f"{args.seed}-{result.model}-{result.exporter}-{threads}")
    per_round: dict[str, list[float]] = {name: [] for name in live}
    for r in range(args.rounds):
        bar.set_description(f"{result.model}/{result.exporter}: time, threads={threads}, round {r + 1}")
        order = list(live)
        rng.shuffle(order)
        for name in order:
            # A fresh session every round: two sessions of one file can differ by several percent for
            # their whole lives (memory placement), which a session kept across rounds would report as
            # a speed-up. Building it is not timed; two warm-up runs allocate and tune.
            sess, times = session(live[name].path, 1 if threads == "1" else 0), []
            for _ in range(2):
                sess.run(None, feeds)
            for _ in range(args.runs):
                t0 = time.perf_counter()
                sess.run(None, feeds)
                times.append(time.perf_counter() - t0)
            per_round[name].append(float(np.median(times)))
            del sess
        bar.update(1)
    out = {}
    for name, times in per_round.items():
        timing = Timing(median_ms=1e3 * float(np.median(times)), rounds_ms=[1e3 * t for t in times])
        if name != "original":
            timing.speedup, timing.lo, timing.hi = ratio_interval(per_round["original"], times, args.seed)
        out[name] = timing
    return out


def ratio_interval(num: list[float], den: list[float], seed: int) -> tuple[float, float, float]:
    """Median over rounds of num/den and a 95% percentile-bootstrap interval of that median."""
    ratios = np.array(num) / np.array(den)
    idx = np.random.default_rng(seed).integers(0, len(ratios), size=(BOOTSTRAP, len(ratios)))
    lo, hi = np.percentile(np.median(ratios[idx], axis=1), [2.5, 97.5])
    return float(np.median(ratios)), float(lo), float(hi)


def versus_best_peer(res: Result, threads: str, seed: int) -> str:
    """xrl against the fastest peer that matched the original (per round: peer time / xrl time)."""
    timings = res.timings.get(threads, {})
    xrl = timings.get("xrl")
    peers = [p for p in ("onnxslim", "onnx-simplifier", "ort-transformers")
             if p in timings and timings[p].speedup is not None]
    if xrl is None or not peers:
        return "—"
    best = max(peers, key=lambda p: timings[p].speedup)
    ratio, lo, hi = ratio_interval(timings[best].rounds_ms, xrl.rounds_ms, seed)
    return f"{ratio:.3f} [{lo:.3f}, {hi:.3f}] vs {best}"


def verdict(xrl: Timing | None, aa: Timing | None) -> str:
    """xrl against the noise band: the A/A interval widened to include 1."""
    if xrl is None or xrl.lo is None or aa is None or aa.lo is None:
        return "—"
    lo, hi = min(aa.lo, 1.0), max(aa.hi, 1.0)
    if xrl.lo > hi:
        return "faster"
    if xrl.hi < lo:
        return "slower"
    return "within noise"


# --------------------------------------------------------------------------- reporting


def cell(result: Result, threads: str, name: str) -> str:
    var = result.variants[name]
    if var.error == "n/a":
        return "—"
    if var.error is not None:
        return "FAILED"
    t = result.timings.get(threads, {}).get(name)
    if t is None or t.speedup is None:
        return ""
    return f"{t.speedup:.3f} [{t.lo:.3f}, {t.hi:.3f}]"


def geomean_cell(values: list[float]) -> str:
    """The geomean (xrl.stats's policy) and how many values it is over."""
    kept = geomean_values(values)
    return f"{geomean(kept):.3f} (n={len(kept)})" if kept else "—"


def markdown(results: list[Result], args, threads_list: list[str], elapsed_s: float) -> str:
    import onnxruntime
    import torch
    from xrl.graphs import deploy_models as dm

    lines = [
        "# Deployment benchmark: onnxruntime on this CPU",
        "",
        f"Command: `.venv/bin/python experiments/bench_deploy.py {' '.join(shlex.quote(a) for a in args.argv)}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} logical cores ({platform.processor() or 'cpu'}), shared with "
        f"other jobs; torch {torch.__version__}, onnxruntime {onnxruntime.__version__}. Size `{args.size}`, batch 1, "
        f"static shapes. {args.rounds} interleaved rounds x {args.runs} runs per variant, seed {args.seed}; "
        f"wall time {elapsed_s / 60:.1f} min.",
        "",
        "Cells: speed-up over the original (original time / variant time, median over rounds) and its 95% "
        "percentile-bootstrap interval over rounds. `A/A` is a second session of the identical file: its "
        "interval is the noise floor. FAILED: see the notes. `xrl est.` is the speed-up `xrl optimize` reported. "
        "Verdict: xrl's interval against the A/A interval widened to include 1. `xrl vs best peer`: per-round "
        "time of the fastest peer (by median speed-up) over xrl's time (above 1: xrl is faster), same interval.",
        "",
        "| model | exporter | threads | original ms | " + " | ".join(PEERS)
        + " | xrl est. | xrl verdict | xrl vs best peer |",
        "|---|---|---|---:|" + "---:|" * len(PEERS) + "---:|---|---:|",
    ]
    for threads in threads_list:
        for res in results:
            if res.error is not None:
                continue
            timings = res.timings.get(threads, {})
            orig = timings.get("original")
            est = res.variants["xrl"].extra.get("speedup")
            est_s = f"{est:.3f}" if isinstance(est, (int, float)) and res.variants["xrl"].error is None else ""
            lines.append(
                f"| {res.model} | {res.exporter} | {threads} | {orig.median_ms:.2f} | " if orig else
                f"| {res.model} | {res.exporter} | {threads} | | ")
            lines[-1] += " | ".join(cell(res, threads, p) for p in PEERS)
            lines[-1] += f" | {est_s} | {verdict(timings.get('xrl'), timings.get('A/A'))} | "
            lines[-1] += f"{versus_best_peer(res, threads, args.seed)} |"
        for label, keep in (("transformers", dm.TRANSFORMERS), ("all models", dm.MODELS)):
            gm = []
            for p in PEERS:
                vals = [r.timings[threads][p].speedup for r in results
                        if r.error is None and r.model in keep and threads in r.timings and p in r.timings[threads]
                        and r.timings[threads][p].speedup is not None]
                gm.append(geomean_cell(vals))
            lines.append(f"| **geomean, {label}** | | {threads} | | " + " | ".join(gm) + " | | | |")
    lines += ["", "Node counts of the written files, and the peak resident memory of `xrl optimize` (its process "
              "tree, sampled every 50 ms):", "",
              "| model | exporter | " + " | ".join(v for v in VARIANTS if v != "A/A") + " | xrl peak memory GiB |",
              "|---|---|" + "---:|" * len(VARIANTS)]
    for res in results:
        if res.error is None:
            counts = [res.variants[v] for v in VARIANTS if v != "A/A"]
            peak = res.variants["xrl"].extra.get("peak_rss")
            lines.append(f"| {res.model} | {res.exporter} | "
                         + " | ".join("" if v.nodes is None else str(v.nodes) for v in counts)
                         + (f" | {peak / 2 ** 30:.2f} |" if peak else " | |"))
    notes = []
    for res in results:
        if res.error is not None:
            notes.append(f"{res.model}/{res.exporter}: {res.error} (variant skipped)")
            continue
        for var in res.variants.values():
            if var.error is not None and var.error != "n/a":
                notes.append(f"{res.model}/{res.exporter}: {var.name} FAILED: {var.error}")
    lines += ["", "Notes:", ""] + ([f"- {n}" for n in notes] or ["- none: every variant ran and matched the original"])
    return "\n".join(lines) + "\n"


CSV_FIELDS = ("model", "exporter", "threads", "variant", "status", "error", "max_abs_err", "nodes", "median_ms",
              "speedup", "ci_lo", "ci_hi", "xrl_estimated_speedup", "make_s", "rounds_ms", "ops")


def csv_rows(results: list[Result], threads_list: list[str]) -> list[dict]:
    rows = []
    for res in results:
        for threads in threads_list:
            for var in res.variants.values():
                t = res.timings.get(threads, {}).get(var.name)
                status = "export failed" if res.error else ("n/a" if var.error == "n/a" else
                                                            "FAILED" if var.error else "ok")
                rows.append({
                    "model": res.model, "exporter": res.exporter, "threads": threads, "variant": var.name,
                    "status": status, "error": res.error or (var.error if var.error != "n/a" else ""),
                    "max_abs_err": "" if var.max_abs_err is None else f"{var.max_abs_err:.3g}",
                    "nodes": "" if var.nodes is None else var.nodes,
                    "median_ms": f"{t.median_ms:.3f}" if t else "",
                    "speedup": f"{t.speedup:.4f}" if t and t.speedup is not None else "",
                    "ci_lo": f"{t.lo:.4f}" if t and t.lo is not None else "",
                    "ci_hi": f"{t.hi:.4f}" if t and t.hi is not None else "",
                    "xrl_estimated_speedup": var.extra.get("speedup", "") if var.name == "xrl" else "",
                    "make_s": f"{var.extra['make_s']:.1f}" if "make_s" in var.extra else "",
                    "rounds_ms": ";".join(f"{x:.3f}" for x in t.rounds_ms) if t else "",
                    "ops": var.ops,
                })
    return rows


def write(results: list[Result], args, threads_list: list[str], elapsed_s: float) -> str:
    text = markdown(results, args, threads_list, elapsed_s)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        with open(args.out.with_suffix(".csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            writer.writeheader()
            writer.writerows(csv_rows(results, threads_list))
    return text


# --------------------------------------------------------------------------- command line


def parse_args(argv: list[str]) -> argparse.Namespace:
    from xrl.graphs import deploy_models as dm

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(dm.MODELS))
    p.add_argument("--exporters", default="torchscript,dynamo")
    p.add_argument("--size", default="base")
    p.add_argument("--threads", default="1,all")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache", type=Path, default=Path("~/.cache/xrl/deploy"))
    p.add_argument("--xrl-time-limit", type=float, default=120.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    args.argv = argv
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.exporters = [e.strip() for e in args.exporters.split(",") if e.strip()]
    args.threads = [t.strip() for t in args.threads.split(",") if t.strip()]
    for kind, given, allowed in (("model", args.models, dm.MODELS), ("exporter", args.exporters, dm.EXPORTERS),
                                 ("threads", args.threads, ("1", "all")), ("size", [args.size], dm.SIZES)):
        bad = [g for g in given if g not in allowed]
        if bad or not given:
            raise UserError(f"unknown {kind} {', '.join(bad) or '(none)'}; choose from {', '.join(allowed)}")
    if args.rounds < 2 or args.runs < 1:
        raise UserError("--rounds must be at least 2 and --runs at least 1")
    args.cache = args.cache.expanduser()
    return args


class QueueBar:
    """The progress bar of a child process: forwards to the parent's tqdm."""

    def __init__(self, queue) -> None:
        self.queue = queue

    def update(self, n: int) -> None:
        self.queue.put(("update", n))

    def set_description(self, text: str) -> None:
        self.queue.put(("desc", text))


def run_combo(model: str, exporter: str, args, workdir: Path, bar) -> Result:
    """Make, check and time every variant of one exported model."""
    res = prepare(model, exporter, args, workdir, bar)
    for threads in args.threads:
        if res.error is None:
            res.timings[threads] = time_result(res, threads, args, bar)
        else:
            bar.update(args.rounds)
    for var in res.variants.values():  # the next model's files need the disk
        if var.path is not None and var.path.parent == workdir:
            var.path.unlink(missing_ok=True)
    return res


def _child(model: str, exporter: str, args, workdir: Path, queue) -> None:
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    try:
        queue.put(("done", run_combo(model, exporter, args, workdir, QueueBar(queue))))
    except Exception as exc:  # a bug here must still leave a row, and the other models must still run
        queue.put(("done", Result(model, exporter, {v: Variant(v) for v in VARIANTS},
                                  error=f"benchmark failed: {one_line(exc)}")))


def run_isolated(model: str, exporter: str, args, workdir: Path, bar) -> Result:
    """One model in a fresh process: its memory (GBs at base size) goes back, and an OOM kill is a row."""
    import multiprocessing as mp
    import queue as queue_mod

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_child, args=(model, exporter, args, workdir, q), daemon=True)
    proc.start()
    while True:
        try:
            kind, payload = q.get(timeout=2.0)
        except queue_mod.Empty:
            if proc.is_alive():
                continue
            proc.join()
            why = "killed, probably out of memory" if proc.exitcode in (-9, 137) else "crashed"
            return Result(model, exporter, {v: Variant(v) for v in VARIANTS},
                          error=f"benchmark process {why} (exit code {proc.exitcode})")
        if kind == "update":
            bar.update(payload)
        elif kind == "desc":
            bar.set_description(payload)
        else:
            proc.join()
            return payload


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    combos = [(m, e) for m in args.models for e in args.exporters]
    started = time.perf_counter()
    results: list[Result] = []
    total = len(combos) * (len(VARIANTS) + len(args.threads) * args.rounds)
    with tempfile.TemporaryDirectory(prefix="bench_deploy-") as tmp, \
            tqdm(total=total, file=sys.stderr, dynamic_ncols=True) as bar:
        for model, exporter in combos:
            results.append(run_isolated(model, exporter, args, Path(tmp), bar))
            write(results, args, args.threads, time.perf_counter() - started)  # partial results survive a kill
    print(write(results, args, args.threads, time.perf_counter() - started), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
