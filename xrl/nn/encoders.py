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
from typing import TYPE_CHECKING

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
from torch_geometric.utils import scatter

from xrl.errors import ConfigError

if TYPE_CHECKING:
    from xrl.features.incremental import IncrementalMeta

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

    def _edge_features(self, h0: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        """[e, H] features of directed edges (raw `edge_attr` with the reverse flag); gat adds its edge update."""
        e = self.edge_in(edge_attr)
        if self.edge_update is not None:
            src, dst = edge_index
            e = e + self.edge_update(torch.cat([h0[src], h0[dst], e], dim=1))
        return e

    def _layer(self, i: int, h: Tensor, edge_index: Tensor, e: Tensor | None, deg: Tensor | None,
               n_out: int | None = None) -> Tensor:
        """Message-passing layer i (residual, LayerNorm) on both-direction edges; `deg` [N]: GCN's node degrees.

        With `n_out`, only the first n_out nodes are computed ([n_out, H]; every edge must end among them).
        """
        conv = self.convs[i]
        h_out = h if n_out is None else h[:n_out]
        if self.cfg.kind == "gcn":
            out = gcn_propagate(conv, h, edge_index, deg, n_out)
        else:
            out = conv(h if n_out is None else (h, h_out), edge_index, edge_attr=e)
        return self.norms[i](h_out + self.dropout(torch.relu(out)))

    def encode_nodes(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> tuple[list[Tensor], Tensor | None]:
        """([h_0, ..., h_L], each [N, H]; edge features [2E, H], None for gcn) of whole graphs."""
        h = self.node_in(x)  # [N, H]
        hs = [h]
        edge_index, edge_attr = with_reverse_edges(edge_index, edge_attr)  # [2, 2E], [2E, D + 1]
        e = None if self.cfg.kind == "gcn" else self._edge_features(h, edge_index, edge_attr)  # gcn reads no edges
        deg = node_degree(edge_index, h.size(0)) if self.cfg.kind == "gcn" else None
        for i in range(self.cfg.layers):
            h = self._layer(i, h, edge_index, e, deg)
            hs.append(h)
        return hs, e

    def node_states(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> list[Tensor]:
        """[h_0, h_1, ..., h_L], each [N, H]: every node's state after each layer (h_0 = node_in(x))."""
        return self.encode_nodes(x, edge_index, edge_attr)[0]

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, u: Tensor, batch: Tensor) -> Tensor:
        num_graphs = u.size(0)
        h = self.node_states(x, edge_index, edge_attr)[-1]
        return self.readout(torch.cat([self.global_in(u), self.pool(h, batch, num_graphs)], dim=1))  # [B, H]

    def encode_incremental(self, meta: IncrementalMeta) -> tuple[Tensor, Tensor]:
        """(state embeddings [S, H], candidate-region embeddings [R, H]) of an `IncrementalMeta`.

        The states are encoded whole; each candidate only where it differs (xrl.features.incremental):
        a local node k of level l_k is recomputed at layers l >= l_k and reads the state's h_l elsewhere,

            h_l[k] = layer_l(h_{l-1}, edges into nodes of level <= l)[k]   if l >= l_k,   else   H_l[prow[k]]

        which equals encoding the candidate whole, since nothing farther than L hops from its change
        can differ. Edge features are the state's except on new edges and edges at a changed node. The
        candidate's pooled states are the state's, less the rows it drops or replaces, plus the region's.
        """
        g = meta.graphs
        num_states, layers = g.num_graphs, self.cfg.layers
        hs, e_state = self.encode_nodes(g.x, g.edge_index, g.edge_attr)  # L + 1 of [N, H]; [2E, H]
        state_emb = self.readout(torch.cat([self.global_in(g.u), self.pool(hs[-1], g.batch, num_states)], dim=1))
        if meta.num_regions == 0:
            return state_emb, state_emb.new_zeros(0, state_emb.size(1))
        lv = meta.loc_level  # [n]
        prow = meta.loc_prow.clamp(min=0)  # [n]: the state's row (read only where the level says so)
        # Gathers by index_select throughout: its backward is an index_add, where x[idx]'s is a (sorting) index_put.
        h = hs[0].index_select(0, prow)  # [n, H]
        fresh = (lv == 0).nonzero().squeeze(-1)  # D_0: the only nodes whose features may differ
        x = g.x[prow[fresh]]
        has_x = meta.loc_xnew[fresh] >= 0
        x[has_x] = meta.x_new[meta.loc_xnew[fresh][has_x]]
        h = h.index_put((fresh,), self.node_in(x))
        # Both directions of the local edges, only those into the region proper (its boundary is never computed).
        n_e, big_e = meta.loc_edge_index.size(1), g.edge_index.size(1)
        edge_index = torch.cat([meta.loc_edge_index, meta.loc_edge_index.flip(0)], dim=1)  # [2, 2e]
        eid = torch.cat([meta.loc_eid, torch.where(meta.loc_eid >= 0, meta.loc_eid + big_e, meta.loc_eid)])
        into = lv[edge_index[1]] <= layers
        edge_index, eid = edge_index[:, into], eid[into]
        e = None
        if self.cfg.kind != "gcn":
            redo = ((eid < 0) | (lv[edge_index[0]] == 0) | (lv[edge_index[1]] == 0)).nonzero().squeeze(-1)
            which = torch.arange(2 * n_e, device=eid.device)[into][redo]  # [f] local directed edge ids
            fwd = which % n_e if n_e else which
            raw = meta.edge_attr_new.new_zeros(which.numel(), meta.edge_attr_new.size(1))
            old = meta.loc_eid[fwd] >= 0
            raw[old] = g.edge_attr[meta.loc_eid[fwd][old]]
            raw[~old] = meta.edge_attr_new[meta.loc_enew[fwd][~old]]
            raw = torch.cat([raw, (which >= n_e).to(raw.dtype).unsqueeze(-1)], dim=1)  # + the reverse flag
            e = (e_state.index_select(0, eid.clamp(min=0)) if e_state.size(0)
                 else e_state.new_zeros(eid.numel(), e_state.size(1)))
            e = e.index_put((redo,), self._edge_features(h, edge_index[:, redo], raw))
        # Local nodes by level, so that layer l computes a prefix (level <= l) from a prefix (level <= l + 1).
        order = torch.argsort(lv, stable=True)
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.numel(), device=order.device)
        lv, prow, h, deg = lv[order], prow[order], h[order], meta.loc_deg[order]
        edge_index = inv[edge_index]
        bounds = torch.searchsorted(lv, torch.arange(layers + 2, device=lv.device), right=True).tolist()  # n_l
        dst_level = lv[edge_index[1]]
        for i in range(layers):
            into = dst_level <= i + 1  # layer i+1 recomputes only nodes of level <= i+1: only their messages count
            n_out = bounds[i + 1]
            out = self._layer(i, h[:bounds[i + 2]], edge_index[:, into], None if e is None else e[into], deg, n_out)
            h = torch.cat([out, hs[i + 1].index_select(0, prow[n_out:])])
        pooled = self._pool_incremental(hs[-1], h, lv, meta.loc_region[order], meta.loc_prow[order], meta)  # [R, H]
        return state_emb, self.readout(torch.cat([self.global_in(meta.region_u), pooled], dim=1))

    def _pool_incremental(self, hs: Tensor, h: Tensor, level: Tensor, region: Tensor, prow: Tensor,
                          meta: IncrementalMeta) -> Tensor:
        """pool() of every candidate graph: the state's nodes less the rows it drops or replaces, plus the region's.

        hs [N, H]: the states' last node states; h, level, region, prow [n]: the local nodes'.
        """
        g = meta.graphs
        num_states, num_regions = g.num_graphs, meta.num_regions
        inside = level <= self.cfg.layers  # [n]: the region proper (not its boundary)
        h_in, reg_in = h[inside], region[inside]
        kept = inside & (prow >= 0)  # region nodes that replace a row of the state
        rep_row = torch.cat([prow[kept], meta.rem_row])  # [r]: rows the candidate drops or replaces
        rep_reg = torch.cat([region[kept], meta.rem_region])
        rs = meta.region_state
        kind = self.cfg.pooling
        if kind in ("sum", "mean"):
            total = (scatter(hs, g.batch, 0, dim_size=num_states, reduce="sum").index_select(0, rs)
                     - scatter(hs.index_select(0, rep_row), rep_reg, 0, dim_size=num_regions, reduce="sum")
                     + scatter(h_in, reg_in, 0, dim_size=num_regions, reduce="sum"))
            return total / meta.region_count.unsqueeze(-1) if kind == "mean" else total
        if kind == "max":
            kept_max = _max_without(hs, g.ptr, rs, rep_row, rep_reg, num_regions)
            return torch.maximum(kept_max, _scatter_max(h_in, reg_in, num_regions))
        # attention: softmax-weighted sums, both sides shifted by one per-candidate maximum for stability
        gate_nn = self.pool.attention.gate_nn
        a = gate_nn(hs).squeeze(-1)  # [N]
        a_in = gate_nn(h_in).squeeze(-1)  # [m]
        m_s = _scatter_max(a.detach().unsqueeze(-1), g.batch, num_states).squeeze(-1)  # [S]
        m_r = torch.maximum(m_s[rs], _scatter_max(a_in.detach().unsqueeze(-1), reg_in, num_regions).squeeze(-1))
        w = (a - m_s[g.batch]).exp()
        num_s = scatter(w.unsqueeze(-1) * hs, g.batch, 0, dim_size=num_states, reduce="sum")
        den_s = scatter(w, g.batch, 0, dim_size=num_states, reduce="sum")
        w_rep = w[rep_row]
        scale = (m_s[rs] - m_r).exp()
        w_in = (a_in - m_r[reg_in]).exp()
        num = ((num_s[rs] - scatter(w_rep.unsqueeze(-1) * hs[rep_row], rep_reg, 0, dim_size=num_regions))
               * scale.unsqueeze(-1) + scatter(w_in.unsqueeze(-1) * h_in, reg_in, 0, dim_size=num_regions))
        den = ((den_s[rs] - scatter(w_rep, rep_reg, 0, dim_size=num_regions)) * scale
               + scatter(w_in, reg_in, 0, dim_size=num_regions))
        return num / (den.unsqueeze(-1) + 1e-16)


def node_degree(edge_index: Tensor, num_nodes: int) -> Tensor:
    """[N] edges into each node (both directions already in `edge_index`: a node's degree)."""
    return torch.bincount(edge_index[1], minlength=num_nodes).to(torch.float32)


def gcn_propagate(conv: GCNConv, h: Tensor, edge_index: Tensor, deg: Tensor, n_out: int | None = None) -> Tensor:
    """GCNConv's output with the degrees given, so that a subgraph's boundary nodes keep their true degree:

        out_i = sum_{j in N(i) + i} (deg_i + 1)^-1/2 (deg_j + 1)^-1/2 W h_j + b     (self-loops of weight 1)

    for the first `n_out` nodes (all by default).
    """
    n_out = h.size(0) if n_out is None else n_out
    xw = conv.lin(h)  # [N, H]
    dinv = (deg[:h.size(0)] + 1.0).pow(-0.5)  # [N]
    src, dst = edge_index
    msg = xw[src] * (dinv[src] * dinv[dst]).unsqueeze(-1)  # [2E, H]
    out = scatter(msg, dst, 0, dim_size=n_out, reduce="sum") + xw[:n_out] * (dinv[:n_out] ** 2).unsqueeze(-1)
    return out + conv.bias if conv.bias is not None else out


def _scatter_max(src: Tensor, index: Tensor, size: int) -> Tensor:
    """[size, H] maximum of the rows of `src` [n, H] per index; -inf where an index has no row."""
    out = src.new_full((size, src.size(1)), float("-inf"))
    return out.scatter_reduce(0, index.unsqueeze(-1).expand_as(src), src, reduce="amax", include_self=True)


def _max_without(hs: Tensor, ptr: Tensor, region_state: Tensor, rows: Tensor, regions: Tensor,
                 num_regions: int) -> Tensor:
    """[R, H]: per region, the maximum of its state's rows of `hs` except `rows` (those of its region).

    Exact and small: per feature, the answer is among the state's top (excluded + 1) values.
    """
    out = hs.new_full((num_regions, hs.size(1)), float("-inf"))
    counts = torch.bincount(regions, minlength=num_regions)
    for s in torch.unique(region_state).tolist():
        lo, hi = int(ptr[s]), int(ptr[s + 1])
        regs = (region_state == s).nonzero().squeeze(-1)  # [R_s]
        k = min(int(counts[regs].max()) + 1, hi - lo)
        if k <= 0:
            continue
        vals, idx = hs[lo:hi].topk(k, dim=0)  # [k, H]
        excluded = torch.zeros(regs.numel(), hi - lo, dtype=torch.bool, device=hs.device)  # [R_s, N_s]
        local = torch.full((num_regions,), -1, dtype=torch.long, device=hs.device)
        local[regs] = torch.arange(regs.numel(), device=hs.device)
        mine = local[regions] >= 0
        excluded[local[regions[mine]], rows[mine] - lo] = True
        masked = vals.unsqueeze(0).masked_fill(excluded[:, idx], float("-inf"))  # [R_s, k, H]
        out[regs] = masked.max(dim=1).values
    return out
