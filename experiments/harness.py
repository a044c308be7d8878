"""The one benchmark harness (issue 33): is xrl's output faster under onnxruntime than the original, the
peers and, where a family has one, its limit? Driven by experiments/bench_models.py (and the two old
entry points bench_deploy.py and bench_families.py, which only set its defaults).

Models are members of `xrl.graphs.families` (LoRA, structural re-parameterisation, LLaMA, attention and
the deployment models `deploy`: bert, gpt, vit, resnet, effnet), each exported by both torch exporters
("ts": TorchScript-based, "dynamo"). The variants of one export: the original; an A/A copy (a second
session of the identical file: the noise floor); the peers onnxslim, onnx-simplifier, onnxruntime's
transformers optimizer (transformer members only, opt_level 0 so it writes its ONNX-level fusions) and
onnxscript's `optimize_for_ort`; xrl (`xrl optimize` as a user runs it, default target, once per timed
thread count with `--threads`: its kernel costs and guard time the count its file is timed at; the peak
memory of its process tree is recorded); and the limit (the same network merged / re-parameterised in
torch and exported the same way; the deployment models have none, and a table without limits has no
limit columns). Every variant's outputs are checked against the original's under onnxruntime on seeded
inputs (rtol 1e-3, atol 1e-4 x the outputs' scale).

Timing: onnxruntime CPU, ORT_ENABLE_ALL, one thread and/or all threads; interleaved rounds, each running
every variant `--runs` times (and for at least `--min-ms`) in a seeded random order, in a session made
fresh for the round (two sessions of one file can differ by several percent for their whole lives); a
variant's round time is the median of its runs; its speed-up is the median over rounds of
original/variant with a 95% percentile-bootstrap interval (2000 seeded resamples). Each export runs in a
process of its own (its memory goes back; an OOM kill is a row, not a crash).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import logging
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

VARIANTS = ("original", "A/A", "onnxslim", "onnx-simplifier", "ort-transformers", "onnxscript-ort", "xrl", "limit")
PEERS = VARIANTS[1:]  # the table's speed-up columns
PEER_TOOLS = ("onnxslim", "onnx-simplifier", "ort-transformers", "onnxscript-ort")
RTOL, ATOL = 1e-3, 1e-4
BOOTSTRAP = 2000
NO_LIMIT = "none"  # families.limit_kind of a member without a limit


class UserError(Exception):
    """A bad option: one line on stderr, exit 2."""


class PeerError(RuntimeError):
    """A variant could not be made; its message is the note, without a type name."""


@dataclass
class Variant:
    name: str
    path: Path | None = None
    error: str | None = None  # why this variant has no valid model ("n/a": it does not apply)
    nodes: int | None = None
    ops: str = ""  # the op histogram, "Op:count;..."
    max_abs_err: float | None = None
    extra: dict = field(default_factory=dict)  # xrl's report, a peer's fusions, the time it took


@dataclass
class Timing:
    median_ms: float
    rounds_ms: list[float] = field(default_factory=list)  # the median of each round's runs
    speedup: float | None = None
    lo: float | None = None
    hi: float | None = None


@dataclass
class Result:
    member: str
    exporter: str
    variants: dict[str, Variant]
    timings: dict[str, dict[str, Timing]] = field(default_factory=dict)  # threads -> variant -> timing
    error: str | None = None  # the export itself failed
    limit_kind: str = ""
    kind: str = ""  # "transformer" | "cnn"
    # xrl optimises for the thread count it will run with: its file for each thread count after the first
    # (that one is variants["xrl"])
    xrl_at: dict[str, Variant] = field(default_factory=dict)

    def xrl(self, threads: str) -> Variant:
        """xrl's file made for `threads`."""
        return self.xrl_at.get(threads, self.variants["xrl"])

    @property
    def has_limit(self) -> bool:
        return self.limit_kind not in ("", NO_LIMIT)


def failed(member: str, exporter: str, error: str) -> Result:
    return Result(member, exporter, {v: Variant(v) for v in VARIANTS}, error=error)


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


def make_ort_transformers(src: Path, dst: Path, model_type: str, heads: int, hidden: int) -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    with quiet():
        model = optimize_model(str(src), model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0,
                               use_gpu=False)
        model.save_model_to_file(str(dst))


