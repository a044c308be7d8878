"""The actor-critic: a graph encoder shared by a candidate-scoring policy head and a value head.

For a state s with current graph G and candidates c (c = 0 is the no-op, whose graph is G):

    h_s = enc(G),  h_c = enc(G_c)
    score(c) = MLP([h_c, h_s, h_c - h_s, a_c])        a_c: the env's per-candidate hints (CAND_DIM)
    pi(. | s) = softmax over s's candidates of score   (GroupedCategorical: any number of candidates)
    V(s)     = MLP([h_s, b_s])                         b_s: per-state scalars (STATE_DIM)

Candidate scoring is per candidate, so one policy serves a state with 3 candidates and one with
800, and a graph never seen in training.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from xrl.features.incremental import IncrementalFeatures, IncrementalMeta
from xrl.features.metagraph import CAND_DIM, STATE_DIM, FeatureCache, MetaGraph
from xrl.nn.distributions import GroupedCategorical
from xrl.nn.encoders import EncoderConfig, GraphEncoder, mlp

VALUE_UNITS = ("start", "state")


@dataclass(frozen=True)
class PolicyConfig:
    """Everything needed to rebuild a policy network (stored in every checkpoint)."""

    node_dim: int
    edge_dim: int
    global_dim: int
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    use_hints: bool = True  # False: the policy sees the graphs alone (the env's hints are zeroed)
    # How candidates are encoded, not what the network is: True, each from the region it changes
    # (xrl.features.incremental, exact); False, each candidate graph whole (the old path, kept to compare).
    incremental: bool = True
    # Issue 32.3: score(c) = -hint_c / prior_temperature + a learned correction whose last layer starts at
    # zero, so the untrained policy IS the cost prior (xrl.rl.priors.CostPrior) and learning can only be
    # earned from there. The prior term reads the env's hints even where `use_hints` hides them from the net.
    residual_prior: bool = False
    prior_temperature: float = 1.0
    # What the value head's number means (issue 32.3): "start", a PPO critic's return, in percent of the episode's
    # starting cost; "state", the gain left from the state in percent of its own cost, read as if an episode began
    # there (its state scalars at their reset values): experiments/fit_value_head.py's regression target.
    value_unit: str = "start"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> PolicyConfig:
        d = dict(d)
        d["encoder"] = EncoderConfig(**d.get("encoder", {}))
        return PolicyConfig(**d)


class GraphPolicy(nn.Module):
    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.encoder.hidden
        self.encoder = GraphEncoder(cfg.node_dim, cfg.edge_dim, cfg.global_dim, cfg.encoder)
        self.score = mlp(3 * h + CAND_DIM, h, h, 1)
        self.value = mlp(h + STATE_DIM, h, h, 1)
        if cfg.value_unit not in VALUE_UNITS:
            raise ValueError(f"value_unit must be one of {', '.join(VALUE_UNITS)}, not {cfg.value_unit!r}")
        if cfg.residual_prior:
            if not cfg.prior_temperature > 0:
                raise ValueError(f"prior_temperature must be positive, not {cfg.prior_temperature}")
            last = self.score[-1]
            nn.init.zeros_(last.weight)
            nn.init.zeros_(last.bias)

    def forward(self, meta: MetaGraph | IncrementalMeta) -> tuple[GroupedCategorical, Tensor]:
        """The action distribution of every state in `meta`, and its value [S]."""
        if isinstance(meta, IncrementalMeta):
            h_s, h_r = self.encoder.encode_incremental(meta)  # [S, H], [R, H]
            emb = torch.cat([h_s, h_r])
            h_c = emb.index_select(0, torch.where(meta.cand_region >= 0, meta.cand_region + meta.num_states,
                                                  meta.cand_state))
        else:
            g = meta.graphs
            emb = self.encoder(g.x, g.edge_index, g.edge_attr, g.u, g.batch)  # [B, H]: one per graph
            h_s = emb[meta.state_graph]  # [S, H]
            h_c = emb[meta.cand_graph]  # [C, H]
        h_sc = h_s[meta.cand_state]  # [C, H]: each candidate's state
        hints = meta.cand_attr if self.cfg.use_hints else torch.zeros_like(meta.cand_attr)
        state_attr = meta.state_attr if self.cfg.use_hints else torch.zeros_like(meta.state_attr)
        if self.cfg.value_unit == "state" and self.cfg.use_hints:  # the state as an episode's start: what V learnt
            state_attr = torch.ones_like(state_attr)
        logits = self.score(torch.cat([h_c, h_sc, h_c - h_sc, hints], dim=1)).squeeze(-1)  # [C]
        if self.cfg.residual_prior:  # the cost prior's logit (hint 0: percent of the start's cost) + correction
            logits = logits - meta.cand_attr[:, 0] / self.cfg.prior_temperature
        value = self.value(torch.cat([h_s, state_attr], dim=1)).squeeze(-1)  # [S]
        return GroupedCategorical(logits, meta.cand_state, meta.num_states), value

    def features(self, capacity: int = 4096) -> FeatureCache | IncrementalFeatures:
        """What builds this policy's observations: regions (`cfg.incremental`) or whole candidate graphs."""
        if self.cfg.incremental:
            return IncrementalFeatures(self.cfg.encoder.layers, capacity)
        return FeatureCache(capacity)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
