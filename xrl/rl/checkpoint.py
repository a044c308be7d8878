"""Checkpoints: the policy (with the config that rebuilds it), and for training the optimizer, RNG
states and counters that let `resume=PATH` continue exactly where the run stopped.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so it loads with
`torch.load(weights_only=True)`: opening a policy file never runs code from it. Files are written
to a temporary name beside the target and renamed over it, so a crash never leaves half a file.
Every checkpoint carries a SHA-256 of its contents (`checksum`), checked on every load: a changed
weight is refused, not silently used. A file written before checksums (no `checksum` entry) loads
with a warning.
"""

from __future__ import annotations

import hashlib
import random
import struct
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xrl.atomic import atomic_write
from xrl.errors import XrlError, XrlWarning
from xrl.nn.policy import GraphPolicy, PolicyConfig
from xrl.rl.policy_files import (  # noqa: F401 - part of this module's API
    MISSING_HINT,
    default_policy_path,
    resolve_policy_path,
    shipped_policy_names,
    shipped_policy_path,
)

FORMAT = "xrl-policy/1"


class CheckpointError(XrlError):
    """A policy or training checkpoint that is missing, unreadable, or not an xrl checkpoint."""


CHECKSUM = "checksum"  # the entry holding "sha256:<hex>" of every other entry


