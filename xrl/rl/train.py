"""The training loop: collect whole episodes, update with PPO, log, checkpoint; resumable exactly.

    for update in range(updates):
        rollout = collector.collect(policy weights, update)     episodes on the training graphs
        stats   = ppo_update(policy, optimizer, rollout)         clipped PPO + GAE
        every eval_every updates: one greedy episode per graph   (train and held-out)
        log metrics; every checkpoint_every updates: checkpoint  (atomic; last.pt and best.pt)

`cfg` is the Hydra config of `conf/train.yaml` (or any mapping with the same keys); `train` knows
nothing of Hydra itself, so tests and scripts call it directly.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xrl.errors import ConfigError
from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM
from xrl.nn.encoders import EncoderConfig
from xrl.nn.policy import GraphPolicy, PolicyConfig
from xrl.rl.checkpoint import CheckpointError, load_checkpoint, restore_rng, rng_state, save_checkpoint
from xrl.rl.imitation import ImitationConfig, warm_start
from xrl.rl.loggers import make_logger, plot_learning_curves
from xrl.rl.ppo import PPOConfig, ppo_update
from xrl.rl.rollout import CollectorSpec, EpisodeRecord, make_collector


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


def _plain(cfg: Any) -> dict[str, Any]:
    """A Hydra/OmegaConf config, or a mapping, as plain resolved dicts."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except ImportError:  # pragma: no cover - hydra is a dependency
        pass
    return {k: _plain(v) if isinstance(v, Mapping) else v for k, v in dict(cfg).items()}


def _take(cls: type, section: Mapping[str, Any], what: str, ignore: Sequence[str] = ()) -> Any:
    """Build dataclass `cls` from a config section, naming any key it does not know."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(section) - names - set(ignore))
    if unknown:
        raise ConfigError(f"{what} has no setting {', '.join(map(repr, unknown))}; "
                          f"its settings: {', '.join(sorted(names))}")
    defaults = {f.name: f.default for f in fields(cls)}
    return cls(**{k: _typed(f"{what}.{k}", v, defaults[k]) for k, v in section.items() if k in names})


def _typed(key: str, value: Any, default: Any) -> Any:
    """`value` as the type of the setting's default (int, float, bool); ConfigError if it is not one."""
    if value is None or default is None or isinstance(default, str):
        return value
    kind = type(default)
    ok = isinstance(value, bool) if kind is bool else isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or (kind is int and value != int(value)):
        raise ConfigError(f"{key} must be {'true or false' if kind is bool else f'a number ({kind.__name__})'}, "
                          f"not {value!r}")
    return kind(value)


# Bounds of the numeric settings, checked before any work: a typo (hidden=100000000, lr=-1) is one line and
# exit code 2, not a traceback after minutes or an allocation that takes the machine.
_BOUNDS: dict[str, tuple[float, float, str]] = {  # key: (low, high, what the bounds mean); inclusive
    "updates": (1, 1_000_000, ""),
    "episodes_per_worker": (1, 10_000, "each update trains on whole episodes"),
    "workers": (0, 1024, ""),
    "eval_every": (0, 1_000_000, ""),
    "checkpoint_every": (0, 1_000_000, ""),
    "cache_size": (0, 1_000_000, ""),
    "torch_threads": (0, 1024, ""),
    "model.hidden": (1, 4096, ""),
    "model.layers": (1, 64, ""),
    "model.heads": (1, 64, ""),
    "model.dropout": (0, 0.999, ""),
    "algo.lr": (1e-12, 1.0, "a positive learning rate"),
    "algo.gamma": (0, 1, ""),
    "algo.gae_lambda": (0, 1, ""),
    "algo.clip_coef": (1e-9, 10, ""),
    "algo.update_epochs": (1, 10_000, ""),
    "algo.minibatch_size": (1, 1_000_000, ""),
    "algo.ent_coef": (0, 1e6, ""),
    "algo.vf_coef": (0, 1e6, ""),
    "algo.max_grad_norm": (1e-12, 1e12, ""),
    "algo.target_kl": (1e-12, 1e6, ""),
    "algo.encode_chunk": (0, 1_000_000, ""),
    "env.horizon": (1, 100_000, ""),
    "env.max_candidates": (0, 1_000_000, ""),
    "env.reward_every": (1, 100_000, ""),
    "env.gamma": (0, 1, ""),
}
WORKER_MEMORY = 1 << 30  # what one rollout process may need (a policy, an engine, cached features): 1 GiB


