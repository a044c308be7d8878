"""`xrl sweep summarize DIR`: one table and one plot across the runs of a sweep.

A run is a directory with `metrics.jsonl` (xrl.rl.loggers: one JSON line per update) and, for a Hydra
multirun, `.hydra/overrides.yaml` (the run's overrides). Per run and graph: the final and the best
speed-up over the updates (`eval_speedup/<graph>` where the run evaluated, else the training episodes'
`speedup/<graph>`). Runs that differ only in `seed=` form one configuration: the table gives the
mean and standard deviation over its seeds.

What is read is bounded (a metrics file is whatever a run, or a user, left there): at most MAX_RUN_BYTES of
each metrics file, MAX_GRAPHS graphs per run and MAX_RUNS runs; the plot draws at most PLOT_GRAPHS graphs
of PLOT_CONFIGS configurations. A warning says what was cut.
"""

from __future__ import annotations

import json
import math
import statistics
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from xrl.atomic import atomic_write, write_atomic
from xrl.errors import ConfigError, XrlWarning

MAX_RUN_BYTES = 64 << 20
MAX_GRAPHS = 256
MAX_RUNS = 1000
PLOT_GRAPHS = 40
PLOT_CONFIGS = 12


@dataclass(frozen=True)
class RunSummary:
    path: str
    overrides: tuple[str, ...]
    updates: int
    final: dict[str, float] = field(default_factory=dict)  # graph -> speed-up at the last update
    best: dict[str, float] = field(default_factory=dict)  # graph -> best speed-up over the updates

    @property
    def config(self) -> str:
        """The run's overrides without the seed: runs with the same config are seeds of one configuration."""
        return " ".join(o for o in self.overrides if not o.split("=", 1)[0].lstrip("+~").endswith("seed")) or "(base)"


def _overrides(run: Path) -> tuple[str, ...]:
    path = run / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return ()
    with path.open("rb") as f:
        text = f.read(1 << 20).decode("utf-8", errors="replace")
    # Hydra writes a YAML list of strings, one "- key=value" per line: no YAML parser needed.
    return tuple(clean(line.strip()[2:].strip().strip("'\"")[:200]) for line in text.splitlines()
                 if line.strip().startswith("- "))[:64]


def clean(text: str) -> str:
    """A name from a file as printable text: control characters and lone surrogates (which no file and no font
    can hold) become '?'."""
    import unicodedata

    return "".join("?" if unicodedata.category(c) in ("Cc", "Cs", "Cn") else c for c in text)


# A speed-up outside these bounds is not one a run measured: skipped like an unreadable line
MIN_SPEEDUP, MAX_SPEEDUP = 1e-6, 1e6


def _rows(path: Path) -> list[dict]:
    """The metrics file's JSON objects; anything else on a line (a line cut by an interrupted run, another
    tool's output, bytes that are not UTF-8) is skipped."""
    with path.open("rb") as f:
        raw = f.read(MAX_RUN_BYTES + 1)
    if len(raw) > MAX_RUN_BYTES:
        warnings.warn(f"{path}: reading its first {MAX_RUN_BYTES >> 20} MiB only", XrlWarning, stacklevel=3)
        raw = raw[:MAX_RUN_BYTES]
    rows = []
    for line in raw.splitlines():
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _read_run(run: Path) -> RunSummary | None:
    path = run / "metrics.jsonl"
    if not path.is_file():  # a directory or a pipe of that name
        return None
    rows = _rows(path)
    if not rows:
        return None
    prefix = "eval_speedup/" if any(isinstance(k, str) and k.startswith("eval_speedup/") for r in rows for k in r) \
        else "speedup/"
    final: dict[str, float] = {}
    best: dict[str, float] = {}
    dropped: set[str] = set()
    for r in rows:
        for k, v in r.items():
            if k.startswith(prefix) and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) \
                    and MIN_SPEEDUP <= v <= MAX_SPEEDUP:
                g = clean(k[len(prefix):][:200])
                if g not in final and len(final) >= MAX_GRAPHS:
                    dropped.add(g)
                    continue
                final[g] = float(v)
                best[g] = max(best.get(g, float(v)), float(v))
    if dropped:
        warnings.warn(f"{run}: summarising {MAX_GRAPHS} graphs of {MAX_GRAPHS + len(dropped)}", XrlWarning,
                      stacklevel=3)
    return RunSummary(str(run), _overrides(run), len(rows), final, best)


