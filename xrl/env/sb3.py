"""Stable-Baselines3 / sb3-contrib glue: xrl's graph encoder as a features extractor, and a MaskablePPO
policy that scores each candidate with one shared head (so its size does not grow with the action space).

    from sb3_contrib import MaskablePPO
    from xrl.env.sb3 import XrlMaskablePolicy, policy_kwargs
    model = MaskablePPO(XrlMaskablePolicy, gymnasium.make("xrl/GraphRewrite-v0"), policy_kwargs=policy_kwargs())

The extractor reads only `obs` (xrl.env.observation): it unpads the current graph into one PyG batch,
runs xrl's GraphEncoder layers to get node states and a graph embedding, and embeds each candidate
from the node states at its location, its rule, the ops it adds and its estimated effect. Features
are [state embedding | candidate 0 | ... | candidate A-1], each `hidden` wide. The policy's actor
scores candidates with one MLP over [state, candidate] (sb3's own action net would be a dense layer
over the action space: the 202M parameters of the issue); its critic reads the state embedding.
"""

from __future__ import annotations

from typing import Any

import torch
from gymnasium import spaces
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import Tensor, nn

from xrl.env.observation import MAX_ADDED
from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM, OP_VOCAB
from xrl.features.metagraph import CAND_DIM, STATE_DIM
from xrl.nn.encoders import EncoderConfig, GraphEncoder, mlp


def encode_nodes(enc: GraphEncoder, x: Tensor, edge_index: Tensor, edge_attr: Tensor, u: Tensor,
                 batch: Tensor) -> tuple[Tensor, Tensor]:
    """(node states [N, H], graph embeddings [B, H]): GraphEncoder.forward, keeping the node states."""
    h = enc.node_states(x, edge_index, edge_attr)[-1]
    return h, enc.readout(torch.cat([enc.global_in(u), enc.pool(h, batch, u.size(0))], dim=1))


class XrlFeaturesExtractor(BaseFeaturesExtractor):
    """xrl's GraphEncoder over the padded observation; output [B, (1 + A) * hidden] (see module docstring)."""

    def __init__(self, observation_space: spaces.Dict, hidden: int = 32, layers: int = 2, kind: str = "gat",
                 heads: int = 4) -> None:
        self.num_actions = int(observation_space["action_mask"].n)
        super().__init__(observation_space, features_dim=(1 + self.num_actions) * hidden)
        self.hidden = hidden
        self.max_nodes = int(observation_space["node_x"].shape[0])
        num_rules = int(observation_space["cand_rule"].high.max())
        self.encoder = GraphEncoder(NODE_DIM, EDGE_DIM, GLOBAL_DIM,
                                    EncoderConfig(kind=kind, hidden=hidden, layers=layers, heads=heads))
        self.rule = nn.Embedding(num_rules + 1, hidden)  # 0: the no-op
        self.added_op = nn.Embedding(len(OP_VOCAB) + 1, hidden, padding_idx=0)
        self.hints = nn.Linear(CAND_DIM, hidden)
        self.cand = mlp(3 * hidden, hidden, hidden)  # [location, rule + added ops, hints] -> candidate
        self.state = mlp(hidden + STATE_DIM, hidden, hidden)

    def forward(self, obs: dict[str, Tensor]) -> Tensor:
        b = obs["node_x"].shape[0]
        n = obs["num_nodes"].view(b).long()
        e = obs["num_edges"].view(b).long()
        dev = obs["node_x"].device
        node_ok = torch.arange(self.max_nodes, device=dev)[None, :] < n[:, None]  # [B, N]
        edge_ok = torch.arange(obs["edge_index"].shape[-1], device=dev)[None, :] < e[:, None]  # [B, E]
        offset = torch.cumsum(n, 0) - n  # first row of each graph in the unpadded batch
        x = obs["node_x"][node_ok]
        ei = (obs["edge_index"].long() + offset[:, None, None]).permute(1, 0, 2)[:, edge_ok]  # [2, sum E]
        ea = obs["edge_attr"][edge_ok]
        batch = torch.repeat_interleave(torch.arange(b, device=dev), n)
        h, g = encode_nodes(self.encoder, x, ei, ea, obs["graph_attr"], batch)

        padded = h.new_zeros(b, self.max_nodes + 1, self.hidden)  # row 0: "no node"
        padded[:, 1:][node_ok] = h
        loc = obs["cand_loc"].long()  # [B, A, L], 1 + row
        at = torch.gather(padded, 1, loc.view(b, -1, 1).expand(-1, -1, self.hidden)).view(*loc.shape, self.hidden)
        used = (loc > 0).float().unsqueeze(-1)
        where = (at * used).sum(2) / used.sum(2).clamp(min=1.0)  # [B, A, H]
        what = self.rule(obs["cand_rule"].long()) + self.added_op(obs["cand_added_op"].long()).sum(2) / MAX_ADDED
        cands = self.cand(torch.cat([where, what, self.hints(obs["cand_hints"])], dim=-1))  # [B, A, H]
        state = self.state(torch.cat([g, obs["state"]], dim=-1))  # [B, H]
        return torch.cat([state.unsqueeze(1), cands], dim=1).flatten(1)


class CandidateHeads(nn.Module):
    """sb3's mlp_extractor slot: actor -> one score per candidate [B, A]; critic -> [B, hidden]."""

    def __init__(self, num_actions: int, hidden: int) -> None:
        super().__init__()
        self.num_actions, self.hidden = num_actions, hidden
        self.latent_dim_pi, self.latent_dim_vf = num_actions, hidden
        self.score = mlp(2 * hidden, hidden, 1)
        self.value = nn.Sequential(mlp(hidden, hidden), nn.ReLU())

    def _split(self, features: Tensor) -> tuple[Tensor, Tensor]:
        f = features.view(features.shape[0], 1 + self.num_actions, self.hidden)
        return f[:, 0], f[:, 1:]

    def forward_actor(self, features: Tensor) -> Tensor:
        state, cands = self._split(features)
        return self.score(torch.cat([state.unsqueeze(1).expand_as(cands), cands], dim=-1)).squeeze(-1)

    def forward_critic(self, features: Tensor) -> Tensor:
        return self.value(self._split(features)[0])

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor]:
        return self.forward_actor(features), self.forward_critic(features)


class XrlMaskablePolicy(MaskableActorCriticPolicy):
    """MaskableActorCriticPolicy whose actor scores candidates (CandidateHeads) and whose action logits are
    those scores (no dense action layer)."""

    def _build_mlp_extractor(self) -> None:
        ext = self.features_extractor
        self.mlp_extractor = CandidateHeads(ext.num_actions, ext.hidden)

    def _build(self, lr_schedule: Any) -> None:
        super()._build(lr_schedule)
        self.action_net = nn.Identity()  # the scores are the logits
        # rebuilt so the optimizer holds exactly the parameters in use
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)


def policy_kwargs(hidden: int = 32, layers: int = 2, kind: str = "gat") -> dict[str, Any]:
    """`policy_kwargs` for MaskablePPO(XrlMaskablePolicy, ...): the extractor's size, features not shared twice."""
    return {"features_extractor_class": XrlFeaturesExtractor,
            "features_extractor_kwargs": {"hidden": hidden, "layers": layers, "kind": kind},
            "share_features_extractor": True}


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
