"""Peak memory of `xrl optimize` (issue 26 item 9): the whole process tree, children included.

Each model is optimised by the CLI in a subprocess with a user's defaults (measured kernel costs and
the measured guard: this script removes the `XRL_TARGET_COST`/`XRL_GUARD` overrides the tests set).
A sampler sums the resident memory of the process and all its descendants every ~50 ms (the tree's
peak: the pre-pass children run beside the parent); `os.wait4` gives the largest single process's
`ru_maxrss` (the kernel's exact figure, children it waited for included). The baseline is a bare
interpreter that imports xrl, torch and onnxruntime: what any run costs before it reads a model.

    .venv/bin/python experiments/bench_memory.py [--models bert,vit,...] [--deploy bert,gpt,vit,resnet,effnet]
        [--time-limit S] [--out experiments/results/memory]
    .venv/bin/python experiments/bench_memory.py --billion   # a 1e9-parameter model built in code (4 GB fp32)

The table: weight bytes, the tree's peak RSS, its ratio to the weights, the peak above the baseline and
that ratio (the issue's target is at most 3x the weight bytes), the largest process's ru_maxrss, wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
BUILTIN = ("bert", "vit", "vgg19", "resnet50", "inception_v3", "resnext50", "dalle", "squeezenet", "nasrnn")
DEPLOY = ("bert", "gpt", "vit", "resnet", "effnet")
TARGET_RATIO = 3.0
SAMPLE_S = 0.05
MAX_SHARE_OF_FREE = 0.8  # of the memory available when a run starts: over it, the run is killed
# what the tests set and a user does not: the benchmark measures a user's run
TEST_OVERRIDES = ("XRL_TARGET_COST", "XRL_GUARD", "XRL_NO_PREPASS")
BASELINE_CODE = "import xrl, torch, onnxruntime, xrl.api"


@dataclass
class Row:
    model: str
    kind: str  # builtin | deploy | billion
    weight_bytes: int
    peak_tree_rss: int = 0  # the tree's peak PSS (each page counted once; see pss_of)
    max_single_rss: int = 0  # the largest process's ru_maxrss
    baseline_rss: int = 0
    wall_s: float = 0.0
    exit_code: int = 0
    note: str = ""
    peak_tree_rss_sum: int = 0  # RSS summed over the tree: a forked child's shared pages counted twice
    phases: list = field(default_factory=list)  # Phase rows

    @property
    def ratio(self) -> float:
        return self.peak_tree_rss / self.weight_bytes if self.weight_bytes else float("nan")

    @property
    def above_baseline(self) -> int:
        return max(self.peak_tree_rss - self.baseline_rss, 0)

    @property
    def ratio_above_baseline(self) -> float:
        return self.above_baseline / self.weight_bytes if self.weight_bytes else float("nan")


def user_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in TEST_OVERRIDES}
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def tree_rss(proc: psutil.Process) -> int:
    """Resident bytes of `proc` and every descendant (one that ends between the listing and the read counts 0)."""
    return tree_memory(proc)[0]


def pss_of(pid: int) -> int | None:
    """The proportional set size of a process (Linux: /proc/PID/smaps_rollup): its private pages plus its
    share of each page it shares. A forked child shares its parent's pages until either writes them, and
    RSS counts every such page in both; the PSS of a tree counts each page once. None where unavailable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def tree_memory(proc: psutil.Process) -> tuple[int, int]:
    """(RSS summed over the tree, PSS summed over the tree: RSS where PSS cannot be read)."""
    return tree_memory_detail(proc)[:2]


