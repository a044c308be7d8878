"""Where training metrics go: wandb (offline by default), TensorBoard, a JSON-lines file, or nowhere.

Every run writes `metrics.jsonl` in its output directory (one line per update), whatever else is
configured: the learning-curve plot is drawn from it, and it needs no service to read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from xrl.errors import ConfigError

LOGGERS = ("wandb", "tensorboard", "none")


class MetricLogger:
    """Receives one dict of scalars per update."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlLogger(MetricLogger):
    def __init__(self, path: Path, *, append: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = path.open("a" if append else "w")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._f.write(json.dumps({"update": step, **metrics}, allow_nan=True) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class WandbLogger(MetricLogger):
    def __init__(self, out_dir: Path, *, project: str, mode: str, name: str | None, config: Mapping[str, Any],
                 resume_id: str | None = None, group: str | None = None, tags: Sequence[str] | None = None) -> None:
        if mode not in ("offline", "online", "disabled"):
            raise ConfigError(f"unknown wandb mode {mode!r}; choose offline, online or disabled")
        import wandb

        # group and tags: the runs of one sweep side by side in wandb's UI (xrl train -m fills them in)
        self.run = wandb.init(project=project, mode=mode, dir=str(out_dir), name=name, config=dict(config),
                              id=resume_id, resume="allow" if resume_id else None, reinit=True, group=group,
                              tags=[str(t)[:64] for t in tags] if tags else None)  # wandb refuses tags over 64

    @property
    def run_id(self) -> str:
        return self.run.id

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class TensorBoardLogger(MetricLogger):
    def __init__(self, out_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("logger=tensorboard needs the tensorboard package (pip install tensorboard); "
                              "or use logger=wandb or logger=none") from None
        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for k, v in metrics.items():
            if isinstance(v, int | float) and math.isfinite(v):
                self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MultiLogger(MetricLogger):
    def __init__(self, loggers: Sequence[MetricLogger]) -> None:
        self.loggers = list(loggers)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for lg in self.loggers:
            lg.log(metrics, step)

    def close(self) -> None:
        for lg in self.loggers:
            lg.close()


def make_logger(kind: str | Sequence[str], out_dir: Path, *, project: str = "xrl", mode: str = "offline",
                name: str | None = None, config: Mapping[str, Any] | None = None, append: bool = False,
                wandb_id: str | None = None, group: str | None = None,
                tags: Sequence[str] | None = None) -> MultiLogger:
    """The JSON-lines logger plus the configured ones (a name or a list: "wandb", "tensorboard", "none")."""
    kinds = [kind] if isinstance(kind, str) else list(kind)
    loggers: list[MetricLogger] = [JsonlLogger(out_dir / "metrics.jsonl", append=append)]
    for k in kinds:
        if k not in LOGGERS:
            raise ConfigError(f"unknown logger {k!r}; choose from: {', '.join(LOGGERS)}")
        if k == "wandb":
            loggers.append(WandbLogger(out_dir, project=project, mode=mode, name=name, config=config or {},
                                       resume_id=wandb_id, group=group, tags=tags))
        elif k == "tensorboard":
            loggers.append(TensorBoardLogger(out_dir))
    return MultiLogger(loggers)


def plot_learning_curves(history: Sequence[Mapping[str, float]], path: Path,
                         keys: Sequence[str] = ("episode_return", "speedup_mean", "eval_speedup_mean",
                                                "policy_loss", "value_loss", "entropy")) -> Path | None:
    """A PNG with one panel per metric against the update number (matplotlib, Agg backend)."""
    keys = [k for k in keys if any(k in h for h in history)]
    if not history or not keys:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        pts = [(h["update"], h[key]) for h in history if key in h and math.isfinite(h[key])]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="." if len(pts) < 50 else None)
        ax.set_title(key)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
