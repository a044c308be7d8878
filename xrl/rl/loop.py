"""The training loop of every `xrl train`, read top to bottom; what is trained is a `TrainingTask`.

    state = task.state                                   fresh, or restored from a resumed checkpoint
    logger, progress bar
    fine-tuning only: evaluate the starting policy as update 0 (a candidate for best.pt)
    for update in range(state.update, updates):
        anneal the learning rate
        experience = task.collect(update)                whole episodes under the current weights
        stats = ppo_update(policy, optimizer, experience.batch)            clipped PPO + GAE
        stats |= task.after_update(update)               (rewrites: rehearse the teachers' sequences)
        metrics = the episodes', PPO's and the timings'
        every eval_every updates and at the end: one greedy episode per graph (train, val, eval)
        log; best.pt when the selection metric is at its best; every checkpoint_every: last.pt
    learning curves

A task supplies the pieces that differ between kinds of training: the policy and its optimizer (built
and, on resume, restored by the task), how experience is collected and a policy evaluated, and how a
checkpoint is written. Two exist: graph rewriting (`xrl.rl.train.RewriteTask`) and pass ordering
(`xrl.rl.train_passes.PassOrderingTask`).
"""

from __future__ import annotations

import logging
import math
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from xrl.errors import ConfigError
from xrl.rl.config import typed
from xrl.rl.loggers import make_logger, plot_learning_curves
from xrl.rl.metrics import episode_metrics, eval_metrics, selection_key
from xrl.rl.ppo import PPOConfig, RolloutBatch, ppo_update
from xrl.rl.rollout import EpisodeRecord

log = logging.getLogger(__name__)


@dataclass
class TrainSummary:
    out_dir: Path
    updates: int
    env_steps: int
    time_s: float
    last_checkpoint: Path
    best_checkpoint: Path | None
    history: list[dict[str, float]] = field(default_factory=list)
    curves: Path | None = None


@dataclass
class RunState:
    """Where a run stands: what a checkpoint stores besides the weights, optimizer and RNGs."""

    update: int = 0  # updates done
    env_steps: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    wandb_id: str | None = None
    best_score: float = -math.inf  # the selection metric of best.pt

    @classmethod
    def from_checkpoint(cls, ckpt: Mapping[str, Any]) -> RunState:
        meta = ckpt.get("metadata", {})
        return cls(int(ckpt["update"]), int(ckpt["env_steps"]), list(ckpt.get("history", [])), meta.get("wandb_id"),
                   float(meta.get("best_score", -math.inf)))


@dataclass
class Experience:
    """One update's training experience: PPO's batch and the episodes it came from."""

    batch: RolloutBatch
    episodes: Sequence[EpisodeRecord]
    collect_s: float  # wall time of the collection
    extra: dict[str, float] = field(default_factory=dict)  # more metrics to log (e.g. the cost model's work)


class TrainingTask(ABC):
    """One kind of training as the loop sees it; the constructor builds (or restores) everything below.
    Workers (processes, actors) start at the first collect or evaluate: the loop closes the task once it runs."""

    label: str = "train"  # the progress bar's
    policy: nn.Module
    optimizer: torch.optim.Optimizer
    ppo: PPOConfig
    ppo_rng: np.random.Generator
    state: RunState
    train_graphs: tuple[str, ...] = ()
    val_graphs: tuple[str, ...] = ()  # best.pt is chosen on these when there are any
    eval_graphs: tuple[str, ...] = ()  # reported only
    baseline: nn.Module | None = None  # fine-tuning: the starting policy, evaluated as update 0

    @abstractmethod
    def collect(self, update: int) -> Experience:
        """The experience of update `update`, played with the current policy."""

    def after_update(self, update: int) -> dict[str, float]:
        """Work after PPO's update of `update` (none by default); returns metrics to log with it."""
        return {}

    @abstractmethod
    def evaluate(self, policy: nn.Module, graphs: Sequence[str]) -> list[EpisodeRecord]:
        """One greedy episode per graph, in the order given."""

    @abstractmethod
    def save(self, path: Path, update: int, run_id: str | None, policy: nn.Module | None = None) -> Path:
        """A checkpoint of `policy` (default: the trained one) with the optimizer, RNGs and `self.state`."""

    def progress(self, metrics: Mapping[str, float]) -> dict[str, str]:
        """What the progress bar shows after an update."""
        return {"speedup": f"{metrics['speedup_mean']:.3f}", "ret": f"{metrics['episode_return']:.2f}"}

    def close(self) -> None:  # noqa: B027 - optional: only tasks with workers release anything
        """Release workers."""