def content_digest(obj: Any) -> str:
    """SHA-256 of a checkpoint's contents (without its checksum entry), independent of how torch
    serialises them: tensors by dtype, shape and bytes; dicts by sorted keys; numbers by repr."""
    h = hashlib.sha256()

    def feed(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(b"T" + str(t.dtype).encode() + repr(tuple(t.shape)).encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(x, dict):
            h.update(b"D" + struct.pack("<q", len(x)))
            for k in sorted(x, key=repr):
                if x is obj and k == CHECKSUM:
                    continue
                feed(k)
                feed(x[k])
        elif isinstance(x, list | tuple):
            h.update(b"L" + struct.pack("<q", len(x)))
            for v in x:
                feed(v)
        elif isinstance(x, np.ndarray):
            feed(torch.from_numpy(np.ascontiguousarray(x)))
        else:  # str, int, float, bool, None, numpy scalars: their repr says type and value
            h.update(b"S" + type(x).__name__.encode() + b":" + repr(x).encode() + b";")

    feed(obj)
    return "sha256:" + h.hexdigest()


def with_checksum(ckpt: dict[str, Any]) -> dict[str, Any]:
    return {**ckpt, CHECKSUM: content_digest({k: v for k, v in ckpt.items() if k != CHECKSUM})}


def verify_checksum(ckpt: dict[str, Any], path: str | Path) -> None:
    """CheckpointError when the stored checksum does not match the contents; a warning when there is none."""
    stored = ckpt.get(CHECKSUM)
    if stored is None:
        warnings.warn(f"{path} carries no checksum (written by an older xrl): its weights cannot be checked; "
                      "save it again (`xrl train resume=...` or export_policy) to add one", XrlWarning, stacklevel=3)
        return
    actual = content_digest({k: v for k, v in ckpt.items() if k != CHECKSUM})
    if stored != actual:
        raise CheckpointError(f"{path} is corrupt: its contents do not match its checksum (the file was changed "
                              "after xrl wrote it); use another checkpoint")


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """Write `obj` (a dict gets its checksum entry) to a temporary beside `path`, then rename it over `path`."""
    if isinstance(obj, dict):
        obj = with_checksum(obj)
    path = Path(path)
    with atomic_write(path, mkdir=True) as pending, pending.open("wb") as f:
        torch.save(obj, f)
    return path


def rng_state(np_rng: np.random.Generator) -> dict[str, Any]:
    """Every RNG the trainer draws from, as weights_only-loadable values."""
    return {"torch": torch.get_rng_state(), "numpy_ppo": np_rng.bit_generator.state, "python": random.getstate()}


def restore_rng(state: dict[str, Any], np_rng: np.random.Generator) -> None:
    torch.set_rng_state(state["torch"])
    np_rng.bit_generator.state = state["numpy_ppo"]
    random.setstate(_as_tuple(state["python"]))


def _as_tuple(x: Any) -> Any:
    return tuple(_as_tuple(v) for v in x) if isinstance(x, list | tuple) else x


def save_checkpoint(path: str | Path, policy: GraphPolicy, *, optimizer: torch.optim.Optimizer | None = None,
                    update: int = 0, env_steps: int = 0, rng: dict[str, Any] | None = None,
                    config: dict[str, Any] | None = None, history: list[dict[str, Any]] | None = None,
                    metadata: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint atomically; without `optimizer` and `rng` it is a policy file only."""
    ckpt: dict[str, Any] = {
        "format": FORMAT,
        "policy_config": policy.cfg.to_dict(),
        "model": {k: v.detach().cpu() for k, v in policy.state_dict().items()},
        "update": update,
        "env_steps": env_steps,
        "config": config or {},
        "metadata": metadata or {},
    }
    if optimizer is not None:
        ckpt["optimizer"] = optimizer.state_dict()
    if rng is not None:
        ckpt["rng"] = rng
    if history is not None:
        ckpt["history"] = history
    return atomic_torch_save(ckpt, path)


def read_checkpoint(path: str | Path, *, fmt: str, what: str, missing_hint: str, wrong_hint: str = ""
                    ) -> dict[str, Any]:
    """A checkpoint of format `fmt` read back and its checksum checked: the one reader behind the rewrite
    policy's and the pass-ordering policy's loaders. `what` names the kind in messages."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such {what} checkpoint ({missing_hint})")
    if path.is_dir():
        raise CheckpointError(f"{path} is a directory, not a {what} checkpoint file")
    if not path.is_file():  # a device (/dev/zero would be read until memory runs out) or a FIFO
        raise CheckpointError(f"{path} is not a regular file (a device or pipe); a {what} checkpoint is a file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # one line: torch's own message for a truncated file runs to several
        brief = next((line.strip() for line in str(e).splitlines() if line.strip()), "")[:200]
        raise CheckpointError(f"{path} is not a readable checkpoint, truncated or damaged ({type(e).__name__}"
                              f"{': ' + brief if brief else ''})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != fmt:
        found = ckpt.get("format") if isinstance(ckpt, dict) else None
        raise CheckpointError(f"{path} is not a {what} checkpoint (format {found!r}, expected {fmt})"
                              + (f"; {wrong_hint}" if wrong_hint else ""))
    verify_checksum(ckpt, path)
    return ckpt


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    return read_checkpoint(path, fmt=FORMAT, what="policy",
                           missing_hint=MISSING_HINT)


def load_policy(path: str | Path) -> tuple[GraphPolicy, dict[str, Any]]:
    """The policy stored in a checkpoint (in eval mode), and the checkpoint's other entries."""
    ckpt = load_checkpoint(path)
    try:
        stored = dict(ckpt["policy_config"])
        if "value_unit" not in stored and "value_head" in ckpt.get("metadata", {}):
            stored["value_unit"] = "state"  # written before the field: fit_value_head.py's head reads states so
        policy = GraphPolicy(PolicyConfig.from_dict(stored))
        policy.load_state_dict(ckpt["model"])
    except (KeyError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"{path}: the stored policy does not fit this version of xrl ({e})") from None
    _check_feature_dims(policy.cfg, path)
    policy.eval()
    return policy, ckpt


def export_policy(src: str | Path, dst: str | Path, metadata: dict[str, Any] | None = None) -> Path:
    """A policy-only copy of a training checkpoint (no optimizer, RNG or history): what ships."""
    ckpt = load_checkpoint(src)
    policy, _ = load_policy(src)
    meta = {**ckpt.get("metadata", {}), **(metadata or {})}
    meta.pop("wandb_id", None)
    return save_checkpoint(dst, policy, update=int(ckpt.get("update", 0)), env_steps=int(ckpt.get("env_steps", 0)),
                           config=ckpt.get("config", {}), metadata=meta)


def _check_feature_dims(cfg: PolicyConfig, path: str | Path) -> None:
    from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM

    if (cfg.node_dim, cfg.edge_dim, cfg.global_dim) != (NODE_DIM, EDGE_DIM, GLOBAL_DIM):
        raise CheckpointError(f"{path} was trained on features of size {(cfg.node_dim, cfg.edge_dim, cfg.global_dim)}"
                              f" but this xrl makes {(NODE_DIM, EDGE_DIM, GLOBAL_DIM)}; retrain the policy")
