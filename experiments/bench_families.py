"""Deployment families benchmark (issue 23): how much of the exact-rewriting limit does xrl reach?

For each member of `xrl.graphs.families` (LoRA, structural re-parameterisation, LLaMA, attention) and each
torch exporter (TorchScript "ts", dynamo), the variants are: the exported original; an A/A copy (a second
session of the identical file: the noise floor); the peers onnxslim, onnx-simplifier, onnxruntime's
transformers optimizer (transformer members only, opt_level 0) and onnxscript's `optimize_for_ort`; xrl
(`xrl.api.optimize`, the default target, pre-passes and search, run once per thread count, `threads=` as
`xrl optimize --threads`: its kernel costs and guard time the count its file is timed at); and the limit
(the same network merged / re-parameterised in torch and exported the same way:
`families.build_onnx(..., limit=True)`). Every
variant's outputs are checked against the original's under onnxruntime (rtol 1e-3, atol 1e-4 x scale).

Timing as experiments/bench_deploy.py: onnxruntime CPU, ORT_ENABLE_ALL, one thread and all threads;
interleaved rounds, each running every variant `--runs` times (and for at least `--min-ms`) in a seeded
random order in a session made fresh for the round; a variant's round time is the median of its runs;
its speed-up is the median over rounds of original/variant with a 95% percentile-bootstrap interval
(2000 seeded resamples). Each member runs in its own process (memory back, an OOM kill is a row).

    .venv/bin/python experiments/bench_families.py [--families lora,reparam,llama,attention | member,...]
        [--exporters ts,dynamo] [--size small|full] [--threads 1,all] [--rounds 7] [--runs 5] [--min-ms 50]
        [--seed 0]
        [--cache ~/.cache/xrl/families] [--xrl-time-limit 120] [--out experiments/results/families/small.md]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import logging
import os
import platform
import random
import shlex
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from xrl.stats import geomean, geomean_values

VARIANTS = ("original", "A/A", "onnxslim", "onnx-simplifier", "ort-transformers", "onnxscript-ort", "xrl", "limit")
PEERS = VARIANTS[1:]
PEER_TOOLS = ("onnxslim", "onnx-simplifier", "ort-transformers", "onnxscript-ort")
RTOL, ATOL = 1e-3, 1e-4
BOOTSTRAP = 2000


class UserError(Exception):
    """A bad option: one line on stderr, exit 2."""


class PeerError(RuntimeError):
    """A variant could not be made; its message is the note."""


@dataclass
class Variant:
    name: str
    path: Path | None = None
    error: str | None = None
    nodes: int | None = None
    ops: str = ""
    max_abs_err: float | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class Timing:
    median_ms: float
    rounds_ms: list[float] = field(default_factory=list)
    speedup: float | None = None
    lo: float | None = None
    hi: float | None = None


@dataclass
class Result:
    member: str
    exporter: str
    variants: dict[str, Variant]
    timings: dict[str, dict[str, Timing]] = field(default_factory=dict)
    error: str | None = None
    limit_kind: str = ""
    # xrl optimises for the thread count it will run with (`--threads`): its file for each thread count
    # after the first (that one is variants["xrl"])
    xrl_at: dict[str, Variant] = field(default_factory=dict)

    def xrl(self, threads: str) -> Variant:
        """xrl's file made for `threads`."""
        return self.xrl_at.get(threads, self.variants["xrl"])


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


def make_xrl(src: Path, dst: Path, time_limit: float, seed: int, threads: str) -> dict:
    """xrl's default optimisation through its Python API, for the thread count the file will be timed at
    (as `xrl optimize --threads`); returns the fields of its report kept here."""
    from xrl.api import optimize

    with quiet():
        res = optimize(str(src), output=str(dst), force=True, seed=seed, time_limit=time_limit,
                       threads=None if threads == "all" else int(threads))
    if not res.verified:
        raise PeerError(f"xrl reports verified=false (max_abs_err {res.max_abs_err})")
    rules = Counter(s.split("@")[0] for s in res.steps)
    return {"speedup": res.speedup, "rewrites": res.rewrites, "time_s": res.time_s, "rules": dict(rules),
            "prepasses": [p.get("name") for p in res.prepasses if p.get("applied")],
            "wrote": res.guard["chosen"] if res.guard else "search"}