def run(task: TrainingTask, c: Mapping[str, Any], out: Path) -> TrainSummary:
    """Train `task` for the config's `updates`, writing metrics, checkpoints and curves under `out`."""
    updates, eval_every, ckpt_every = run_length(c)
    state = task.state
    if state.update >= updates:
        raise ConfigError(f"the run already has {state.update} updates; raise `updates` above {state.update} "
                          "to train further")
    logger = open_logger(c, out, state)
    run_id = next((lg.run_id for lg in logger.loggers if hasattr(lg, "run_id")), None)
    key = selection_key(task.val_graphs)
    graphs = list(dict.fromkeys(task.train_graphs + task.val_graphs + task.eval_graphs))
    last_path, best_path = out / "last.pt", None
    t_start = time.perf_counter()
    limit_s = time_limit_s(c)
    done = state.update
    bar = progress_bar(task.label, state.update, updates, bool(c.get("progress", True)))
    try:
        if task.baseline is not None:  # fine-tuning: the policy it starts from is a candidate for best.pt too
            metrics = {**evaluate(task, task.baseline, graphs), "time_s": time.perf_counter() - t_start}
            record(state, logger, metrics, 0)
            state.best_score = metrics.get(key, -math.inf)
            best_path = task.save(out / "best.pt", 0, run_id, task.baseline)
        for update in bar:
            anneal_lr(task, update, updates)
            experience = task.collect(update)
            t_update = time.perf_counter()
            stats = ppo_update(task.policy, task.optimizer, experience.batch, task.ppo, task.ppo_rng)
            stats.update(task.after_update(update))
            state.env_steps += len(experience.batch)
            metrics = training_metrics(experience, stats, state.env_steps, time.perf_counter() - t_update,
                                       task.optimizer.param_groups[0]["lr"])
            done = update + 1
            # out of time: this update is the last, evaluated and checkpointed as the last one is
            last = limit_s is not None and time.perf_counter() - t_start >= limit_s
            evaluated = due(eval_every, done, updates) or (last and eval_every > 0)
            if evaluated:
                metrics.update(evaluate(task, task.policy, graphs))
            metrics["time_s"] = time.perf_counter() - t_start
            record(state, logger, metrics, done)
            score = metrics.get(key, -math.inf)
            if evaluated and score >= state.best_score:  # ties: the later, longer-trained policy
                state.best_score = score
                best_path = task.save(out / "best.pt", done, run_id)
            bar.set_postfix(**task.progress(metrics))
            if due(ckpt_every, done, updates) or last:
                task.save(last_path, done, run_id)
            if last:
                log.info("time_limit_min reached after update %d of %d", done, updates)
                break
    finally:
        task.close()
        logger.close()
        bar.close()
    curves = plot_learning_curves(state.history, out / "learning_curves.png")
    if best_path is None and (out / "best.pt").exists():
        best_path = out / "best.pt"
    return TrainSummary(out, done, state.env_steps, time.perf_counter() - t_start, last_path, best_path,
                        state.history, curves)


def seed_everything(seed: int) -> np.random.Generator:
    """Seed Python's, numpy's and torch's global RNGs (a task's setup, before it builds its policy); returns
    PPO's own minibatch RNG."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return np.random.default_rng(seed)


# ----- the loop's steps ----------------------------------------------------------------------------
def run_length(c: Mapping[str, Any]) -> tuple[int, int, int]:
    """(updates, eval_every, checkpoint_every) of the config."""
    return (typed("updates", c["updates"], 0), typed("eval_every", c.get("eval_every", 0), 0),
            typed("checkpoint_every", c.get("checkpoint_every", 0), 0))


def time_limit_s(c: Mapping[str, Any]) -> float | None:
    """`time_limit_min` in seconds (None: no limit): the run stops after the update that reaches it, so that a
    recipe can be sized to the machine's hours rather than to an update count it cannot reach."""
    minutes = c.get("time_limit_min")
    if minutes is None:
        return None
    if isinstance(minutes, bool) or not isinstance(minutes, int | float) or not 0 < minutes <= 525_600:
        raise ConfigError(f"time_limit_min must be a positive number of minutes (at most a year), not {minutes!r}")
    return 60.0 * float(minutes)


def open_logger(c: Mapping[str, Any], out: Path, state: RunState) -> Any:
    """The `logger` section's logger (a resumed run appends to its metrics and wandb run)."""
    log_cfg = c.get("logger", {}) or {}
    return make_logger(log_cfg.get("kind", "none"), out, project=log_cfg.get("project", "xrl"),
                       mode=log_cfg.get("mode", "offline"), name=log_cfg.get("name"), config=c,
                       append=bool(c.get("resume")), wandb_id=state.wandb_id, group=log_cfg.get("group"),
                       tags=log_cfg.get("tags"))


def progress_bar(label: str, start: int, updates: int, show: bool) -> Any:
    from tqdm import tqdm

    return tqdm(range(start, updates), initial=start, total=updates, desc=label, unit="update", disable=not show,
                dynamic_ncols=True)


def anneal_lr(task: TrainingTask, update: int, updates: int) -> None:
    """With algo.anneal_lr, the learning rate falls linearly to 0 over the run."""
    if task.ppo.anneal_lr:
        for group in task.optimizer.param_groups:
            group["lr"] = task.ppo.lr * (1.0 - update / updates)


def training_metrics(experience: Experience, stats: Mapping[str, float], env_steps: int, update_s: float,
                     lr: float) -> dict[str, float]:
    """What one update logs: its episodes, PPO's statistics, throughput and timings."""
    n = len(experience.batch)
    return {**episode_metrics(experience.episodes), **stats, "env_steps": float(env_steps), "states": float(n),
            "steps_per_s": n / max(experience.collect_s, 1e-9), "collect_s": experience.collect_s,
            "update_s": update_s, "lr": lr, **experience.extra}


def evaluate(task: TrainingTask, policy: nn.Module, graphs: Sequence[str]) -> dict[str, float]:
    """Greedy episodes of `policy` on `graphs`, as eval metrics."""
    return eval_metrics(task.evaluate(policy, graphs), task.train_graphs, task.val_graphs)


def due(every: int, done: int, updates: int) -> bool:
    """Whether a periodic step (evaluation, checkpoint) is due after `done` updates: every `every`, and at the end."""
    return bool(every and done % every == 0) or done == updates


def record(state: RunState, logger: Any, metrics: dict[str, float], update: int) -> None:
    state.history.append({"update": update, **metrics})
    logger.log(metrics, update)
