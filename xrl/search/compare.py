"""The comparison driver: every method on every graph, each result recomputed and verified.

A run goes through `xrl.search.registry.run_search`, the same dispatch `xrl optimize --search M` uses,
so a method (any registered search) is compared exactly as a user would run it. Nothing a method
reports is trusted: the cost is recomputed from the graph it returns, the graph is validated,
exported to ONNX and run against the loaded reference under onnxruntime (`compare_models`). A
method that raises is recorded as failed with its reason and the remaining runs go on; a method
that is not installed (the RL policy, a plug-in that does not import) is recorded as unavailable.

Outputs in `out_dir`: results.csv, results.md (per graph and method, then a geometric-mean row per
method), speedup.png (grouped bars) and speedup_vs_time.png (speedup against optimiser wall time,
log x).
"""

from __future__ import annotations

import csv
import math
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from xrl.errors import ConfigError, XrlError
from xrl.search.registry import SearchUnavailableError, get_search, run_search, search_names
from xrl.stats import geomean, geomean_values

# The built-in searches compared by default; any registered search (`xrl.search.registry`) can be named
METHODS = ("rl", "taso", "tensat", "greedy", "random", "beam", "exhaustive")
SUITES = ("xrlflow", "taso", "small", "headroom", "families", "families_full", "families_xl", "all")

STATUS_OK, STATUS_WRONG, STATUS_FAILED, STATUS_UNAVAILABLE = "ok", "wrong output", "failed", "unavailable"


@dataclass
class RunRecord:
    """One method on one graph. Costs in seconds; speedup = original / optimised cost."""

    graph: str
    method: str
    status: str  # ok | wrong output | failed | unavailable
    original_cost: float = math.nan
    optimized_cost: float = math.nan
    speedup: float = math.nan
    time_s: float = math.nan  # optimiser wall time, excluding verification
    rewrites: int = 0
    verified: bool = False  # outputs equal to the reference under onnxruntime
    max_abs_err: float = math.nan
    original_nodes: int = 0
    optimized_nodes: int = 0
    error: str = ""

    @property
    def counted(self) -> bool:
        """Included in the geometric mean: a verified result."""
        return self.status == STATUS_OK


@dataclass(frozen=True)
class CompareConfig:
    graphs: tuple[str, ...]
    methods: tuple[str, ...] = METHODS
    cost: str = "target"
    device: str | None = None
    target: str | None = "paper"  # the research setting by default; ort-cpu / ort-cuda for what users get
    seed: int = 0
    time_limit: float | None = None  # seconds per run, for every method without its own limit
    method_time_limits: Mapping[str, float] | None = None  # per-method override of time_limit
    method_options: Mapping[str, Mapping[str, Any]] | None = None  # per-method search options
    steps: Mapping[str, int] | None = None  # per-method step budget (random: steps taken)
    rules: str = "all"  # the rule set every method searches with (xrl.rewrite.rules: all, elementary, ...)


def resolve_graphs(spec: str | Sequence[str]) -> tuple[str, ...]:
    """Graph names from a suite name ("xrlflow", "taso", "small", "headroom", "all") or a comma list of names."""
    from xrl import graphs

    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if not items:
        raise ConfigError("no graphs given; name built-in graphs (comma separated) or a suite: " + ", ".join(SUITES))
    out: list[str] = []
    for item in items:
        if item in SUITES:
            out.extend(graphs.names(None if item == "all" else item))
        else:
            _check_graph_spec(item)
            out.append(item)
    return tuple(dict.fromkeys(out))