def make_onnxscript_ort(src: Path, dst: Path) -> dict:
    """onnxscript's fusions into onnxruntime's contrib ops (RMSNorm, rotary, attention, ...)."""
    import onnxscript.ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    with quiet():
        model = ir.load(str(src))
        model, stats = optimize_for_ort(model)
        ir.save(model, str(dst))
    return {"fusions": {k: v for k, v in stats.items() if v}}


def xrl_binary() -> str:
    local = Path(sys.executable).parent / "xrl"
    return str(local) if local.exists() else (shutil.which("xrl") or "xrl")


def make_xrl(src: Path, dst: Path, time_limit: float, seed: int, threads: str) -> dict:
    """Run `xrl optimize --threads N|all` as a user would, for the thread count the file will be timed at;
    returns the fields of its JSON report kept here and the peak memory of its process tree."""
    cmd = [xrl_binary(), "optimize", str(src), "-o", str(dst), "--force", "--json", "--time-limit", str(time_limit),
           "--seed", str(seed), "--threads", threads]
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
    rules = Counter(str(s).split("@")[0] for s in report.get("steps") or [])
    return {"speedup": report.get("speedup"), "rewrites": report.get("rewrites"), "time_s": report.get("time_s"),
            "rules": dict(rules), "peak_rss": peak,
            "prepasses": [p.get("name") for p in report.get("prepasses") or [] if p.get("applied")],
            "wrote": (report.get("guard") or {}).get("chosen", "search")}


def run_with_peak(cmd: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, int]:
    """subprocess.run(cmd, capture_output=True, text=True), and the peak resident memory of its process tree
    (children included: the pre-passes run in one), summed over the tree every 50 ms."""
    import threading

    import psutil

    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, done = [0], threading.Event()

    def sample() -> None:
        try:
            root = psutil.Process(popen.pid)
        except psutil.Error:  # it has already exited
            return
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


