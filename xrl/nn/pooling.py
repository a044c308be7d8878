"""Graph pooling: node states [N, H] in, one row per graph [B, H] out (mean, sum, max or attention).

`GraphPool` pools whole graphs, export-friendly (max pooling is a scatter max from -inf, which ONNX
exports exactly, where PyG's max pool does not); `GraphPool.incremental` pools every candidate graph
of an `IncrementalMeta` from its state's pooled rows and its changed region only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch_geometric.nn import AttentionalAggregation, global_add_pool, global_mean_pool
from torch_geometric.utils import scatter

from xrl.nn.layers import mlp

if TYPE_CHECKING:
    from xrl.features.incremental import IncrementalMeta

POOLINGS = ("mean", "sum", "max", "attention")


class GraphPool(nn.Module):
    """pool(x)_b = reduce_{i in graph b} x_i, reduce one of POOLINGS; attention is PyG's
    AttentionalAggregation, sum_i softmax_i(gate(x_i)) x_i with gate an MLP."""

    def __init__(self, kind: str, hidden: int) -> None:
        super().__init__()
        self.kind = kind
        self.attention = AttentionalAggregation(mlp(hidden, hidden, 1)) if kind == "attention" else None

    def forward(self, x: Tensor, batch: Tensor, num_graphs: int) -> Tensor:
        if self.attention is not None:
            return self.attention(x, batch, dim_size=num_graphs)
        if self.kind == "max":  # the same values as global_max_pool (no graph is empty), and exports exactly
            return scatter_max(x, batch, num_graphs)
        pool = global_mean_pool if self.kind == "mean" else global_add_pool
        return pool(x, batch, size=num_graphs)

    def incremental(self, hs: Tensor, h: Tensor, inside: Tensor, region: Tensor, prow: Tensor,
                    meta: IncrementalMeta) -> Tensor:
        """forward() of every candidate graph: the state's nodes less the rows it drops or replaces, plus the region's.

        hs [N, H]: the states' last node states; h, inside, region, prow [n]: the local nodes' states, whether
        each is in the region proper (not its boundary), their region and the state's row they replace (-1: new).
        """
        g = meta.graphs
        num_states, num_regions = g.num_graphs, meta.num_regions
        h_in, reg_in = h[inside], region[inside]
        kept = inside & (prow >= 0)  # region nodes that replace a row of the state
        rep_row = torch.cat([prow[kept], meta.rem_row])  # [r]: rows the candidate drops or replaces
        rep_reg = torch.cat([region[kept], meta.rem_region])
        rs = meta.region_state
        if self.kind in ("sum", "mean"):
            total = (scatter(hs, g.batch, 0, dim_size=num_states, reduce="sum").index_select(0, rs)
                     - scatter(hs.index_select(0, rep_row), rep_reg, 0, dim_size=num_regions, reduce="sum")
                     + scatter(h_in, reg_in, 0, dim_size=num_regions, reduce="sum"))
            return total / meta.region_count.unsqueeze(-1) if self.kind == "mean" else total
        if self.kind == "max":
            kept_max = max_without(hs, g.ptr, rs, rep_row, rep_reg, num_regions)
            return torch.maximum(kept_max, scatter_max(h_in, reg_in, num_regions))
        # attention: softmax-weighted sums, both sides shifted by one per-candidate maximum for stability
        gate_nn = self.attention.gate_nn  # type: ignore[union-attr]
        a = gate_nn(hs).squeeze(-1)  # [N]
        a_in = gate_nn(h_in).squeeze(-1)  # [m]
        m_s = scatter_max(a.detach().unsqueeze(-1), g.batch, num_states).squeeze(-1)  # [S]
        m_r = torch.maximum(m_s[rs], scatter_max(a_in.detach().unsqueeze(-1), reg_in, num_regions).squeeze(-1))
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


def scatter_max(src: Tensor, index: Tensor, size: int) -> Tensor:
    """[size, H] maximum of the rows of `src` [n, H] per index; -inf where an index has no row."""
    out = src.new_full((size, src.size(1)), float("-inf"))
    return out.scatter_reduce(0, index.unsqueeze(-1).expand_as(src), src, reduce="amax", include_self=True)


def max_without(hs: Tensor, ptr: Tensor, region_state: Tensor, rows: Tensor, regions: Tensor,
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