def session(path: Path, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def run_outputs(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = session(path, 0)
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


def check(variant: Variant, reference: list[np.ndarray], feeds: dict[str, np.ndarray]) -> None:
    try:
        outs = run_outputs(variant.path, feeds)
    except Exception as exc:
        variant.error = f"onnxruntime: {one_line(exc)}"
        return
    if len(outs) != len(reference) or any(o.shape != r.shape for o, r in zip(outs, reference)):
        variant.error = "outputs differ in number or shape from the original's"
        return
    variant.max_abs_err = max(float(np.max(np.abs(o.astype(np.float64) - r))) if o.size else 0.0
                              for o, r in zip(outs, reference))
    scale = max(1.0, max(float(np.max(np.abs(r))) for r in reference))
    if not all(np.allclose(o, r, rtol=RTOL, atol=ATOL * scale) for o, r in zip(outs, reference)):
        variant.error = (f"outputs differ from the original's beyond rtol {RTOL:g} / atol {ATOL:g} x scale "
                         f"(max abs error {variant.max_abs_err:.3g})")


def prepare(member: str, exporter: str, args, workdir: Path, bar) -> Result:
    from xrl.graphs import families

    variants = {v: Variant(v) for v in VARIANTS}
    bar.set_description(f"{member}/{exporter}: export")
    try:
        src = families.cached_export(member, args.size, exporter, args.cache, seed=args.seed)
        lim = families.cached_export(member, args.size, exporter, args.cache, seed=args.seed, limit=True)
    except Exception as exc:
        bar.update(len(VARIANTS) + len(args.threads) - 1)
        return Result(member, exporter, variants, error=f"{exporter} export failed: {one_line(exc)}")
    res = Result(member, exporter, variants, limit_kind=families.limit_kind(member))
    variants["original"].path = variants["A/A"].path = src
    variants["limit"].path = lim
    model_type, heads, hidden = families.model_info(member, args.size)
    res.xrl_at = {t: Variant("xrl") for t in args.threads[1:]}

    def xrl_maker(var: Variant, threads: str):
        return lambda dst: var.extra.update(make_xrl(src, dst, args.xrl_time_limit, args.seed, threads))

    makers = {
        "xrl": xrl_maker(variants["xrl"], args.threads[0]),
        "onnxslim": lambda dst: make_onnxslim(src, dst),
        "onnx-simplifier": lambda dst: make_onnxsim(src, dst),
        "ort-transformers": (lambda dst: make_ort_transformers(src, dst, model_type, heads, hidden))
        if model_type else None,
        "onnxscript-ort": lambda dst: variants["onnxscript-ort"].extra.update(make_onnxscript_ort(src, dst)),
    }
    makers.update({f"xrl@{t}": xrl_maker(var, t) for t, var in res.xrl_at.items()})
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
            # a fresh session every round: one session of a file can be several percent faster or slower
            # than another for its whole life
            sess, times = session(live[name].path, 1 if threads == "1" else 0), []
            names = {i.name for i in sess.get_inputs()}
            f = {k: v for k, v in feeds.items() if k in names}
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
    timings = res.timings.get(threads, {})
    xrl = timings.get("xrl")
    peers = [p for p in PEER_TOOLS if p in timings and timings[p].speedup is not None]
    if xrl is None or not peers:
        return "—"
    best = max(peers, key=lambda p: timings[p].speedup)
    ratio, lo, hi = ratio_interval(timings[best].rounds_ms, xrl.rounds_ms, seed)
    return f"{ratio:.3f} [{lo:.3f}, {hi:.3f}] vs {best}"


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

    lines = [
        "# Deployment families: onnxruntime on this CPU (issue 23)",
        "",
        f"Command: `.venv/bin/python experiments/bench_families.py {' '.join(shlex.quote(a) for a in args.argv)}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} logical cores ({platform.processor() or 'cpu'}), shared with "
        f"other jobs; torch {torch.__version__}, onnxruntime {onnxruntime.__version__}. Size `{args.size}`, batch 1, "
        f"static shapes. {args.rounds} interleaved rounds x {args.runs} runs (at least {args.min_ms:g} ms) per "
        f"variant, a fresh session per variant per round, seed {args.seed}; wall time {elapsed_s / 60:.1f} min.",
        "",
        "Cells: speed-up over the original (original time / variant time, median over rounds) and its 95% "
        "percentile-bootstrap interval. `A/A`: a second session of the identical file (the noise floor). `limit`: "
        "the network merged / re-parameterised in torch and exported the same way (`exact`), or the plain export "
        "where no exact merge exists (`plain`). `xrl est.`: the speed-up xrl estimated. `xrl/limit`: xrl's gain as "
        "a share of the limit's. `xrl vs best peer`: per-round time of the fastest peer over xrl's (above 1: xrl "
        "faster). FAILED: see the notes.",
        "",
        "| member | exporter | threads | original ms | " + " | ".join(PEERS)
        + " | limit kind | xrl est. | xrl/limit | xrl vs best peer |",
        "|---|---|---|---:|" + "---:|" * len(PEERS) + "---|---:|---:|---:|",
    ]
    for threads in args.threads:
        for res in results:
            if res.error is not None:
                continue
            timings = res.timings.get(threads, {})
            orig = timings.get("original")
            xrl = res.xrl(threads)
            est = xrl.extra.get("speedup")
            est_s = f"{est:.3f}" if isinstance(est, (int, float)) and xrl.error is None else ""
            row = f"| {res.member} | {res.exporter} | {threads} | {orig.median_ms:.2f} | " if orig else \
                f"| {res.member} | {res.exporter} | {threads} | | "
            row += " | ".join(cell(res, threads, p) for p in PEERS)
            row += f" | {res.limit_kind} | {est_s} | {share_of_limit(timings)} | "
            row += f"{versus_best_peer(res, threads, args.seed)} |"
            lines.append(row)
        gm = []
        for p in PEERS:
            vals = [r.timings[threads][p].speedup for r in results
                    if r.error is None and threads in r.timings and p in r.timings[threads]
                    and r.timings[threads][p].speedup is not None]
            gm.append(geomean_cell(vals))
        lines.append(f"| **geomean** | | {threads} | | " + " | ".join(gm) + " | | | | |")
    lines += ["", "Node counts of the files and what xrl did:", "",
              "| member | exporter | " + " | ".join(v for v in VARIANTS if v != "A/A")
              + " | xrl pre-passes | xrl rules (count) | onnxscript fusions "
              + "| xrl wrote (threads: the guard's choice) |",
              "|---|---|" + "---:|" * (len(VARIANTS) - 1) + "---|---|---|---|"]
    for res in results:
        if res.error is None:
            counts = [res.variants[v] for v in VARIANTS if v != "A/A"]
            x = res.variants["xrl"].extra
            rules = ", ".join(f"{k} {v}" for k, v in x.get("rules", {}).items()) or "none"
            fusions = ", ".join(f"{k} {v}" for k, v in res.variants["onnxscript-ort"].extra.get("fusions", {}).items())
            wrote = "; ".join(f"{t}: {res.xrl(t).extra.get('wrote', '?')} ({res.xrl(t).nodes} nodes)"
                              for t in args.threads)
            lines.append(f"| {res.member} | {res.exporter} | "
                         + " | ".join("" if v.nodes is None else str(v.nodes) for v in counts)
                         + f" | {', '.join(x.get('prepasses', [])) or 'none'} | {rules} | {fusions or 'none'} "
                         + f"| {wrote} |")
    lines += ["", "Limits against the originals (max abs error under onnxruntime, seeded inputs):", ""]
    for res in results:
        if res.error is None:
            lim = res.variants["limit"]
            err = "" if lim.max_abs_err is None else f"{lim.max_abs_err:.2g}"
            lines.append(f"- {res.member}/{res.exporter}: {res.limit_kind}, max abs error {err}"
                         + (f" (FAILED: {lim.error})" if lim.error else ""))
    notes = []
    for res in results:
        if res.error is not None:
            notes.append(f"{res.member}/{res.exporter}: {res.error}")
            continue
        for var in [*res.variants.values(), *res.xrl_at.values()]:
            if var.error is not None and var.error != "n/a":
                notes.append(f"{res.member}/{res.exporter}: {var.name} FAILED: {var.error}")
    lines += ["", "Notes:", ""] + ([f"- {n}" for n in notes] or ["- none: every variant ran and matched the original"])
    return "\n".join(lines) + "\n"


CSV_FIELDS = ("member", "exporter", "threads", "variant", "status", "error", "max_abs_err", "nodes", "median_ms",
              "speedup", "ci_lo", "ci_hi", "xrl_estimated_speedup", "make_s", "rounds_ms", "ops")


def write(results: list[Result], args, elapsed_s: float) -> str:
    text = markdown(results, args, elapsed_s)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        with open(args.out.with_suffix(".csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            writer.writeheader()
            for res in results:
                for threads in args.threads:
                    for var in {**res.variants, "xrl": res.xrl(threads)}.values():
                        t = res.timings.get(threads, {}).get(var.name)
                        status = "export failed" if res.error else ("n/a" if var.error == "n/a" else
                                                                    "FAILED" if var.error else "ok")
                        writer.writerow({
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
    return text


# --------------------------------------------------------------------------- command line


def parse_args(argv: list[str]) -> argparse.Namespace:
    from xrl.graphs import families

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=",".join(families.FAMILIES),
                   help="families (lora, reparam, llama, attention) and/or members (lora_encoder, repvgg, ...)")
    p.add_argument("--exporters", default="ts,dynamo")
    p.add_argument("--size", default="small")
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
    args.argv = argv
    members: list[str] = []
    for item in (s.strip() for s in args.families.split(",") if s.strip()):
        if item in families.FAMILIES:
            members += [m for m, f in families.MEMBERS.items() if f == item]
        elif item in families.MEMBERS:
            members.append(item)
        else:
            raise UserError(f"unknown family or member {item!r}; choose from "
                            f"{', '.join(families.FAMILIES)}, {', '.join(families.MEMBERS)}")
    args.members = list(dict.fromkeys(members))
    args.exporters = [{"torchscript": "ts"}.get(e.strip(), e.strip()) for e in args.exporters.split(",") if e.strip()]
    args.threads = [t.strip() for t in args.threads.split(",") if t.strip()]
    for kind, given, allowed in (("exporter", args.exporters, families.EXPORTERS),
                                 ("threads", args.threads, ("1", "all")), ("size", [args.size], families.SIZES)):
        bad = [g for g in given if g not in allowed]
        if bad or not given:
            raise UserError(f"unknown {kind} {', '.join(bad) or '(none)'}; choose from {', '.join(allowed)}")
    if not args.members:
        raise UserError("no members given")
    if args.rounds < 2 or args.runs < 1:
        raise UserError("--rounds must be at least 2 and --runs at least 1")
    args.cache = args.cache.expanduser()
    return args


class QueueBar:
    def __init__(self, queue) -> None:
        self.queue = queue

    def update(self, n: int) -> None:
        self.queue.put(("update", n))

    def set_description(self, text: str) -> None:
        self.queue.put(("desc", text))


def run_combo(member: str, exporter: str, args, workdir: Path, bar) -> Result:
    res = prepare(member, exporter, args, workdir, bar)
    for threads in args.threads:
        if res.error is None:
            res.timings[threads] = time_result(res, threads, args, bar)
        else:
            bar.update(args.rounds)
    for var in [*res.variants.values(), *res.xrl_at.values()]:
        if var.path is not None and var.path.parent == workdir:
            var.path.unlink(missing_ok=True)
    return res


def _child(member: str, exporter: str, args, workdir: Path, queue) -> None:
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    try:
        queue.put(("done", run_combo(member, exporter, args, workdir, QueueBar(queue))))
    except Exception as exc:
        queue.put(("done", Result(member, exporter, {v: Variant(v) for v in VARIANTS},
                                  error=f"benchmark failed: {one_line(exc)}")))


def run_isolated(member: str, exporter: str, args, workdir: Path, bar) -> Result:
    import multiprocessing as mp
    import queue as queue_mod

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    # not a daemon: xrl's pre-passes run in child processes of their own, which a daemon may not start (every
    # pre-pass was dropped, and the xrl column measured the search alone)
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
            return Result(member, exporter, {v: Variant(v) for v in VARIANTS},
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
    combos = [(m, e) for m in args.members for e in args.exporters]
    started = time.perf_counter()
    results: list[Result] = []
    # per member: each variant made (xrl once per thread count) and each round of each thread count
    total = len(combos) * (len(VARIANTS) + len(args.threads) - 1 + len(args.threads) * args.rounds)
    with tempfile.TemporaryDirectory(prefix="bench_families-") as tmp, \
            tqdm(total=total, file=sys.stderr, dynamic_ncols=True) as bar:
        for member, exporter in combos:
            results.append(run_isolated(member, exporter, args, Path(tmp), bar))
            write(results, args, time.perf_counter() - started)  # partial results survive a kill
    print(write(results, args, time.perf_counter() - started), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