def check_settings(c: Mapping[str, Any]) -> None:
    """ConfigError unless every numeric setting is a finite number within its bounds, and the rollout
    workers fit this machine's cores and available memory."""
    for key, (low, high, why) in _BOUNDS.items():
        section, _, name = key.rpartition(".")
        holder = c.get(section) if section else c
        value = holder.get(name) if isinstance(holder, Mapping) else None
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key} must be a number, not {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number, not {value!r}")
        if not low <= value <= high:
            bound = f"at least {low:g}" if value < low else f"at most {high:g}"
            raise ConfigError(f"{key}={value} is out of range: {name} must be {bound}" + (f" ({why})" if why else ""))
    workers = c.get("workers")
    kind = (c.get("collector") or {}).get("kind", "process") if isinstance(c.get("collector"), Mapping) else "process"
    if isinstance(workers, int) and workers > 0 and kind == "process":
        import os

        cores = os.cpu_count() or 1
        if workers > cores:
            raise ConfigError(f"workers={workers} is more rollout processes than this machine's {cores} cores; "
                              f"use at most {cores} (0: play in the training process)")
        available = _available_memory()
        if available is not None and workers * WORKER_MEMORY > available:
            raise ConfigError(f"workers={workers} rollout processes may need {workers} GiB, and this machine has "
                              f"{available / 2 ** 30:.1f} GiB available; use fewer workers")


def _available_memory() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), in bytes; None elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def policy_config(model: Mapping[str, Any]) -> PolicyConfig:
    model = dict(model)
    use_hints = bool(model.pop("use_hints", True))
    incremental = _typed("model.incremental", model.pop("incremental", True), True)
    return PolicyConfig(NODE_DIM, EDGE_DIM, GLOBAL_DIM, _take(EncoderConfig, model, "model"), use_hints=use_hints,
                        incremental=incremental)


def env_kwargs(env: Mapping[str, Any]) -> dict[str, Any]:
    """GraphRewriteEnv keyword arguments from the `env` config section, type-checked."""
    defaults = {"horizon": 50, "reward": "dense", "reward_every": 1, "shaping": "none", "gamma": 0.99,
                "max_candidates": 0}
    unknown = sorted(set(env) - set(defaults))
    if unknown:
        raise ConfigError(f"env has no setting {', '.join(map(repr, unknown))}; its settings: {', '.join(defaults)}")
    return {k: _typed(f"env.{k}", v, defaults[k]) for k, v in env.items()}


def _geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def _episode_metrics(episodes: Sequence[EpisodeRecord]) -> dict[str, float]:
    m: dict[str, float] = {
        "episodes": float(len(episodes)),
        "episode_return": float(np.mean([e.ret for e in episodes])),
        "episode_length": float(np.mean([e.length for e in episodes])),
        "speedup_mean": _geomean([e.speedup for e in episodes]),
        "best_speedup_mean": _geomean([e.best_speedup for e in episodes]),
    }
    for name in sorted({e.graph for e in episodes}):
        m[f"speedup/{name}"] = float(np.mean([e.speedup for e in episodes if e.graph == name]))
    return m


