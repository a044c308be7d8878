"""Building blocks the encoders share: MLPs, both-direction edges, node degrees, GCN propagation.

Each is written so that it also exports to ONNX as it is (`xrl policy export`): no op without an ONNX
counterpart (bincount, for one) on the whole-graph path.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn import GCNConv
from torch_geometric.utils import scatter


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


def node_degree(edge_index: Tensor, num_nodes: int) -> Tensor:
    """[N] edges into each node (both directions already in `edge_index`: a node's degree), float32.

    A scatter-add of ones, not bincount (no ONNX op) nor index_add (which exports without the add, so that
    repeated indices overwrite): the same whole numbers, exactly.
    """
    ones = torch.ones(edge_index.size(1), dtype=torch.float32, device=edge_index.device)
    return torch.zeros(num_nodes, dtype=torch.float32, device=edge_index.device).scatter_add(0, edge_index[1], ones)


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
