"""Graph encoders: a batch of graphs in, one embedding per graph out.

Every encoder reads `x` [N, node_dim], `edge_index` [2, E], `edge_attr` [E, edge_dim], `u`
[B, global_dim] and `batch` [N], and returns [B, hidden]. Dataflow edges point from producer to
consumer; each encoder adds the reverse edges (flagged by one extra edge feature) so that a node
hears about its consumers as well as its producers.

    gat    (default, after X-RLflow) an edge update e' = e + MLP([x_src, x_dst, e]), then `layers`
           GATv2 layers whose attention reads the (updated) edge features.
    gatv2  `layers` GATv2 layers with edge features in attention, no edge update.
    gin    `layers` GINE layers (edge features added to each message before the MLP).
    gcn    `layers` GCN layers; GCN has no edge features, so it sees the structure only.

Each layer is residual with LayerNorm. Every encoder ends in the global layer u' = MLP([u, pool(x)])
(`pooling`: mean, sum, max or attention): the graph embedding, from the graph-level features and
the pooled node states.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch_geometric.nn import (
    AttentionalAggregation,
    GATv2Conv,
    GCNConv,
    GINEConv,
    global_add_pool,
    global_max_pool,
    global_mean_pool,
)

from xrl.errors import ConfigError

ENCODERS = ("gat", "gatv2", "gin", "gcn")
POOLINGS = ("mean", "sum", "max", "attention")


@dataclass(frozen=True)
class EncoderConfig:
    kind: str = "gat"
    hidden: int = 64
    layers: int = 3
    heads: int = 4
    dropout: float = 0.0
    pooling: str = "mean"

    def __post_init__(self) -> None:
        if self.kind not in ENCODERS:
            raise ConfigError(f"unknown encoder {self.kind!r}; choose one of: {', '.join(ENCODERS)}")
        if self.pooling not in POOLINGS:
            raise ConfigError(f"unknown pooling {self.pooling!r}; choose one of: {', '.join(POOLINGS)}")
        if self.hidden < 1 or self.layers < 1 or self.heads < 1:
            raise ConfigError(f"hidden, layers and heads must be positive, not {self.hidden}, {self.layers}, "
                              f"{self.heads}")
        if self.kind in ("gat", "gatv2") and self.hidden % self.heads:
            raise ConfigError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads}) for {self.kind}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must lie in [0, 1), not {self.dropout}")


def mlp(*dims: int, act: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """Linear layers of the given widths with `act` between them (none after the last)."""
    layers: list[nn.Module] = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


def with_reverse_edges(edge_index: Tensor, edge_attr: Tensor) -> tuple[Tensor, Tensor]:
    """[2, 2E] edges in both directions, with a last edge feature 0 (forward) or 1 (reverse)."""
    e = edge_index.size(1)
    flag = torch.cat([edge_attr.new_zeros(e, 1), edge_attr.new_ones(e, 1)])
    return torch.cat([edge_index, edge_index.flip(0)], dim=1), torch.cat([torch.cat([edge_attr, edge_attr]), flag], 1)


class _Pool(nn.Module):
    def __init__(self, kind: str, hidden: int) -> None:
        super().__init__()
        self.kind = kind
        self.attention = AttentionalAggregation(mlp(hidden, hidden, 1)) if kind == "attention" else None

    def forward(self, x: Tensor, batch: Tensor, num_graphs: int) -> Tensor:
        if self.attention is not None:
            return self.attention(x, batch, dim_size=num_graphs)
        pool = {"mean": global_mean_pool, "sum": global_add_pool, "max": global_max_pool}[self.kind]
        return pool(x, batch, size=num_graphs)


class GraphEncoder(nn.Module):
    """One module for every encoder kind: embed, (edge update), message passing, (global update), pool."""

    def __init__(self, node_dim: int, edge_dim: int, global_dim: int, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden
        self.node_in = mlp(node_dim, h, h)
        self.edge_in = mlp(edge_dim + 1, h, h)  # +1: the reverse-edge flag
        self.global_in = mlp(global_dim, h, h)
        self.edge_update = mlp(3 * h, h, h) if cfg.kind == "gat" else None
        self.convs = nn.ModuleList(self._conv(cfg) for _ in range(cfg.layers))
        self.norms = nn.ModuleList(nn.LayerNorm(h) for _ in range(cfg.layers))
        self.dropout = nn.Dropout(cfg.dropout)
        self.pool = _Pool(cfg.pooling, h)
        self.readout = mlp(2 * h, h, h)  # [u, pool(x)] -> graph embedding (the global layer for "gat")

    @staticmethod
    def _conv(cfg: EncoderConfig) -> nn.Module:
        h = cfg.hidden
        if cfg.kind in ("gat", "gatv2"):
            return GATv2Conv(h, h // cfg.heads, heads=cfg.heads, edge_dim=h, dropout=cfg.dropout)
        if cfg.kind == "gin":
            return GINEConv(mlp(h, h, h), edge_dim=h)
        return GCNConv(h, h)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, u: Tensor, batch: Tensor) -> Tensor:
        num_graphs = u.size(0)
        edge_index, edge_attr = with_reverse_edges(edge_index, edge_attr)
        h = self.node_in(x)  # [N, H]
        e = self.edge_in(edge_attr)  # [2E, H]
        g = self.global_in(u)  # [B, H]
        if self.edge_update is not None:
            src, dst = edge_index
            e = e + self.edge_update(torch.cat([h[src], h[dst], e], dim=1))
        for conv, norm in zip(self.convs, self.norms):
            if self.cfg.kind == "gcn":
                out = conv(h, edge_index)
            else:
                out = conv(h, edge_index, edge_attr=e)
            h = norm(h + self.dropout(torch.relu(out)))
        return self.readout(torch.cat([g, self.pool(h, batch, num_graphs)], dim=1))  # [B, H]