def _eval_metrics(records: Sequence[EpisodeRecord], train_graphs: Sequence[str],
                  val_graphs: Sequence[str] = ()) -> dict[str, float]:
    """Greedy-episode speed-ups per graph; geomeans over the training, validation and held-out graphs apart."""
    m = {f"eval_speedup/{r.graph}": r.speedup for r in records}
    train = [r.speedup for r in records if r.graph in train_graphs]
    val = [r.speedup for r in records if r.graph in val_graphs]
    held = [r.speedup for r in records if r.graph not in train_graphs and r.graph not in val_graphs]
    m["eval_speedup_mean"] = _geomean(train)
    if val:
        m["eval_val_speedup_mean"] = _geomean(val)
    if held:
        m["eval_heldout_speedup_mean"] = _geomean(held)
    return m


def imitation_config(section: Mapping[str, Any]) -> ImitationConfig:
    """The `imitation` section: teachers (a list of search methods), their options, and scalar settings."""
    section = dict(section)
    teachers = section.pop("teachers", None) or ()
    options = section.pop("teacher_options", None) or {}
    if isinstance(teachers, str) or not all(isinstance(t, str) for t in teachers):
        raise ConfigError(f"imitation.teachers must be a list of search methods, not {teachers!r}")
    return dataclasses.replace(_take(ImitationConfig, section, "imitation"), teachers=tuple(teachers),
                               teacher_options={k: dict(v) for k, v in dict(options).items()})


def _selection_key(val_graphs: Sequence[str]) -> str:
    """The metric best.pt is chosen by: the validation graphs' geomean, or the training graphs' without any."""
    return "eval_val_speedup_mean" if val_graphs else "eval_speedup_mean"


def _init_weights(policy: GraphPolicy, pcfg: PolicyConfig, source: str) -> None:
    """Start from the weights of a policy file (`default`: the shipped one): fine-tuning, as opposed to
    resuming, gets a fresh optimizer, update count and history. The network must be the same."""
    from xrl.rl.checkpoint import default_policy_path

    path = default_policy_path() if source == "default" else Path(source)
    ckpt = load_checkpoint(path)
    theirs = dataclasses.replace(PolicyConfig.from_dict(ckpt["policy_config"]), incremental=pcfg.incremental)
    if theirs != pcfg:
        raise ConfigError(f"init_from={source}: its network ({theirs.encoder}, use_hints={theirs.use_hints}) differs "
                          f"from model= ({pcfg.encoder}, use_hints={pcfg.use_hints}); set model to match it")
    policy.load_state_dict(ckpt["model"])


