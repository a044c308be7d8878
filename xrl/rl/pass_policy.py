"""The pass-ordering policy: a small MLP actor-critic over the op-count observation, and its checkpoints.

    features(obs)            the MLP's input from a PassOrderingEnv observation
    PassObs                  one state as PPO stores it (collates into tensors)
    PassPolicy               actor (a masked logit per pass) and critic, as `ppo_update` asks of a policy
    save/load_pass_checkpoint, load_pass_policy     the `xrl-pass-policy/1` checkpoint format
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from xrl.env.passes import PASSES, op_vocab
from xrl.rl.checkpoint import CheckpointError, atomic_torch_save, read_checkpoint

FORMAT = "xrl-pass-policy/1"
_MASKED = -1e8  # logit of a masked pass (not -inf: the entropy of a masked categorical stays finite)


# ----- policy --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PassPolicyConfig:
    obs_dim: int
    num_actions: int
    hidden: int = 64
    layers: int = 2
    passes: tuple[str, ...] = PASSES  # what the action indices mean; a checkpoint is refused if xrl's differ


def features(obs: Mapping[str, np.ndarray]) -> np.ndarray:
    """The MLP's input: log op counts (graphs differ by 100x in size), progress, idle flags."""
    return np.concatenate([np.log1p(np.asarray(obs["op_counts"], np.float32)), np.asarray(obs["progress"], np.float32),
                           np.asarray(obs["idle"], np.float32)]).astype(np.float32)


@dataclass
class PassObs:
    """One state as PPO stores it; `collate` is what `ppo_update` calls on a minibatch."""

    x: np.ndarray
    mask: np.ndarray

    @staticmethod
    def collate(items: Sequence[PassObs]) -> tuple[Tensor, Tensor]:
        return (torch.as_tensor(np.stack([o.x for o in items])),
                torch.as_tensor(np.stack([o.mask for o in items]), dtype=torch.bool))


def _mlp(cfg: PassPolicyConfig, out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = cfg.obs_dim
    for _ in range(cfg.layers):
        layers += [nn.Linear(width, cfg.hidden), nn.Tanh()]
        width = cfg.hidden
    return nn.Sequential(*layers, nn.Linear(width, out))


class PassPolicy(nn.Module):
    """Actor (a logit per pass, masked) and critic as two MLPs: rewards are percentages, so the value
    loss is large, and a shared trunk would let it drown the policy's gradient (CleanRL/sb3 do the same)."""

    def __init__(self, cfg: PassPolicyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.actor = _mlp(cfg, cfg.num_actions)
        self.critic = _mlp(cfg, 1)

    def forward(self, batch: tuple[Tensor, Tensor]) -> tuple[torch.distributions.Categorical, Tensor]:
        x, mask = batch
        logits = self.actor(x).masked_fill(~mask, _MASKED)
        return torch.distributions.Categorical(logits=logits), self.critic(x).squeeze(-1)

    @torch.no_grad()
    def act(self, obs: PassObs, greedy: bool) -> tuple[int, float, float]:
        """(action, its log-prob, value) for one state; greedy: the most likely pass, else a sample."""
        dist, value = self(PassObs.collate([obs]))
        action = dist.probs.argmax(-1) if greedy else dist.sample()
        return int(action), float(dist.log_prob(action)), float(value)

    def chooser(self):  # noqa: ANN201 - an xrl.env.pass_order.Policy
        """The greedy policy as `evaluate_orders` / `run_order` call it."""
        self.eval()
        return lambda env, obs: self.act(PassObs(features(obs), env.action_masks()), greedy=True)[0]


# ----- checkpoints ---------------------------------------------------------------------------------
def save_pass_checkpoint(path: Path, policy: PassPolicy, **entries: Any) -> Path:
    cfg = asdict(policy.cfg)
    cfg["passes"] = list(cfg["passes"])
    return atomic_torch_save({"format": FORMAT, "policy_config": cfg,
                              "model": {k: v.detach().cpu() for k, v in policy.state_dict().items()}, **entries}, path)


def load_pass_checkpoint(path: str | Path) -> dict[str, Any]:
    return read_checkpoint(path, fmt=FORMAT, what="pass-ordering policy",
                           missing_hint="train one with `xrl train env=pass_ordering`",
                           wrong_hint="a rewrite policy is evaluated by `xrl eval` without --env pass_ordering")


def load_pass_policy(path: str | Path) -> tuple[PassPolicy, dict[str, Any]]:
    ckpt = load_pass_checkpoint(path)
    try:
        cfg = PassPolicyConfig(**{**ckpt["policy_config"], "passes": tuple(ckpt["policy_config"]["passes"])})
        policy = PassPolicy(cfg)
        policy.load_state_dict(ckpt["model"])
    except (KeyError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"{path}: the stored policy does not fit this version of xrl ({e})") from None
    if cfg.passes != PASSES or cfg.obs_dim != obs_dim():
        raise CheckpointError(f"{path} was trained on other passes or op types than this xrl has; retrain it")
    policy.eval()
    return policy, ckpt


def obs_dim() -> int:
    """The length of `features`: an op count per op type, progress, an idle flag per pass."""
    return len(op_vocab()) + 1 + len(PASSES)
