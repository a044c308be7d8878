"""A categorical distribution per group over one flat vector of logits.

A batch of states has a different number of candidates per state (3 or 800); their scores are
concatenated into one vector `logits` [C] with `group` [C] naming each score's state. Groups are
contiguous and sorted (state 0's candidates, then state 1's, ...), and an action is the index of
a candidate *within* its group. Nothing is padded to a fixed candidate count, so a policy is not
tied to one (docs/architecture.md, "No padding to a fixed candidate count").

    log p(a | s) = l_a - logsumexp_{c in s} l_c          (masked candidates: l_c = -inf)
    H(s)         = -sum_{c in s} p_c log p_c             (a masked candidate adds 0)
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.utils import scatter, to_dense_batch


class GroupedCategorical:
    """One categorical distribution per group; every group must keep at least one unmasked entry."""

    def __init__(self, logits: Tensor, group: Tensor, num_groups: int, mask: Tensor | None = None) -> None:
        if logits.dim() != 1 or group.shape != logits.shape:
            raise ValueError(f"logits {tuple(logits.shape)} and group {tuple(group.shape)} must be equal 1-d shapes")
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        self.logits = logits
        self.group = group
        self.num_groups = num_groups
        counts = torch.bincount(group, minlength=num_groups)
        # start[g]: flat index of group g's first entry, so a group-local action a sits at start[g] + a.
        self.start = torch.cumsum(counts, 0) - counts
        self.counts = counts
        # Stable log-softmax per group: subtract the group's max before exponentiating.
        gmax = scatter(logits.detach(), group, dim=0, dim_size=num_groups, reduce="max")
        shifted = logits - gmax[group]
        lse = gmax + torch.log(scatter(shifted.exp(), group, dim=0, dim_size=num_groups, reduce="sum"))
        self.log_probs = logits - lse[group]  # [C]; -inf where masked

    @property
    def probs(self) -> Tensor:
        return self.log_probs.exp()

    def log_prob(self, actions: Tensor) -> Tensor:
        """[G] log-probability of each group's action (group-local indices)."""
        if (actions < 0).any() or (actions >= self.counts).any():
            raise IndexError("an action lies outside its group's candidates")
        return self.log_probs[self.start + actions]

    def entropy(self) -> Tensor:
        """[G] entropy of each group's distribution."""
        p = self.probs
        # mask the log-probs before multiplying: 0 * -inf in the unused branch of a where() makes NaN gradients
        terms = -p * torch.where(p > 0, self.log_probs, torch.zeros_like(p))
        return scatter(terms, self.group, dim=0, dim_size=self.num_groups, reduce="sum")

    def _argmax(self, keys: Tensor) -> Tensor:
        dense, _ = to_dense_batch(keys.unsqueeze(-1), self.group, fill_value=float("-inf"), batch_size=self.num_groups)
        return dense.squeeze(-1).argmax(dim=1)

    def mode(self) -> Tensor:
        """[G] the most likely action of each group (lowest index on ties)."""
        return self._argmax(self.logits.detach())

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """[G] one action per group, by the Gumbel-max trick: argmax(l + G), G ~ Gumbel(0, 1)."""
        u = torch.rand(self.logits.shape, generator=generator, dtype=self.logits.dtype, device=self.logits.device)
        exp1 = -torch.log(u.clamp_min(1e-20))  # Exp(1); G = -log(Exp(1))
        gumbel = -torch.log(exp1.clamp_min(1e-20))
        return self._argmax(self.logits.detach() + gumbel)