def train(cfg: Mapping[str, Any], out_dir: str | Path) -> TrainSummary:
    """Train a policy as `cfg` says (see conf/train.yaml), writing checkpoints and logs under `out_dir`."""
    c = json.loads(json.dumps(_plain(cfg), default=str))  # plain values only: checkpoints load weights_only
    if (c.get("env") or {}).get("name") == "pass_ordering":  # xrl/PassOrdering-v0: an MLP policy, its own loop
        from xrl.rl.train_passes import train_passes

        return train_passes(c, out_dir)
    check_settings(c)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seed = _typed("seed", c.get("seed", 0), 0)
    # The learner on one torch thread (0: torch's default): on a busy machine torch's pool spin-waits and
    # a PPO update took 2.4x longer on 2 threads than on 1 (2 cores, 2 other busy processes); on an idle
    # 2-core machine 2 threads were 1.27x faster. Rollout workers always run on one thread each.
    threads = _typed("torch_threads", c.get("torch_threads", 1), 0)
    if threads > 0:
        torch.set_num_threads(threads)
    updates = _typed("updates", c["updates"], 0)
    ppo = _take(PPOConfig, c["algo"], "algo", ignore=("name",))
    pcfg = policy_config(c["model"])
    train_graphs = tuple(c["graphs"]["train"])
    eval_graphs = tuple(c["graphs"].get("eval") or ())
    val_graphs = tuple(c["graphs"].get("val") or ())  # best.pt is chosen on these; eval graphs are reported only
    if not train_graphs:
        raise ConfigError("graphs.train is empty: name at least one built-in graph to train on")
    if set(val_graphs) & set(train_graphs):
        raise ConfigError(f"graphs.val and graphs.train share {sorted(set(val_graphs) & set(train_graphs))}: "
                          "a checkpoint is chosen on graphs it was not trained on")
    cost = c.get("cost", {})
    spec = CollectorSpec(graphs=train_graphs, policy=pcfg, env=env_kwargs(c.get("env", {})),
                         cost=cost.get("name", "analytic"), device=cost.get("device", "h100"),
                         episodes_per_worker=_typed("episodes_per_worker", c.get("episodes_per_worker", 4), 0),
                         seed=seed, cache_size=_typed("cache_size", c.get("cache_size", 4096), 0))

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    ppo_rng = np.random.default_rng(seed)
    policy = GraphPolicy(pcfg)
    optimizer = torch.optim.Adam(policy.parameters(), lr=ppo.lr, eps=1e-5)
    start, env_steps, history, wandb_id = 0, 0, [], None
    best_score = -math.inf
    resume, init_from = c.get("resume"), c.get("init_from")
    if resume and init_from:
        raise ConfigError("set resume (continue a run) or init_from (start a new run from a policy's weights), "
                          "not both")
    if init_from:
        _init_weights(policy, pcfg, init_from)
    if resume:
        ckpt = load_checkpoint(resume)
        if "optimizer" not in ckpt or "rng" not in ckpt:
            raise CheckpointError(f"{resume} holds a policy only (no optimizer or RNG state); it cannot be resumed")
        # `incremental` is how candidates are encoded, not the network: a run may resume with either.
        if dataclasses.replace(PolicyConfig.from_dict(ckpt["policy_config"]), incremental=pcfg.incremental) != pcfg:
            raise ConfigError(f"{resume} was trained with a different model config; resume with the same model")
        policy.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        restore_rng(ckpt["rng"], ppo_rng)
        start, env_steps = int(ckpt["update"]), int(ckpt["env_steps"])
        history = list(ckpt.get("history", []))
        wandb_id = ckpt.get("metadata", {}).get("wandb_id")
        best_score = float(ckpt.get("metadata", {}).get("best_score", -math.inf))
    if start >= updates:
        raise ConfigError(f"the run already has {start} updates; raise `updates` above {start} to train further")
    imitation = imitation_config(c.get("imitation") or {})
    initial = GraphPolicy(pcfg) if init_from and not resume else None  # evaluated as update 0 (below)
    if initial is not None:
        initial.load_state_dict(policy.state_dict())
    demos: list = []
    if imitation.teachers and not resume:  # a resumed run was warm-started when it began
        from xrl.cost import get_cost_model
        from xrl.env import resolve_graph

        report, demos = warm_start(policy, {g: resolve_graph(g) for g in train_graphs},
                                   get_cost_model(spec.cost, device=spec.device), spec.env, imitation, seed=seed)
        (out / "imitation.json").write_text(json.dumps(report, indent=1))
    elif imitation.rehearse:
        raise ConfigError("imitation.rehearse needs imitation.teachers (and is not available on resume)")
    rehearsal = torch.optim.Adam(policy.parameters(), lr=imitation.lr, eps=1e-5) if imitation.rehearse else None

    log_cfg = c.get("logger", {}) or {}
    logger = make_logger(log_cfg.get("kind", "none"), out, project=log_cfg.get("project", "xrl"),
                         mode=log_cfg.get("mode", "offline"), name=log_cfg.get("name"), config=c,
                         append=bool(resume), wandb_id=wandb_id, group=log_cfg.get("group"), tags=log_cfg.get("tags"))
    run_id = next((lg.run_id for lg in logger.loggers if hasattr(lg, "run_id")), None)

    eval_every = _typed("eval_every", c.get("eval_every", 0), 0)
    ckpt_every = _typed("checkpoint_every", c.get("checkpoint_every", 0), 0)
    last_path, best_path = out / "last.pt", None
    t_start = time.perf_counter()

    def checkpoint(path: Path, update: int, net: GraphPolicy = policy) -> Path:
        return save_checkpoint(path, net, optimizer=optimizer, update=update, env_steps=env_steps,
                               rng=rng_state(ppo_rng), config=c, history=history,
                               metadata={"wandb_id": run_id, "best_score": best_score,
                                         "train_graphs": list(train_graphs), "val_graphs": list(val_graphs),
                                         "eval_graphs": list(eval_graphs), "selected_by": _selection_key(val_graphs)})

    from tqdm import tqdm

    bar = tqdm(range(start, updates), initial=start, total=updates, desc="train", unit="update",
               disable=not c.get("progress", True), dynamic_ncols=True)
    collector = make_collector(spec, _typed("workers", c.get("workers", 2), 0), c.get("collector"))
    eval_graphs_all = list(dict.fromkeys(train_graphs + val_graphs + eval_graphs))
    try:
        if initial is not None:  # fine-tuning: the policy it starts from is a candidate for best.pt too
            metrics = {**_eval_metrics(collector.evaluate(initial.state_dict(), eval_graphs_all), train_graphs,
                                       val_graphs), "time_s": time.perf_counter() - t_start}
            history.append({"update": 0, **metrics})
            logger.log(metrics, 0)
            best_score = metrics.get(_selection_key(val_graphs), -math.inf)
            best_path = checkpoint(out / "best.pt", 0, initial)
        for update in bar:
            if ppo.anneal_lr:
                for group in optimizer.param_groups:
                    group["lr"] = ppo.lr * (1.0 - update / updates)
            rollout = collector.collect(policy.state_dict(), update)
            t_upd = time.perf_counter()
            stats = ppo_update(policy, optimizer, rollout.to_batch(), ppo, ppo_rng)
            if rehearsal is not None:  # the teachers' sequences again, so that PPO does not unlearn them
                from xrl.rl.imitation import clone

                stats["rehearse_nll"] = clone(policy, demos, imitation, seed=seed + update + 1,
                                              epochs=imitation.rehearse, optimizer=rehearsal)[-1]["nll"]
            env_steps += len(rollout)
            metrics = {**_episode_metrics(rollout.episodes), **stats, "env_steps": float(env_steps),
                       "states": float(len(rollout)), "steps_per_s": len(rollout) / max(rollout.collect_s, 1e-9),
                       "collect_s": rollout.collect_s, "update_s": time.perf_counter() - t_upd,
                       "lr": optimizer.param_groups[0]["lr"],
                       # the measured kernel cost's work for this update (nothing under an estimate)
                       **{f"cost_{k}": v for k, v in rollout.cost_stats.items()}}
            done = update + 1
            evaluated = (eval_every and done % eval_every == 0) or done == updates
            if evaluated:
                records = collector.evaluate(policy.state_dict(), eval_graphs_all)
                metrics.update(_eval_metrics(records, train_graphs, val_graphs))
            metrics["time_s"] = time.perf_counter() - t_start
            history.append({"update": done, **metrics})
            logger.log(metrics, done)
            score = metrics.get(_selection_key(val_graphs), -math.inf)
            if evaluated and score >= best_score:  # ties: the later, longer-trained policy
                best_score = score
                best_path = checkpoint(out / "best.pt", done)
            bar.set_postfix(speedup=f"{metrics['speedup_mean']:.3f}", ret=f"{metrics['episode_return']:.2f}")
            if (ckpt_every and done % ckpt_every == 0) or done == updates:
                checkpoint(last_path, done)
    finally:
        collector.close()
        logger.close()
        bar.close()
    curves = plot_learning_curves(history, out / "learning_curves.png")
    if best_path is None and (out / "best.pt").exists():
        best_path = out / "best.pt"
    return TrainSummary(out, updates, env_steps, time.perf_counter() - t_start, last_path, best_path, history, curves)