def _check_graph_spec(item: str) -> None:
    """A built-in graph name or a regular model file, checked before any work: an unknown name is a user
    error (not a row of failed runs and exit 0), and /dev/zero or a FIFO is never read."""
    import difflib

    from xrl import graphs
    from xrl.errors import UnknownGraphError
    from xrl.frontends.loader import check_regular_file, names_a_file

    if names_a_file(item):
        check_regular_file(Path(item), f"--graphs {item}")
        return
    if item not in graphs.BUILTIN_GRAPHS:
        close = difflib.get_close_matches(item, list(graphs.BUILTIN_GRAPHS), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UnknownGraphError(f"--graphs: unknown built-in graph {item!r}; {hint}see `xrl graphs list`, or "
                                f"a suite: {', '.join(SUITES)}")


def comparable_methods() -> tuple[str, ...]:
    """Every registered search but "none" (which has nothing to compare)."""
    return tuple(m for m in search_names() if m != "none")


def resolve_methods(spec: str | Sequence[str]) -> tuple[str, ...]:
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    known = comparable_methods()
    unknown = [m for m in items if m not in known]
    if unknown or not items:
        what = f"unknown method {unknown[0]!r}" if unknown else "no methods given"
        raise ConfigError(f"{what}; choose from: {', '.join(known)}")
    return tuple(dict.fromkeys(items))


def method_available(method: str) -> str | None:
    """None if `method` can run here, else why not (a module it needs, or its plug-in, does not import)."""
    try:
        return get_search(method).unavailable()
    except SearchUnavailableError as e:
        return str(e)


# ----- running --------------------------------------------------------------------------------
Progress = Callable[[RunRecord, int, int], None]


def run_compare(config: CompareConfig, *, progress: Progress | None = None) -> list[RunRecord]:
    """Every method in `config` on every graph, over the rule set `config.rules`; never raises for one run's
    failure (an unknown rule set is a ConfigError before any run)."""
    from xrl.rewrite.rules import use_rules

    with use_rules(config.rules):
        return _run_compare(config, progress=progress)


def _run_compare(config: CompareConfig, *, progress: Progress | None = None) -> list[RunRecord]:
    from xrl.cost import get_cost_model
    from xrl.frontends.loader import load_model

    # no device named: this machine (the factory's None is each backend's own default)
    cost_model = get_cost_model(config.cost, device=config.device or "auto", target=config.target)
    records: list[RunRecord] = []
    total = len(config.graphs) * len(config.methods)
    for name in config.graphs:
        try:
            loaded = load_model(name, seed=config.seed)
            original_cost = cost_model.cost(loaded.graph)
        except XrlError as e:  # an unknown graph name fails every method on it, and only those
            for method in config.methods:
                records.append(RunRecord(name, method, STATUS_FAILED, error=f"loading the graph: {e}"))
                _report(progress, records, total)
            continue
        for method in config.methods:
            records.append(run_one(loaded, method, cost_model, original_cost, config))
            _report(progress, records, total)
    return records


def _report(progress: Progress | None, records: list[RunRecord], total: int) -> None:
    if progress is not None:
        progress(records[-1], len(records), total)


def run_one(loaded, method: str, cost_model, original_cost: float, config: CompareConfig) -> RunRecord:
    """One method on one loaded graph, recomputed and verified."""
    from xrl.frontends.verify import compare_models
    from xrl.search.exported import exported

    graph = loaded.graph
    rec = RunRecord(loaded.source, method, STATUS_FAILED, original_cost=original_cost, original_nodes=len(graph))
    why = method_available(method)
    if why is not None:
        rec.status, rec.error = STATUS_UNAVAILABLE, why
        return rec
    limits = dict(config.method_time_limits or {})
    time_limit = limits.get(method, config.time_limit)
    options = dict((config.method_options or {}).get(method, {}))
    steps = (config.steps or {}).get(method)
    t0 = time.perf_counter()
    try:
        outcome = run_search(method, graph, cost_model, seed=config.seed, steps=steps, time_limit=time_limit,
                             options=options)
        rec.time_s = time.perf_counter() - t0
        # the file as the deployment path makes it: exported once, read back (`xrl.search.exported`)
        result = exported(method, outcome.graph.validate(), list(outcome.steps), check=False)
        # recomputed, never the method's own number: under an onnxruntime target, of the file as written
        rec.optimized_cost = cost_model.cost(result.written if _costs_the_file(cost_model) else result.graph)
        rec.speedup = original_cost / rec.optimized_cost if rec.optimized_cost > 0 else math.nan
        rec.rewrites = len(result.steps)
        rec.optimized_nodes = len(result.head.graph.node)
        check = compare_models(loaded.reference, result.head, external=result.weights, seed=config.seed)
    except Exception as e:  # noqa: BLE001 - one method's failure must not stop the comparison
        if math.isnan(rec.time_s):
            rec.time_s = time.perf_counter() - t0
        rec.error = _one_line(e)
        if isinstance(e, SearchUnavailableError):  # a plug-in that cannot be imported here
            rec.status, rec.time_s = STATUS_UNAVAILABLE, math.nan
        return rec
    rec.verified = bool(check.ok)
    rec.max_abs_err = float(check.max_abs_err)
    rec.status = STATUS_OK if check.ok else STATUS_WRONG
    if not check.ok:
        rec.error = f"outputs differ from the reference (max abs error {check.max_abs_err:.3g})"
    return rec


def _costs_the_file(cost_model) -> bool:  # noqa: ANN001 - an xrl.cost.CostModel
    """A target's estimate is of what onnxruntime runs, so it costs the exported file (IR-only fused forms
    are lowered on export); the research setting's per-op model costs the searched graph."""
    return cost_model.target is not None and cost_model.target.runtime == "onnxruntime"


def _one_line(e: BaseException) -> str:
    if isinstance(e, XrlError):
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    loc = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}{loc}: {msg}" if msg else f"{type(e).__name__}{loc}"


# ----- summaries ------------------------------------------------------------------------------
@dataclass(frozen=True)
class MethodSummary:
    method: str
    geomean_speedup: float  # over verified runs
    runs_ok: int
    runs: int
    mean_time_s: float


def summarize(records: Sequence[RunRecord]) -> list[MethodSummary]:
    """One row per method, in the order the methods first appear."""
    out = []
    for method in dict.fromkeys(r.method for r in records):
        mine = [r for r in records if r.method == method]
        ok = [r for r in mine if r.counted and geomean_values([r.speedup])]
        geo = geomean(r.speedup for r in ok)
        times = [r.time_s for r in ok]
        out.append(MethodSummary(method, geo, len(ok), len(mine), math.fsum(times) / len(times) if times else math.nan))
    return out


