"""Clipped PPO with GAE over variable-size meta-graphs, read top to bottom (after CleanRL's ppo.py).

One update, given a rollout of whole episodes (states s_t, group-local actions a_t, their log-probs
and values under the policy that acted, rewards r_t, and d_t = 1 where s_t's step ended an episode):

    delta_t = r_t + gamma * V(s_{t+1}) * (1 - d_t) - V(s_t)
    A_t     = delta_t + gamma * lambda * (1 - d_t) * A_{t+1}            (GAE)
    R_t     = A_t + V(s_t)                                              (value target)

    ratio   = exp(log pi(a_t|s_t) - log pi_old(a_t|s_t))
    L_pi    = mean(max(-A_t * ratio, -A_t * clip(ratio, 1 - eps, 1 + eps)))
    L_V     = 0.5 * mean(max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2))   (or unclipped)
    L       = L_pi - c_ent * mean(H) + c_V * L_V

for `update_epochs` passes over shuffled minibatches of states (A normalised per minibatch),
gradients clipped to `max_grad_norm`, stopping early once the approximate KL passes `target_kl`.
A minibatch is any number of states: their meta-graphs are collated into one disjoint union,
`encode_chunk` states at a time. Every term of L is a mean over the minibatch's states, so

    L = sum_k (n_k / n) L_k        (L_k: the same terms over chunk k's n_k states, A normalised over all n)

and the chunks' gradients, accumulated, are the minibatch's: the same update (up to float rounding)
with one chunk's autograd graph alive at a time, not the whole minibatch's (the peak memory of training).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from xrl.features.incremental import IncrementalMeta
from xrl.features.metagraph import MetaGraph
from xrl.nn.distributions import GroupedCategorical
from xrl.nn.policy import GraphPolicy


@dataclass(frozen=True)
class PPOConfig:
    lr: float = 5e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    update_epochs: int = 4
    minibatch_size: int = 32  # states per minibatch
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    clip_vloss: bool = True
    target_kl: float | None = None
    anneal_lr: bool = False
    encode_chunk: int = 2  # states encoded per forward/backward pass within a minibatch (0: the whole minibatch)


def compute_gae(rewards: Tensor, values: Tensor, dones: Tensor, gamma: float, lam: float,
                last_value: float = 0.0) -> tuple[Tensor, Tensor]:
    """Advantages and returns [T] of a rollout; `dones[t]` = 1 where step t ended its episode.

    `last_value` bootstraps a rollout cut mid-episode (0 when the last step ended its episode).
    """
    T = rewards.numel()
    advantages = torch.zeros(T, dtype=torch.float32)
    last_gae = 0.0
    for t in reversed(range(T)):
        next_nonterminal = 1.0 - float(dones[t])
        next_value = float(values[t + 1]) if t + 1 < T else last_value
        delta = float(rewards[t]) + gamma * next_value * next_nonterminal - float(values[t])
        last_gae = delta + gamma * lam * next_nonterminal * last_gae
        advantages[t] = last_gae
    return advantages, advantages + values.float()


@dataclass
class PPOLosses:
    loss: Tensor
    policy_loss: Tensor
    value_loss: Tensor
    entropy: Tensor
    approx_kl: Tensor
    clip_fraction: Tensor


def normalize_advantages(advantages: Tensor, cfg: PPOConfig) -> Tensor:
    """A minibatch's advantages, standardised if `cfg.norm_adv` (and there is more than one)."""
    if cfg.norm_adv and advantages.numel() > 1:
        return (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    return advantages


def ppo_losses(new_logp: Tensor, old_logp: Tensor, advantages: Tensor, new_value: Tensor, old_value: Tensor,
               returns: Tensor, entropy: Tensor, cfg: PPOConfig, normalized: bool = False) -> PPOLosses:
    """The clipped surrogate, value and entropy terms of one minibatch (see the module docstring).

    `normalized`: the advantages are already normalised (over a minibatch this is a chunk of).
    """
    if not normalized:
        advantages = normalize_advantages(advantages, cfg)
    log_ratio = new_logp - old_logp
    ratio = log_ratio.exp()
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
    if cfg.clip_vloss:
        v_clipped = old_value + (new_value - old_value).clamp(-cfg.clip_coef, cfg.clip_coef)
        v_loss = 0.5 * torch.max((new_value - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((new_value - returns) ** 2).mean()
    ent = entropy.mean()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()  # http://joschu.net/blog/kl-approx.html
        clip_fraction = ((ratio - 1.0).abs() > cfg.clip_coef).float().mean()
    loss = pg_loss - cfg.ent_coef * ent + cfg.vf_coef * v_loss
    return PPOLosses(loss, pg_loss, v_loss, ent, approx_kl, clip_fraction)


def masked_stop(dist: GroupedCategorical, masked: Tensor) -> GroupedCategorical:
    """`dist` with each group's first action (the stop, candidate 0) removed where `masked` [G] is true."""
    keep = torch.ones_like(dist.logits, dtype=torch.bool)
    keep[dist.start[masked]] = False
    return GroupedCategorical(dist.logits, dist.group, dist.num_groups, keep)


@dataclass
class RolloutBatch:
    """A rollout flattened for PPO: one entry per state visited."""

    obs: Sequence[MetaGraph | IncrementalMeta]
    actions: Tensor  # [T] long, group-local
    logp: Tensor  # [T]
    values: Tensor  # [T]
    rewards: Tensor  # [T]
    dones: Tensor  # [T]
    stop_masked: Tensor | None = None  # [T] bool: the stop action was masked when sampled (rollout.MASK_STOP)

    def __len__(self) -> int:
        return len(self.obs)


def ppo_update(policy: GraphPolicy, optimizer: torch.optim.Optimizer, batch: RolloutBatch, cfg: PPOConfig,
               rng: np.random.Generator) -> dict[str, float]:
    """One PPO update over `batch`; returns the mean losses and diagnostics of its last epoch."""
    advantages, returns = compute_gae(batch.rewards, batch.values, batch.dones, cfg.gamma, cfg.gae_lambda)
    T = len(batch)
    policy.train()
    stats: dict[str, list[float]] = {}
    epochs_run = 0
    for _epoch in range(cfg.update_epochs):
        stats = {k: [] for k in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")}
        order = rng.permutation(T)
        for start in range(0, T, cfg.minibatch_size):
            idx = torch.as_tensor(order[start:start + cfg.minibatch_size], dtype=torch.long)
            n = idx.numel()
            adv = normalize_advantages(advantages[idx], cfg)
            chunk = cfg.encode_chunk if cfg.encode_chunk > 0 else n
            optimizer.zero_grad()
            sums = dict.fromkeys(stats, 0.0)
            for c0 in range(0, n, chunk):
                sub = idx[c0:c0 + chunk]
                meta = type(batch.obs[0]).collate([batch.obs[i] for i in sub.tolist()])
                dist, new_value = policy(meta)
                if batch.stop_masked is not None and bool(batch.stop_masked[sub].any()):
                    # the distribution the action was sampled from: stop masked where it was masked then
                    dist = masked_stop(dist, batch.stop_masked[sub])
                losses = ppo_losses(dist.log_prob(batch.actions[sub]), batch.logp[sub], adv[c0:c0 + chunk],
                                    new_value, batch.values[sub], returns[sub], dist.entropy(), cfg, normalized=True)
                w = sub.numel() / n
                (losses.loss * w if w != 1.0 else losses.loss).backward()
                for k in sums:
                    sums[k] += w * float(getattr(losses, k).detach())
                del dist, new_value, losses, meta  # this chunk's autograd graph goes before the next is built
            nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
            optimizer.step()
            for k in stats:
                stats[k].append(sums[k])
        epochs_run += 1
        if cfg.target_kl is not None and np.mean(stats["approx_kl"]) > cfg.target_kl:
            break
    out = {k: float(np.mean(v)) for k, v in stats.items()}
    var_y = float(returns.var()) if T > 1 else 0.0
    out["explained_variance"] = float("nan") if var_y == 0 else 1.0 - float((returns - batch.values).var()) / var_y
    out["epochs"] = float(epochs_run)
    return out
