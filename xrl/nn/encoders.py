"""Graph encoders: a batch of graphs in, one embedding per graph out; one class per encoder kind.

Every encoder reads `x` [N, node_dim], `edge_index` [2, E], `edge_attr` [E, edge_dim], `u`
[B, global_dim] and `batch` [N], and returns [B, hidden]. Dataflow edges point from producer to
consumer; each encoder adds the reverse edges (flagged by one extra edge feature) so that a node
hears about its consumers as well as its producers. The shared pieces live in `GraphEncoder`:

    h_0 = MLP(x),  e = MLP(edge_attr + reverse flag)                     (embed)
    h_l = LayerNorm(h_{l-1} + dropout(relu(conv_l(h_{l-1}, edges, e))))   (layer l = 1..L, residual)
    out = MLP([MLP(u), pool(h_L)])                                       (the global layer, `pooling`)

and each kind (a subclass registered in `ENCODERS`) brings its `conv_l`, documented in its docstring:

    gat    (default, after X-RLflow) GATv2 layers on edges updated once by e' = e + MLP([h_src, h_dst, e]).
    gatv2  GATv2 layers with edge features in attention, no edge update.
    gin    GINE layers (edge features added to each message before the MLP).
    gcn    GCN layers; GCN has no edge features, so it sees the structure only.

A new kind: subclass `GraphEncoder`, implement `make_conv` (and `message_passing` if its conv is not
called as conv(h, edge_index, edge_attr=e)), and `register_encoder("name", Cls)`; `EncoderConfig(kind=
"name")`, `model.kind=name` in training (`xrl train`) and incremental encoding follow, and so does policy
export where the new layer's ops export to ONNX (`xrl.policies.release.ALLOWED_OPS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn
from torch_geometric.nn import GATv2Conv, GCNConv, GINEConv

from xrl.errors import ConfigError
from xrl.nn.layers import gcn_propagate, mlp, node_degree, with_reverse_edges
from xrl.nn.pooling import POOLINGS, GraphPool

if TYPE_CHECKING:
    from xrl.features.incremental import IncrementalMeta

__all__ = [
    "ENCODERS", "POOLINGS", "EncoderConfig", "GATEncoder", "GATv2Encoder", "GCNEncoder", "GINEncoder", "GraphEncoder",
    "gcn_propagate", "mlp", "node_degree", "register_encoder", "with_reverse_edges",
]

# kind -> encoder class; `EncoderConfig.kind` must be one of its keys (see `register_encoder`).
ENCODERS: dict[str, type[GraphEncoder]] = {}


def register_encoder(name: str, cls: type[GraphEncoder]) -> type[GraphEncoder]:
    """Make `cls` the encoder of kind `name` (EncoderConfig(kind=name) builds it); returns cls."""
    if not (isinstance(cls, type) and issubclass(cls, GraphEncoder)) or cls is GraphEncoder:
        raise ConfigError(f"encoder {name!r} must be a subclass of GraphEncoder, not {cls!r}")
    if not name or not name.isidentifier():
        raise ConfigError(f"an encoder name must be a word (letters, digits, _), not {name!r}")
    ENCODERS[name] = cls
    return cls


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
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must lie in [0, 1), not {self.dropout}")
        ENCODERS[self.kind].check_config(self)


class GraphEncoder(nn.Module):
    """The shared embed / layers / pool / readout of every kind (see the module docstring).

    `GraphEncoder(node_dim, edge_dim, global_dim, cfg)` builds the class registered for `cfg.kind`.
    Subclasses set `reads_edges` (False: no edge features are computed), `needs_degree` (True: layers
    get every node's degree) and implement `make_conv`; their state_dict keys are the same for every kind
    (node_in, edge_in, global_in, [edge_update], convs.l, norms.l, [pool.attention], readout).
    """

    reads_edges: ClassVar[bool] = True
    needs_degree: ClassVar[bool] = False

    def __new__(cls, *args: Any, **kwargs: Any) -> GraphEncoder:
        if cls is GraphEncoder:  # the base stands for "the encoder of cfg.kind"
            cfg = kwargs["cfg"] if "cfg" in kwargs else args[3]
            cls = ENCODERS[cfg.kind]
        return super().__new__(cls)

    def __init__(self, node_dim: int, edge_dim: int, global_dim: int, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden
        self.node_in = mlp(node_dim, h, h)
        self.edge_in = mlp(edge_dim + 1, h, h)  # +1: the reverse-edge flag
        self.global_in = mlp(global_dim, h, h)
        # made here, between the embeddings and the layers, so that a seed draws every kind's weights in one order
        self.edge_update = self.make_edge_update(cfg)
        self.convs = nn.ModuleList(self.make_conv(cfg) for _ in range(cfg.layers))
        self.norms = nn.ModuleList(nn.LayerNorm(h) for _ in range(cfg.layers))
        self.dropout = nn.Dropout(cfg.dropout)
        self.pool = GraphPool(cfg.pooling, h)
        self.readout = mlp(2 * h, h, h)  # [u, pool(x)] -> graph embedding

    @classmethod
    def check_config(cls, cfg: EncoderConfig) -> None:
        """Raise ConfigError where `cfg` does not suit this kind (checked by EncoderConfig)."""

    def make_conv(self, cfg: EncoderConfig) -> nn.Module:
        """One message-passing layer [N, H] -> [N, H]."""
        raise NotImplementedError

    def make_edge_update(self, cfg: EncoderConfig) -> nn.Module | None:
        """The module `edge_features` updates edges with, if the kind has one."""
        return None

    def message_passing(self, conv: nn.Module, h: Tensor, edge_index: Tensor, e: Tensor | None, deg: Tensor | None,
                        n_out: int | None) -> Tensor:
        """conv's output for the first n_out nodes (all when None; every edge must then end among them)."""
        return conv(h if n_out is None else (h, h[:n_out]), edge_index, edge_attr=e)

    def edge_features(self, h0: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        """[e, H] features of directed edges (raw `edge_attr` with the reverse flag); h0 [N, H]: the embedded nodes."""
        return self.edge_in(edge_attr)

    def layer(self, i: int, h: Tensor, edge_index: Tensor, e: Tensor | None, deg: Tensor | None,
              n_out: int | None = None) -> Tensor:
        """Message-passing layer i (residual, LayerNorm) on both-direction edges; `deg` [N]: node degrees
        (kinds with `needs_degree`). With `n_out`, only the first n_out nodes are computed ([n_out, H])."""
        h_out = h if n_out is None else h[:n_out]
        out = self.message_passing(self.convs[i], h, edge_index, e, deg, n_out)
        return self.norms[i](h_out + self.dropout(torch.relu(out)))

    def encode_nodes(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> tuple[list[Tensor], Tensor | None]:
        """([h_0, ..., h_L], each [N, H]; edge features [2E, H], None for kinds that read no edges) of whole graphs."""
        h = self.node_in(x)  # [N, H]
        hs = [h]
        edge_index, edge_attr = with_reverse_edges(edge_index, edge_attr)  # [2, 2E], [2E, D + 1]
        e = self.edge_features(h, edge_index, edge_attr) if self.reads_edges else None
        deg = node_degree(edge_index, h.size(0)) if self.needs_degree else None
        for i in range(self.cfg.layers):
            h = self.layer(i, h, edge_index, e, deg)
            hs.append(h)
        return hs, e

    def node_states(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> list[Tensor]:
        """[h_0, h_1, ..., h_L], each [N, H]: every node's state after each layer (h_0 = node_in(x))."""
        return self.encode_nodes(x, edge_index, edge_attr)[0]

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, u: Tensor, batch: Tensor) -> Tensor:
        """[B, H] graph embeddings; exports to ONNX as it is (xrl.policies.export)."""
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
        if self.reads_edges:
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
            e = e.index_put((redo,), self.edge_features(h, edge_index[:, redo], raw))
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
            out = self.layer(i, h[:bounds[i + 2]], edge_index[:, into], None if e is None else e[into], deg, n_out)
            h = torch.cat([out, hs[i + 1].index_select(0, prow[n_out:])])
        inside = lv <= layers  # the region proper (not its boundary)
        pooled = self.pool.incremental(hs[-1], h, inside, meta.loc_region[order], meta.loc_prow[order], meta)  # [R, H]
        return state_emb, self.readout(torch.cat([self.global_in(meta.region_u), pooled], dim=1))


class GATv2Encoder(GraphEncoder):
    """GATv2 layers (Brody et al. 2022) whose attention reads the edge features (PyG's GATv2Conv, `heads` heads
    of hidden/heads channels, concatenated):

        h'_i = ||_k sum_{j in N(i) + i} alpha^k_ij W^k_s h_j
        alpha^k_ij = softmax_j(a^k . LeakyReLU(W^k_s h_j + W^k_t h_i + W^k_e e_ji))
    """

    @classmethod
    def check_config(cls, cfg: EncoderConfig) -> None:
        if cfg.hidden % cfg.heads:
            raise ConfigError(f"hidden ({cfg.hidden}) must be a multiple of heads ({cfg.heads}) for {cfg.kind}")

    def make_conv(self, cfg: EncoderConfig) -> nn.Module:
        h = cfg.hidden
        return GATv2Conv(h, h // cfg.heads, heads=cfg.heads, edge_dim=h, dropout=cfg.dropout)


class GATEncoder(GATv2Encoder):
    """The default, after X-RLflow: GATv2Encoder's layers on edge features updated once from their ends,

        e'_ji = e_ji + MLP([h0_j, h0_i, e_ji])          (h0: the embedded nodes)
    """

    def make_edge_update(self, cfg: EncoderConfig) -> nn.Module | None:
        return mlp(3 * cfg.hidden, cfg.hidden, cfg.hidden)

    def edge_features(self, h0: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        e = self.edge_in(edge_attr)
        src, dst = edge_index
        return e + self.edge_update(torch.cat([h0[src], h0[dst], e], dim=1))  # type: ignore[misc]


class GINEncoder(GraphEncoder):
    """GINE layers (Hu et al. 2020; PyG's GINEConv with eps = 0), the edge features added to each message:

        h'_i = MLP(h_i + sum_{j in N(i)} ReLU(h_j + e_ji))
    """

    def make_conv(self, cfg: EncoderConfig) -> nn.Module:
        return GINEConv(mlp(cfg.hidden, cfg.hidden, cfg.hidden), edge_dim=cfg.hidden)


class GCNEncoder(GraphEncoder):
    """GCN layers (Kipf & Welling 2017; PyG's GCNConv with self-loops); no edge features, the structure only:

        h'_i = sum_{j in N(i) + i} (deg_i + 1)^-1/2 (deg_j + 1)^-1/2 W h_j + b

    The degrees are passed in (`gcn_propagate`), so that a candidate region's boundary nodes keep theirs.
    """

    reads_edges = False
    needs_degree = True

    def make_conv(self, cfg: EncoderConfig) -> nn.Module:
        return GCNConv(cfg.hidden, cfg.hidden)

    def message_passing(self, conv: nn.Module, h: Tensor, edge_index: Tensor, e: Tensor | None, deg: Tensor | None,
                        n_out: int | None) -> Tensor:
        return gcn_propagate(conv, h, edge_index, deg, n_out)  # type: ignore[arg-type]


register_encoder("gat", GATEncoder)
register_encoder("gatv2", GATv2Encoder)
register_encoder("gin", GINEncoder)
register_encoder("gcn", GCNEncoder)
