"""The rule-level head of the factored action (xrl.rl.factored): a learned score per rewrite rule, read from the
policy's encoding of the state alone (no candidate built).

    correction(r, s) = e_r . h_s        e_r: a learned embedding per rule of the rule set, zero at initialisation

Zero-initialised, the head adds nothing: the untrained factored policy is the rule-level cost prior it corrects.
A rule outside the head's vocabulary (a rule set the head was not made for) gets no correction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from xrl.features.metagraph import CAND_DIM, STATE_DIM, build_metagraph


class RuleHead(nn.Module):
    def __init__(self, rules: Sequence[str], hidden: int, *, seed: int = 0) -> None:
        super().__init__()
        self.rules = list(rules)
        self.index = {r: i for i, r in enumerate(self.rules)}
        self.embedding = nn.Embedding(len(self.rules) + 1, hidden)  # the last row: rules outside the vocabulary
        nn.init.zeros_(self.embedding.weight)
        self.seed = seed  # the initialisation is zero; the seed is kept for a head that starts elsewhere

    def forward(self, h_s: Tensor, rules: Sequence[str]) -> Tensor:
        """The correction [len(rules)] of each rule at the state whose embedding is h_s [H]."""
        ids = torch.tensor([self.index.get(r, len(self.rules)) for r in rules], dtype=torch.long)
        emb = self.embedding(ids)
        emb = torch.where((ids < len(self.rules)).unsqueeze(1), emb, torch.zeros_like(emb))
        return emb @ h_s


def state_encoder(policy: Any) -> Callable[[Any], Tensor]:
    """graph -> the policy's encoding of the state alone, h_s [H] (no candidate featurised or encoded)."""
    from xrl.features.incremental import IncrementalFeatures

    feats = policy.features()

    def encode(graph: Any) -> Tensor:
        with torch.no_grad():
            if isinstance(feats, IncrementalFeatures):
                h_s, _ = policy.encoder.encode_incremental(feats(graph, [], torch.zeros(1, CAND_DIM),
                                                                 torch.zeros(STATE_DIM)))
                return h_s[0]
            g = build_metagraph(feats(graph), []).graphs
            return policy.encoder(g.x, g.edge_index, g.edge_attr, g.u, g.batch)[0]

    return encode


__all__ = ["RuleHead", "state_encoder"]