def run_sampled(cmd: list[str], *, env: dict[str, str] | None = None, timeout: float | None = None,
                cwd: str | None = None, max_rss: int | None = None,
                phases: list | None = None, stdout: Path | None = None) -> tuple[int, int, int, float, str, int]:
    """Run `cmd`, sampling its tree's RSS and PSS; the tree is killed when its PSS passes `max_rss` bytes (a run
    must not push the shared machine into the OOM killer). Returns (exit code, peak tree RSS, the largest
    process's peak RSS (ru_maxrss of every waited-for process, and the sampled RSS of each), wall seconds, the
    tail of its stderr, peak tree PSS). With `phases` (a list), it is filled with per-phase peaks (`Phase`):
    the pre-pass children are forks of the CLI's process, so the run splits into before the first child (load,
    exact merges), each child's lifetime (a pre-pass, in the order they ran), and after the last (search,
    verification, guard, write). `stdout`: a file for the command's standard output (its --json report)."""
    err = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    out = open(stdout, "wb") if stdout is not None else subprocess.DEVNULL  # noqa: SIM115 - closed after the run
    popen = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, cwd=cwd)
    if stdout is not None:
        out.close()  # the child holds its own descriptor
    proc = psutil.Process(popen.pid)
    peak = [0, 0, 0]  # tree RSS, tree PSS, largest single process's RSS
    samples: list[tuple[float, int, int, int, tuple[int, ...]]] = []  # (t, tree PSS, main RSS, max RSS, children)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rss, pss, single, main_rss, kids = tree_memory_detail(proc)
            peak[0], peak[1], peak[2] = max(peak[0], rss), max(peak[1], pss), max(peak[2], single)
            samples.append((time.perf_counter() - t0, pss, main_rss, single, kids))
            if max_rss is not None and peak[1] > max_rss:
                kill_tree(proc)
                return
            done.wait(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    killer = threading.Timer(timeout, popen.kill) if timeout else None
    if killer:
        killer.start()
    # wait4, not Popen.wait: it gives this child's own rusage (its waited-for descendants included)
    _, status, usage = os.wait4(popen.pid, 0)
    popen.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    if killer:
        killer.cancel()
    err.seek(0)
    tail = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
    if phases is not None:
        phases.extend(split_phases(samples))
    single = max(usage.ru_maxrss * 1024, peak[2])
    return popen.returncode, peak[0], single, wall, tail[-1] if tail else "", peak[1]


@dataclass
class Phase:
    name: str
    start_s: float
    end_s: float
    peak_tree_pss: int
    peak_single_rss: int  # the largest process's RSS in the phase (sampled)
    peak_main_rss: int = 0  # the CLI's own process's RSS in the phase (sampled): what a fork child inherits


def split_phases(samples: list[tuple[float, int, int, int, tuple[int, ...]]]) -> list[Phase]:
    """Phases by the children alive: 'load, exact merges' before the first child, 'pre-pass k' while the k-th
    child lives, 'search, verify, guard, write' after the last (with no child: one phase, 'whole run')."""
    order: list[int] = []
    for *_, kids in samples:
        order += [k for k in kids if k not in order]
    phases: list[Phase] = []

    def add(name: str, rows: list) -> None:  # noqa: ANN001
        if rows:
            phases.append(Phase(name, rows[0][0], rows[-1][0], max(r[1] for r in rows), max(r[3] for r in rows),
                                max(r[2] for r in rows)))

    if not order:
        add("whole run", samples)
        return phases
    first = next(i for i, s in enumerate(samples) if s[4])
    last = max(i for i, s in enumerate(samples) if s[4])
    add("load, exact merges", samples[:first])
    for k, pid in enumerate(order, 1):
        add(f"pre-pass child {k}", [s for s in samples if pid in s[4]])
    add("search, verify, guard, write", samples[last + 1:])
    return phases


def tree_memory_detail(proc: psutil.Process) -> tuple[int, int, int, int, tuple[int, ...]]:
    """(RSS summed over the tree, PSS summed, the largest single RSS, the main process's RSS, the children's
    pids)."""
    rss = pss = single = main = 0
    try:
        members = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0, 0, 0, 0, ()
    kids = []
    for p in members:
        try:
            r = p.memory_info().rss
        except psutil.Error:
            continue
        rss += r
        single = max(single, r)
        if p.pid == proc.pid:
            main = r
        else:
            kids.append(p.pid)
        shared = pss_of(p.pid)
        pss += r if shared is None else shared
    return rss, pss, single, main, tuple(kids)


def kill_tree(proc: psutil.Process) -> None:
    try:
        members = [*proc.children(recursive=True), proc]
    except psutil.Error:
        return
    for p in members:
        try:
            p.kill()
        except psutil.Error:
            pass


def baseline_rss() -> int:
    """Peak RSS of an interpreter that only imports what `xrl optimize` imports."""
    _, peak, single, _, _, _ = run_sampled([sys.executable, "-c", BASELINE_CODE + "; import time; time.sleep(0.3)"],
                                        env=user_env())
    return max(peak, single)


def weight_bytes_of(model: str, kind: str) -> int:
    """Bytes of the model's initializers, computed in a child so this process stays small."""
    code = ("import sys, onnx\n"
            "from xrl.frontends.loader import names_a_file\n"
            "from xrl import graphs\n"
            "spec = sys.argv[1]\n"
            "m = onnx.load(spec) if names_a_file(spec) else graphs.build(spec)\n"
            "print(sum(len(t.raw_data) or onnx.numpy_helper.to_array(t).nbytes for t in m.graph.initializer))\n")
    out = subprocess.run([sys.executable, "-c", code, model], capture_output=True, text=True, env=user_env(),
                         check=True)
    return int(out.stdout.split()[-1])


def optimize_cmd(model: str, out: Path, time_limit: float | None) -> list[str]:
    cmd = [sys.executable, "-m", "xrl", "optimize", model, "-o", str(out), "--force", "--json"]
    return cmd + (["--time-limit", str(time_limit)] if time_limit is not None else [])


def measure(model: str, kind: str, label: str, weights: int, base: int, time_limit: float | None,
            timeout: float | None, workdir: Path) -> Row:
    out = workdir / f"{label.replace('/', '_')}-xrl.onnx"
    cap = int(psutil.virtual_memory().available * MAX_SHARE_OF_FREE)
    phases: list[Phase] = []
    code, peak, single, wall, tail, pss = run_sampled(optimize_cmd(model, out, time_limit), env=user_env(),
                                                      timeout=timeout, cwd=str(workdir), max_rss=cap, phases=phases)
    if code and pss > cap:
        tail = f"killed at {gib(pss)} GiB: over {MAX_SHARE_OF_FREE:.0%} of the memory available at its start"
    elif code == -9 and timeout and wall >= timeout:
        tail = f"killed at the {timeout:.0f} s timeout"
    row = Row(label, kind, weights, pss, single, base, wall, code, "" if code == 0 else tail[:160], peak, phases)
    for p in workdir.glob(f"{out.name}*"):
        p.unlink()
    return row


def gib(n: int) -> str:
    return f"{n / 2 ** 30:.2f}"


def markdown(rows: list[Row], base: int, args: argparse.Namespace) -> str:
    limit = "" if args.time_limit is None else f", --time-limit {args.time_limit:g}"
    lines = [
        "# Peak memory of `xrl optimize` (issue 26 item 9, issue 35 item 1)",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2 ** 30:.0f} GiB; python {platform.python_version()}. "
        f"Options: the CLI's defaults (target cost, guard on){limit}.",
        f"Baseline (`python -c '{BASELINE_CODE}'`): {gib(base)} GiB resident.",
        "",
        "Peak tree: the process and its children's proportional set size (PSS: each page counted once, a "
        "forked child's pages shared with its parent included once), summed and sampled every 50 ms; RSS sum: "
        "the same tree's resident sizes summed (shared pages counted in every process that maps them). Max "
        "single: the largest process's peak resident size (its ru_maxrss, and sampled). Target: peak at most 3x "
        "the weight bytes; small models are "
        "judged above the baseline (the interpreter alone is more than 3x their weights).",
        "",
        "| model | weights GiB | peak tree GiB | peak / weights | above baseline GiB | above / weights | "
        "RSS sum GiB | max single GiB | single / weights | wall s | meets 3x |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        whole = r.ratio <= TARGET_RATIO
        meets = "whole peak" if whole else ("above baseline" if r.ratio_above_baseline <= TARGET_RATIO else "no")
        if r.exit_code:
            meets = f"exit {r.exit_code}: {r.note}"
        lines.append(f"| {r.model} | {gib(r.weight_bytes)} | {gib(r.peak_tree_rss)} | {r.ratio:.2f} | "
                     f"{gib(r.above_baseline)} | {r.ratio_above_baseline:.2f} | {gib(r.peak_tree_rss_sum)} | "
                     f"{gib(r.max_single_rss)} | {r.max_single_rss / (r.weight_bytes or 1):.2f} | "
                     f"{r.wall_s:.0f} | {meets} |")
    if any(r.phases for r in rows):
        lines += ["", "Per stage (the pre-pass children are forks of the CLI's process: before the first, each "
                  "child's lifetime, after the last): peak tree PSS, the largest single process's RSS and the "
                  "CLI's own process's RSS (which a forked child's RSS includes), as multiples of the weights.", "",
                  "| model | stage | from s | to s | tree PSS GiB | / weights | max single GiB | / weights | "
                  "main GiB | / weights |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            for ph in r.phases:
                w = r.weight_bytes or 1
                lines.append(f"| {r.model} | {ph.name} | {ph.start_s:.0f} | {ph.end_s:.0f} | "
                             f"{gib(ph.peak_tree_pss)} | {ph.peak_tree_pss / w:.2f} | {gib(ph.peak_single_rss)} | "
                             f"{ph.peak_single_rss / w:.2f} | {gib(ph.peak_main_rss)} | "
                             f"{ph.peak_main_rss / w:.2f} |")
    return "\n".join(lines) + "\n"


def billion_model(path: Path, *, layers: int = 24, hidden: int = 1872, seed: int = 0) -> int:
    """A transformer-shaped MLP stack of ~1e9 fp32 parameters (24 x (4 h^2 attention-like + 8 h^2 MLP)
    with h = 1872: 1.01e9, 4.0 GB), saved with external data; returns its weight bytes. Built one layer at a time so
    this process holds each weight only until it is written."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    data_name = path.name + ".data"
    nodes, inits = [], []
    offset, total = 0, 0
    seq = 8

    def weight(name: str, shape: tuple[int, ...], f) -> str:  # noqa: ANN001 - the open data file
        nonlocal offset, total
        arr = (rng.standard_normal(shape, dtype=np.float32) * (1.0 / np.sqrt(shape[0]))).astype(np.float32)
        raw = arr.tobytes()
        f.write(raw)
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
            e = t.external_data.add()
            e.key, e.value = k, v
        inits.append(t)
        offset += len(raw)
        total += len(raw)
        return name

    with open(path.parent / data_name, "wb") as f:
        x = "x"
        for i in range(layers):
            p = f"l{i}"
            ln_scale = weight(f"{p}.ln.scale", (hidden,), f)
            ln_bias = weight(f"{p}.ln.bias", (hidden,), f)
            nodes.append(helper.make_node("LayerNormalization", [x, ln_scale, ln_bias], [f"{p}.ln"], axis=-1))
            q = weight(f"{p}.wq", (hidden, hidden), f)
            k = weight(f"{p}.wk", (hidden, hidden), f)
            v = weight(f"{p}.wv", (hidden, hidden), f)
            o = weight(f"{p}.wo", (hidden, hidden), f)
            for name, w in (("q", q), ("k", k), ("v", v)):
                nodes.append(helper.make_node("MatMul", [f"{p}.ln", w], [f"{p}.{name}"]))
            nodes.append(helper.make_node("Add", [f"{p}.q", f"{p}.k"], [f"{p}.qk"]))
            nodes.append(helper.make_node("Mul", [f"{p}.qk", f"{p}.v"], [f"{p}.att"]))
            nodes.append(helper.make_node("MatMul", [f"{p}.att", o], [f"{p}.o"]))
            nodes.append(helper.make_node("Add", [x, f"{p}.o"], [f"{p}.res"]))
            up = weight(f"{p}.up", (hidden, 4 * hidden), f)
            up_b = weight(f"{p}.up.bias", (4 * hidden,), f)
            down = weight(f"{p}.down", (4 * hidden, hidden), f)
            nodes.append(helper.make_node("MatMul", [f"{p}.res", up], [f"{p}.up_mm"]))
            nodes.append(helper.make_node("Add", [f"{p}.up_mm", up_b], [f"{p}.up_b"]))
            nodes.append(helper.make_node("Relu", [f"{p}.up_b"], [f"{p}.act"]))
            nodes.append(helper.make_node("MatMul", [f"{p}.act", down], [f"{p}.down_mm"]))
            nodes.append(helper.make_node("Add", [f"{p}.res", f"{p}.down_mm"], [f"{p}.out"]))
            x = f"{p}.out"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    io = [helper.make_tensor_value_info(v, TensorProto.FLOAT, [1, seq, hidden]) for v in ("x", "y")]
    graph = helper.make_graph(nodes, "billion", io[:1], io[1:], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="bench_memory")
    onnx.save(model, str(path))
    return total


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(BUILTIN), help="built-in graphs (comma-separated; 'none' for none)")
    ap.add_argument("--deploy", default=",".join(DEPLOY),
                    help="deployment models, base size, torchscript export (comma-separated; 'none' for none)")
    ap.add_argument("--billion", action="store_true", help="only the 1e9-parameter model built in code")
    ap.add_argument("--time-limit", type=float, default=None, help="xrl's --time-limit (default: the CLI's own)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="kill a run after this many seconds")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "xrl" / "deploy")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "memory")
    ap.add_argument("--name", default=None, help="results file stem (default: memory, or billion)")
    return ap.parse_args(argv)


def names(spec: str) -> list[str]:
    return [] if spec in ("", "none") else [s.strip() for s in spec.split(",") if s.strip()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = baseline_rss()
    print(f"baseline: {gib(base)} GiB", flush=True)
    rows: list[Row] = []
    workdir = Path(tempfile.mkdtemp(prefix="xrl-bench-memory-"))
    try:
        if args.billion:
            free = psutil.virtual_memory().available
            model = workdir / "billion.onnx"
            weights = billion_model(model)
            if free < 3.5 * weights:
                print(f"warning: {gib(free)} GiB available, under 3.5x the weights", file=sys.stderr)
            rows.append(measure(str(model), "billion", f"billion ({weights / 4e9:.2f}e9 params)", weights, base,
                                args.time_limit,
                                args.timeout, workdir))
            print(markdown(rows, base, args).splitlines()[-1], flush=True)
        else:
            jobs = [(m, "builtin", m) for m in names(args.models)]
            if names(args.deploy):
                from xrl.graphs import deploy_models as dm

                for m in names(args.deploy):
                    # exported in a child: torch's export would stay in this process's memory
                    code = ("import sys; from pathlib import Path; from xrl.graphs import deploy_models as dm; "
                            "print(dm.cached_export(sys.argv[1], 'base', 'torchscript', Path(sys.argv[2]), seed=0))")
                    out = subprocess.run([sys.executable, "-c", code, m, str(args.cache)], capture_output=True,
                                         text=True, check=True, env=user_env())
                    jobs.append((out.stdout.strip().splitlines()[-1], "deploy", f"deploy/{m}"))
                del dm
            for model, kind, label in jobs:
                row = measure(model, kind, label, weight_bytes_of(model, kind), base, args.time_limit, args.timeout,
                              workdir)
                rows.append(row)
                print(markdown([row], base, args).splitlines()[-1], flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = markdown(rows, base, args)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.name or ("billion" if args.billion else "memory")
    (args.out / f"{stem}.md").write_text(text)
    payload = {"baseline_rss": base, "time_limit": args.time_limit,
               "rows": [{**asdict(r), "ratio": r.ratio, "above_baseline": r.above_baseline,
                         "ratio_above_baseline": r.ratio_above_baseline} for r in rows]}
    (args.out / f"{stem}.json").write_text(json.dumps(payload, indent=2) + "\n")
    return 0 if all(r.exit_code == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
