"""The training configuration (conf/train.yaml, or any mapping with its keys), read and checked.

Every reader here turns a config section into typed values or raises one ConfigError that names the
setting: a typo is one line and exit code 2, not a traceback minutes into a run.

    plain(cfg)                a Hydra config as plain dicts
    take(cls, section, what)  a dataclass from a section, refusing keys it does not know
    typed(key, value, d)      a value as the type of its default
    check_settings(c)         numeric bounds, and whether the rollout workers fit this machine
    policy_config / env_kwargs / imitation_config   the `model`, `env` and `imitation` sections
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from xrl.errors import ConfigError
from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM
from xrl.nn.encoders import EncoderConfig
from xrl.nn.policy import PolicyConfig
from xrl.rl.imitation import ImitationConfig


def plain(cfg: Any) -> dict[str, Any]:
    """A Hydra/OmegaConf config, or a mapping, as plain resolved dicts."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except ImportError:  # pragma: no cover - hydra is a dependency
        pass
    return {k: plain(v) if isinstance(v, Mapping) else v for k, v in dict(cfg).items()}


def take(cls: type, section: Mapping[str, Any], what: str, ignore: Sequence[str] = ()) -> Any:
    """Build dataclass `cls` from a config section, naming any key it does not know."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(section) - names - set(ignore))
    if unknown:
        raise ConfigError(f"{what} has no setting {', '.join(map(repr, unknown))}; "
                          f"its settings: {', '.join(sorted(names))}")
    defaults = {f.name: f.default for f in fields(cls)}
    return cls(**{k: typed(f"{what}.{k}", v, defaults[k]) for k, v in section.items() if k in names})


def typed(key: str, value: Any, default: Any) -> Any:
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
BOUNDS: dict[str, tuple[float, float, str]] = {  # key: (low, high, what the bounds mean); inclusive
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
    for key, (low, high, why) in BOUNDS.items():
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
        cores = os.cpu_count() or 1
        if workers > cores:
            raise ConfigError(f"workers={workers} is more rollout processes than this machine's {cores} cores; "
                              f"use at most {cores} (0: play in the training process)")
        available = available_memory()
        if available is not None and workers * WORKER_MEMORY > available:
            raise ConfigError(f"workers={workers} rollout processes may need {workers} GiB, and this machine has "
                              f"{available / 2 ** 30:.1f} GiB available; use fewer workers")


def available_memory() -> int | None:
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
    """The graph policy's network from the `model` section."""
    model = dict(model)
    use_hints = bool(model.pop("use_hints", True))
    incremental = typed("model.incremental", model.pop("incremental", True), True)
    residual = bool(model.pop("residual_prior", False))
    temperature = float(model.pop("prior_temperature", 1.0))
    return PolicyConfig(NODE_DIM, EDGE_DIM, GLOBAL_DIM, take(EncoderConfig, model, "model"), use_hints=use_hints,
                        incremental=incremental, residual_prior=residual, prior_temperature=temperature)


def env_kwargs(env: Mapping[str, Any]) -> dict[str, Any]:
    """GraphRewriteEnv keyword arguments from the `env` config section, type-checked."""
    defaults = {"horizon": 50, "reward": "dense", "reward_every": 1, "shaping": "none", "gamma": 0.99,
                "max_candidates": 0}
    unknown = sorted(set(env) - set(defaults))
    if unknown:
        raise ConfigError(f"env has no setting {', '.join(map(repr, unknown))}; its settings: {', '.join(defaults)}")
    return {k: typed(f"env.{k}", v, defaults[k]) for k, v in env.items()}


def imitation_config(section: Mapping[str, Any]) -> ImitationConfig:
    """The `imitation` section: teachers (a list of search methods), their options, and scalar settings."""
    section = dict(section)
    teachers = section.pop("teachers", None) or ()
    options = section.pop("teacher_options", None) or {}
    if isinstance(teachers, str) or not all(isinstance(t, str) for t in teachers):
        raise ConfigError(f"imitation.teachers must be a list of search methods, not {teachers!r}")
    return dataclasses.replace(take(ImitationConfig, section, "imitation"), teachers=tuple(teachers),
                               teacher_options={k: dict(v) for k, v in dict(options).items()})