CSV_COLUMNS = [f.name for f in fields(RunRecord)]
TABLE_HEADERS = ["graph", "method", "original", "optimised", "speedup", "time (s)", "rewrites", "verified", "note"]


def table_rows(records: Sequence[RunRecord]) -> list[list[Any]]:
    """Rows for a human table (costs in microseconds), then one geometric-mean row per method."""
    rows: list[list[Any]] = []
    for r in records:
        rows.append([r.graph, r.method, _us(r.original_cost), _us(r.optimized_cost), _num(r.speedup, 3),
                     _num(r.time_s, 2), r.rewrites if r.status in (STATUS_OK, STATUS_WRONG) else "",
                     _verified(r), r.error])
    for s in summarize(records):
        rows.append(["geomean", s.method, "", "", _num(s.geomean_speedup, 3), _num(s.mean_time_s, 2), "",
                     f"{s.runs_ok}/{s.runs}", "speedup over verified runs; time = mean"])
    return rows


def _us(seconds: float) -> str:
    return "" if math.isnan(seconds) else f"{seconds * 1e6:.1f} us"


def _num(v: float, digits: int) -> str:
    return "" if math.isnan(v) else f"{v:.{digits}f}"


def _verified(r: RunRecord) -> str:
    if r.status in (STATUS_FAILED, STATUS_UNAVAILABLE):
        return r.status
    return "yes" if r.verified else "NO"


def write_results(records: Sequence[RunRecord], out_dir: str | Path, *, title: str = "xrl compare",
                  header: str = "") -> dict[str, Path]:
    """results.csv, results.md and the two plots, each written atomically; returns their paths by name."""
    from xrl.atomic import atomic_write, write_atomic

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out / "results.csv", "md": out / "results.md"}
    with atomic_write(paths["csv"]) as pending, pending.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in records:
            w.writerow(asdict(r))
        for s in summarize(records):
            w.writerow({"graph": "geomean", "method": s.method, "status": f"{s.runs_ok}/{s.runs} ok",
                        "speedup": s.geomean_speedup, "time_s": s.mean_time_s})
    write_atomic(paths["md"], markdown_table(records, title=title, header=header))
    paths.update(write_plots(records, out))
    return paths


def markdown_table(records: Sequence[RunRecord], *, title: str = "xrl compare", header: str = "") -> str:
    lines = [f"# {title}", ""]
    if header:
        lines += [header, ""]
    lines.append("| " + " | ".join(TABLE_HEADERS) + " |")
    lines.append("|" + "|".join("---" if i < 2 or i == len(TABLE_HEADERS) - 1 else "---:"
                                for i in range(len(TABLE_HEADERS))) + "|")
    for row in table_rows(records):
        cells = [str(c).replace("|", "\\|") for c in row]
        if row[0] == "geomean":
            cells = [f"**{c}**" if c else c for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_plots(records: Sequence[RunRecord], out_dir: Path) -> dict[str, Path]:
    """speedup.png (grouped bars per graph) and speedup_vs_time.png (log-x scatter), Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graphs = list(dict.fromkeys(r.graph for r in records))
    # A method with no verified result (unavailable, or failed everywhere) has nothing to draw.
    methods = [m for m in dict.fromkeys(r.method for r in records) if any(r.counted for r in records if r.method == m)]
    by_key = {(r.graph, r.method): r for r in records}
    colors = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(methods)}
    paths = {"speedup_plot": out_dir / "speedup.png", "time_plot": out_dir / "speedup_vs_time.png"}

    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(graphs) + 2), 4.0))
    for k, m in enumerate(methods):
        xs, ys = [], []
        for i, g in enumerate(graphs):
            r = by_key.get((g, m))
            if r is not None and r.counted:
                xs.append(i + (k - (len(methods) - 1) / 2) * width)
                ys.append(r.speedup)
        ax.bar(xs, ys, width=width, label=m, color=colors[m])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(graphs)))
    ax.set_xticklabels(graphs, rotation=30, ha="right")
    ax.set_ylabel("speedup (original / optimised cost)")
    ax.set_title("speedup per graph (verified results only)")
    ax.legend(fontsize="small", ncols=min(len(methods), 5))
    fig.tight_layout()
    _save_png(fig, paths["speedup_plot"])
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for m in methods:
        pts = [(r.time_s, r.speedup) for r in records if r.method == m and r.counted and r.time_s > 0]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], label=m, color=colors[m], alpha=0.8)
    ax.set_xscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("optimisation time (s, log scale)")
    ax.set_ylabel("speedup")
    ax.set_title("speedup against optimisation time")
    ax.legend(fontsize="small")
    fig.tight_layout()
    _save_png(fig, paths["time_plot"])
    plt.close(fig)
    return paths


def _save_png(fig, path: Path) -> None:  # noqa: ANN001 - a matplotlib Figure
    from xrl.atomic import atomic_write

    with atomic_write(path) as pending:
        fig.savefig(pending.temp, dpi=120, format="png")  # the temporary's name has no .png to infer it from