def load_runs(root: str | Path) -> list[RunSummary]:
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"no such sweep directory: {root}")
    found = []
    for p in root.rglob("metrics.jsonl"):
        found.append(p)
        if len(found) > MAX_RUNS:
            warnings.warn(f"{root}: summarising the first {MAX_RUNS} runs found", XrlWarning, stacklevel=2)
            found.pop()
            break
    runs = [s for p in sorted(found) if (s := _read_run(p.parent)) is not None]
    if not runs:
        raise ConfigError(f"no runs under {root} (looked for */metrics.jsonl)")
    return runs


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def summarize(runs: list[RunSummary]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows): per configuration and graph, final and best speed-up, mean ± sd over seeds."""
    by_config: dict[str, list[RunSummary]] = defaultdict(list)
    for r in runs:
        by_config[r.config].append(r)
    headers = ["config", "graph", "seeds", "final speed-up", "best speed-up"]
    rows = []
    for config, group in sorted(by_config.items()):
        for g in sorted({g for r in group for g in r.final}):
            fin = [r.final[g] for r in group if g in r.final]
            bst = [r.best[g] for r in group if g in r.best]
            (fm, fs), (bm, bs) = _mean_sd(fin), _mean_sd(bst)
            rows.append([config, g, str(len(fin)), f"{fm:.3f} ± {fs:.3f}", f"{bm:.3f} ± {bs:.3f}"])
    return headers, rows


def _markdown(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_summary(root: str | Path, runs: list[RunSummary] | None = None) -> dict[str, Path]:
    """summary.md (the table), summary.csv, and summary.png (best speed-up per graph and configuration)."""
    import csv

    root = Path(root)
    runs = runs if runs is not None else load_runs(root)
    headers, rows = summarize(runs)
    md = root / "summary.md"
    write_atomic(md, f"{len(runs)} runs under {root}\n\n" + _markdown(headers, rows))
    with atomic_write(root / "summary.csv") as pending, pending.open("w", newline="") as f:
        csv.writer(f).writerows([headers, *rows])
    out = {"markdown": md, "csv": root / "summary.csv"}
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return out
    import logging

    import numpy as np

    # whatever the names hold (a glyph no font has, a '$' mathtext reads), matplotlib's warnings and log lines
    # stay out of the user's terminal: the table is the summary, the plot a picture of it
    level = logging.getLogger("matplotlib").level
    logging.getLogger("matplotlib").setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with np.errstate(all="ignore"):
                return _plot(plt, root, rows, out)
    finally:
        logging.getLogger("matplotlib").setLevel(level)


def _plot(plt, root: Path, rows: list[list[str]], out: dict[str, Path]) -> dict[str, Path]:  # noqa: ANN001
    configs = sorted({r[0] for r in rows})
    graphs = sorted({r[1] for r in rows})
    if len(configs) > PLOT_CONFIGS or len(graphs) > PLOT_GRAPHS:  # a readable plot, in bounded time and pixels
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.warn(f"the plot shows {min(len(graphs), PLOT_GRAPHS)} of {len(graphs)} graphs and "
                          f"{min(len(configs), PLOT_CONFIGS)} of {len(configs)} configurations; the table has them "
                          f"all", XrlWarning, stacklevel=3)
        configs, graphs = configs[:PLOT_CONFIGS], graphs[:PLOT_GRAPHS]
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(graphs) * max(1, len(configs)) / 2), 4))
    width = 0.8 / max(len(configs), 1)
    for i, cfg in enumerate(configs):
        mean = {r[1]: float(r[4].split(" ± ")[0]) for r in rows if r[0] == cfg}
        sd = {r[1]: float(r[4].split(" ± ")[1]) for r in rows if r[0] == cfg}
        xs = [j + i * width for j in range(len(graphs))]
        ax.bar(xs, [mean.get(g, 0) for g in graphs], width, yerr=[sd.get(g, 0) for g in graphs],
               label=_label(cfg))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(graphs))], [_label(g) for g in graphs], rotation=30,
                  ha="right")
    ax.set_ylabel("best speed-up (mean ± sd over seeds)")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.legend(fontsize=7)
    fig.tight_layout()
    png = root / "summary.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    out["plot"] = png
    return out


def _label(text: str) -> str:
    """Plain text for a plot label: '$' would start mathtext, a leading '_' hide a legend entry."""
    return text.replace("$", r"\$").lstrip("_") or "?"