def its_feeds(sess, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds a session takes (a peer may drop an unused input)."""
    names = {i.name for i in sess.get_inputs()}
    return {k: v for k, v in feeds.items() if k in names}


def run_outputs(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = session(path, 0)
    return sess.run(None, its_feeds(sess, feeds))


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
    scale = max(1.0, max(float(np.max(np.abs(r))) if r.size else 0.0 for r in reference))
    if not all(np.allclose(o, r, rtol=RTOL, atol=ATOL * scale) for o, r in zip(outs, reference)):
        variant.error = (f"outputs differ from the original's beyond rtol {RTOL:g} / atol {ATOL:g} x scale "
                         f"(max abs error {variant.max_abs_err:.3g})")


def prepare(member: str, exporter: str, args, workdir: Path, bar) -> Result:
    """Export, make every variant, check its outputs. Failures are recorded, never raised."""
    from xrl.graphs import families

    variants = {v: Variant(v) for v in VARIANTS}
    bar.set_description(f"{member}/{exporter}: export")
    kind = families.limit_kind(member)
    try:
        src = families.cached_export(member, args.size, exporter, args.cache, seed=args.seed)
        lim = None if kind == NO_LIMIT else \
            families.cached_export(member, args.size, exporter, args.cache, seed=args.seed, limit=True)
    except Exception as exc:
        bar.update(len(VARIANTS) + len(args.threads) - 1)
        return failed(member, exporter, f"{exporter} export failed: {one_line(exc)}")
    res = Result(member, exporter, variants, limit_kind=kind, kind=families.KINDS[member])
    variants["original"].path = variants["A/A"].path = src
    if lim is None:
        variants["limit"].error = "n/a"
    variants["limit"].path = lim
    model_type, heads, hidden = families.model_info(member, args.size)
    res.xrl_at = {t: Variant("xrl") for t in args.threads[1:]}

    def xrl_maker(var: Variant, threads: str):
        return lambda dst: var.extra.update(make_xrl(src, dst, args.xrl_time_limit, args.seed, threads))

    makers = {  # xrl first, while this process is small: it runs beside it
        "xrl": xrl_maker(variants["xrl"], args.threads[0]),
        **{f"xrl@{t}": xrl_maker(var, t) for t, var in res.xrl_at.items()},
        "onnxslim": lambda dst: make_onnxslim(src, dst),
        "onnx-simplifier": lambda dst: make_onnxsim(src, dst),
        "ort-transformers": (lambda dst: make_ort_transformers(src, dst, model_type, heads, hidden))
        if model_type else None,
        "onnxscript-ort": lambda dst: variants["onnxscript-ort"].extra.update(make_onnxscript_ort(src, dst)),
    }
    bar.update(3)
    for name, make in makers.items():
        bar.set_description(f"{member}/{exporter}: {name}")
        var = res.xrl_at[name[4:]] if name.startswith("xrl@") else variants[name]
        if make is None:
            var.error = "n/a"
        else:
            dst = workdir / f"{member}-{exporter}-{name}.onnx"
            started = time.perf_counter()
            try:
                make(dst)
                var.path = dst
            except Exception as exc:
                var.error = one_line(exc)
            var.extra["make_s"] = time.perf_counter() - started
        bar.update(1)
    feeds = families.input_feeds(member, args.size, seed=args.seed)
    reference = [o.astype(np.float64) for o in run_outputs(src, feeds)]
    for var in [*variants.values(), *res.xrl_at.values()]:
        if var.path is not None:
            var.nodes, var.ops = histogram(var.path)
            if var.name != "original":
                check(var, reference, feeds)
    variants["original"].max_abs_err = 0.0
    return res


# --------------------------------------------------------------------------- timing and statistics


def time_result(result: Result, threads: str, args, bar) -> dict[str, Timing]:
    from xrl.graphs import families

    variants = {**result.variants, "xrl": result.xrl(threads)}  # xrl's file for this thread count
    live = {v.name: v for v in variants.values() if v.path is not None and v.error is None}
    feeds = families.input_feeds(result.member, args.size, seed=args.seed)
    rng = random.Random(f"{args.seed}-{result.member}-{result.exporter}-{threads}")
    per_round: dict[str, list[float]] = {name: [] for name in live}
    for r in range(args.rounds):
        bar.set_description(f"{result.member}/{result.exporter}: time, threads={threads}, round {r + 1}")
        order = list(live)
        rng.shuffle(order)
        for name in order:
            # A fresh session every round: two sessions of one file can differ by several percent for
            # their whole lives (memory placement), which a session kept across rounds would report as
            # a speed-up. Building it is not timed; two warm-up runs allocate and tune.
            sess, times = session(live[name].path, 1 if threads == "1" else 0), []
            f = its_feeds(sess, feeds)
            for _ in range(2):
                sess.run(None, f)
            spent = 0.0
            while len(times) < args.runs or spent < args.min_ms / 1e3:  # small models: enough runs to time
                t0 = time.perf_counter()
                sess.run(None, f)
                times.append(time.perf_counter() - t0)
                spent += times[-1]
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


def share_of_limit(timings: dict[str, Timing]) -> str:
    """xrl's gain as a share of the limit's: (xrl - 1) / (limit - 1), where the limit gains beyond its noise."""
    xrl, limit = timings.get("xrl"), timings.get("limit")
    if xrl is None or limit is None or xrl.speedup is None or limit.speedup is None or limit.lo is None:
        return "—"
    if limit.lo <= 1.0:
        return "(limit within noise)"
    return f"{(xrl.speedup - 1) / (limit.speedup - 1):.0%}"


def versus_best_peer(res: Result, threads: str, seed: int) -> str:
    """xrl against the fastest peer that matched the original (per round: peer time / xrl time)."""
    timings = res.timings.get(threads, {})
    xrl = timings.get("xrl")
    peers = [p for p in PEER_TOOLS if p in timings and timings[p].speedup is not None]
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
    var = result.xrl(threads) if name == "xrl" else result.variants[name]
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


def markdown(results: list[Result], args, elapsed_s: float) -> str:
    import onnxruntime
    import torch

    ok = [r for r in results if r.error is None]
    limits = any(r.has_limit for r in ok) or (not ok and args.limits)
    cols = [p for p in PEERS if limits or p != "limit"]
    title = "Deployment families" if limits else "Deployment benchmark"
    lines = [
        f"# {title}: onnxruntime on this CPU",
        "",
        f"Command: `.venv/bin/python experiments/{args.prog} {' '.join(shlex.quote(a) for a in args.argv)}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} logical cores ({platform.processor() or 'cpu'}), shared with "
        f"other jobs; torch {torch.__version__}, onnxruntime {onnxruntime.__version__}. Size `{args.size}`, batch 1, "
        f"static shapes. {args.rounds} interleaved rounds x {args.runs} runs (at least {args.min_ms:g} ms) per "
        f"variant, a fresh session per variant per round, seed {args.seed}; wall time {elapsed_s / 60:.1f} min.",
        "",
        "Cells: speed-up over the original (original time / variant time, median over rounds) and its 95% "
        "percentile-bootstrap interval over rounds. `A/A`: a second session of the identical file (the noise "
        "floor). `xrl`: `xrl optimize --threads N|all` for the thread count of the row. "
        + ("`limit`: the network merged / re-parameterised in torch and exported the same way (`exact`), or the "
           "plain export where no exact merge exists (`plain`); `none`: the member has no limit. `xrl/limit`: "
           "xrl's gain as a share of the limit's. " if limits else "")
        + "`xrl est.`: the speed-up xrl estimated. Verdict: xrl's interval against the A/A interval widened to "
        "include 1. `xrl vs best peer`: per-round time of the fastest peer (by median speed-up) over xrl's (above "
        "1: xrl is faster), same interval. FAILED: see the notes.",
        "",
        "| member | exporter | threads | original ms | " + " | ".join(cols)
        + (" | limit kind" if limits else "") + " | xrl est. | xrl verdict" + (" | xrl/limit" if limits else "")
        + " | xrl vs best peer |",
        "|---|---|---|---:|" + "---:|" * len(cols) + ("---|" if limits else "") + "---:|---|"
        + ("---:|" if limits else "") + "---:|",
    ]
    for threads in args.threads:
        for res in ok:
            timings = res.timings.get(threads, {})
            orig = timings.get("original")
            xrl = res.xrl(threads)
            est = xrl.extra.get("speedup")
            est_s = f"{est:.3f}" if isinstance(est, (int, float)) and xrl.error is None else ""
            row = f"| {res.member} | {res.exporter} | {threads} | " + (f"{orig.median_ms:.2f} | " if orig else " | ")
            row += " | ".join(cell(res, threads, p) for p in cols)
            row += (f" | {res.limit_kind}" if limits else "") + f" | {est_s} | "
            row += verdict(timings.get("xrl"), timings.get("A/A"))
            row += (f" | {share_of_limit(timings) if res.has_limit else '—'}" if limits else "")
            row += f" | {versus_best_peer(res, threads, args.seed)} |"
            lines.append(row)
        for label, keep in (("transformers", ("transformer",)), ("all", ("transformer", "cnn"))):
            if not any(r.kind in keep for r in ok):
                continue
            gm = []
            for p in cols:
                vals = [r.timings[threads][p].speedup for r in ok if r.kind in keep and threads in r.timings
                        and p in r.timings[threads] and r.timings[threads][p].speedup is not None]
                gm.append(geomean_cell(vals))
            lines.append(f"| **geomean, {label}** | | {threads} | | " + " | ".join(gm) + " |"
                         + (" |" if limits else "") + " | |" + (" |" if limits else "") + " |")
    shown = [v for v in VARIANTS if v != "A/A" and (limits or v != "limit")]
    lines += ["", "Node counts of the files, what xrl did, and the peak resident memory of `xrl optimize` (its "
              "process tree, sampled every 50 ms; the first thread count's run):", "",
              "| member | exporter | " + " | ".join(shown) + " | xrl pre-passes | xrl rules (count) | onnxscript "
              "fusions | xrl wrote (threads: the guard's choice) | xrl peak memory GiB |",
              "|---|---|" + "---:|" * len(shown) + "---|---|---|---|---:|"]
    for res in ok:
        x = res.variants["xrl"].extra
        rules = ", ".join(f"{k} {v}" for k, v in x.get("rules", {}).items()) or "none"
        fusions = ", ".join(f"{k} {v}" for k, v in res.variants["onnxscript-ort"].extra.get("fusions", {}).items())
        wrote = "; ".join(f"{t}: {res.xrl(t).extra.get('wrote', '?')} ({res.xrl(t).nodes} nodes)" for t in args.threads)
        peak = x.get("peak_rss")
        lines.append(f"| {res.member} | {res.exporter} | "
                     + " | ".join("" if res.variants[v].nodes is None else str(res.variants[v].nodes) for v in shown)
                     + f" | {', '.join(x.get('prepasses', [])) or 'none'} | {rules} | {fusions or 'none'} | {wrote} | "
                     + (f"{peak / 2 ** 30:.2f} |" if peak else " |"))
    if limits:
        lines += ["", "Limits against the originals (max abs error under onnxruntime, seeded inputs):", ""]
        for res in ok:
            lim = res.variants["limit"]
            if res.has_limit:
                err = "" if lim.max_abs_err is None else f"{lim.max_abs_err:.2g}"
                lines.append(f"- {res.member}/{res.exporter}: {res.limit_kind}, max abs error {err}"
                             + (f" (FAILED: {lim.error})" if lim.error else ""))
            else:
                lines.append(f"- {res.member}/{res.exporter}: none (a reference model, no limit)")
    notes = []
    for res in results:
        if res.error is not None:
            notes.append(f"{res.member}/{res.exporter}: {res.error} (variants skipped)")
            continue
        for var in [*res.variants.values(), *res.xrl_at.values()]:
            if var.error is not None and var.error != "n/a":
                notes.append(f"{res.member}/{res.exporter}: {var.name} FAILED: {var.error}")
    lines += ["", "Notes:", ""] + ([f"- {n}" for n in notes] or ["- none: every variant ran and matched the original"])
    return "\n".join(lines) + "\n"


CSV_FIELDS = ("member", "exporter", "threads", "variant", "status", "error", "max_abs_err", "nodes", "median_ms",
              "speedup", "ci_lo", "ci_hi", "xrl_estimated_speedup", "make_s", "rounds_ms", "ops")


def csv_rows(results: list[Result], threads_list: list[str]) -> list[dict]:
    rows = []
    for res in results:
        for threads in threads_list:
            for var in {**res.variants, "xrl": res.xrl(threads)}.values():
                t = res.timings.get(threads, {}).get(var.name)
                status = "export failed" if res.error else ("n/a" if var.error == "n/a" else
                                                            "FAILED" if var.error else "ok")
                rows.append({
                    "member": res.member, "exporter": res.exporter, "threads": threads, "variant": var.name,
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


def write(results: list[Result], args, elapsed_s: float) -> str:
    text = markdown(results, args, elapsed_s)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        with open(args.out.with_suffix(".csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            writer.writeheader()
            writer.writerows(csv_rows(results, args.threads))
    return text


# --------------------------------------------------------------------------- command line


def parse_args(argv: list[str], prog: str = "bench_models.py", families_default: str | None = None,
               size_default: str = "small") -> argparse.Namespace:
    """The one command line; the old entry points change only its defaults (and `--models` is `--families`)."""
    from xrl.graphs import families

    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--families", "--models", dest="families",
                   default=families_default or ",".join(families.LIMIT_FAMILIES),
                   help=f"families ({', '.join(families.FAMILIES)}) and/or members (lora_encoder, bert, ...)")
    p.add_argument("--exporters", default="ts,dynamo", help="ts and/or dynamo (torchscript: ts)")
    p.add_argument("--size", default=size_default,
                   help="; ".join(f"{f}: {'/'.join(s)}" for f, s in families.FAMILY_SIZES.items()))
    p.add_argument("--threads", default="1,all")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--min-ms", type=float, default=50.0,
                   help="each session runs at least --runs times and at least this long (ms)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache", type=Path, default=Path("~/.cache/xrl/families"))
    p.add_argument("--xrl-time-limit", type=float, default=120.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    args.argv, args.prog = argv, prog
    members: list[str] = []
    for item in (s.strip() for s in args.families.split(",") if s.strip()):
        if item in families.FAMILIES:
            members += families.members(families=(item,))
        elif item in families.MEMBERS:
            members.append(item)
        else:
            raise UserError(f"unknown family or member {item!r}; choose from "
                            f"{', '.join(families.FAMILIES)}, {', '.join(families.MEMBERS)}")
    args.members = list(dict.fromkeys(members))
    if not args.members:
        raise UserError("no members given")
    given = [e.strip() for e in args.exporters.split(",") if e.strip()]
    args.exporters = list(dict.fromkeys(families.EXPORTER_ALIASES.get(e, e) for e in given))
    args.threads = [t.strip() for t in args.threads.split(",") if t.strip()]
    for kind, values, allowed in (("exporter", args.exporters, families.EXPORTERS),
                                  ("threads", args.threads, ("1", "all"))):
        bad = [g for g in values if g not in allowed]
        if bad or not values:
            raise UserError(f"unknown {kind} {', '.join(bad) or '(none)'}; choose from {', '.join(allowed)}")
    no_size = [m for m in args.members if args.size not in families.FAMILY_SIZES[families.MEMBERS[m]]]
    if no_size:
        fams = dict.fromkeys(families.MEMBERS[m] for m in no_size)
        raise UserError(f"size {args.size!r} is not a size of " + "; ".join(
            f"{f} (sizes {', '.join(families.FAMILY_SIZES[f])})" for f in fams))
    if args.rounds < 2 or args.runs < 1:
        raise UserError("--rounds must be at least 2 and --runs at least 1")
    args.limits = any(families.MEMBERS[m] in families.LIMIT_FAMILIES for m in args.members)
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


def run_combo(member: str, exporter: str, args, workdir: Path, bar) -> Result:
    """Make, check and time every variant of one exported member."""
    res = prepare(member, exporter, args, workdir, bar)
    for threads in args.threads:
        if res.error is None:
            res.timings[threads] = time_result(res, threads, args, bar)
        else:
            bar.update(args.rounds)
    for var in [*res.variants.values(), *res.xrl_at.values()]:  # the next member's files need the disk
        if var.path is not None and var.path.parent == workdir:
            var.path.unlink(missing_ok=True)
    return res


def _child(member: str, exporter: str, args, workdir: Path, queue) -> None:
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    try:
        queue.put(("done", run_combo(member, exporter, args, workdir, QueueBar(queue))))
    except Exception as exc:  # a bug here must still leave a row, and the other members must still run
        queue.put(("done", failed(member, exporter, f"benchmark failed: {one_line(exc)}")))


def run_isolated(member: str, exporter: str, args, workdir: Path, bar) -> Result:
    """One export in a fresh process: its memory (GBs at base size) goes back, and an OOM kill is a row."""
    import multiprocessing as mp
    import queue as queue_mod

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    # not a daemon: a daemon may not start processes of its own
    proc = ctx.Process(target=_child, args=(member, exporter, args, workdir, q), daemon=False)
    proc.start()
    while True:
        try:
            kind, payload = q.get(timeout=2.0)
        except queue_mod.Empty:
            if proc.is_alive():
                continue
            proc.join()
            why = "killed, probably out of memory" if proc.exitcode in (-9, 137) else "crashed"
            return failed(member, exporter, f"benchmark process {why} (exit code {proc.exitcode})")
        if kind == "update":
            bar.update(payload)
        elif kind == "desc":
            bar.set_description(payload)
        else:
            proc.join()
            return payload


def main(argv: list[str] | None = None, prog: str = "bench_models.py", families: str | None = None,
         size: str = "small") -> int:
    from tqdm import tqdm

    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv, prog, families, size)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    combos = [(m, e) for m in args.members for e in args.exporters]
    started = time.perf_counter()
    results: list[Result] = []
    # per export: each variant made (xrl once per thread count) and each round of each thread count
    total = len(combos) * (len(VARIANTS) + len(args.threads) - 1 + len(args.threads) * args.rounds)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp, \
            tqdm(total=total, file=sys.stderr, dynamic_ncols=True) as bar:
        for member, exporter in combos:
            results.append(run_isolated(member, exporter, args, Path(tmp), bar))
            write(results, args, time.perf_counter() - started)  # partial results survive a kill
    print(write(results, args, time.perf_counter() - started), end="")
    return 0
