"""The meta-graph: a state's current graph and all its candidates as one disjoint union of graphs.

For one state with current graph G and rewrites G_1..G_n the meta-graph holds n + 1 graphs,

    graphs      [G, G_1, ..., G_n]              one PyG Batch, no fixed maximum of candidates
    cand_graph  [0, 1, ..., n]                  candidate k's graph; candidate 0 is the no-op (G itself)
    cand_state  [0, 0, ..., 0]                  which state each candidate belongs to
    state_graph [0]                             each state's current graph

`collate` joins several states' meta-graphs into one (indices offset), which is how PPO batches a
minibatch of states: one encoder pass over every graph of every state. Candidates are featurised
through a `FeatureCache`, so a graph seen again is not featurised again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from xrl.ir import Graph

if TYPE_CHECKING:  # imported where used: the env (and release-mode policies) run without torch_geometric
    from torch_geometric.data import Batch, Data

CAND_DIM = 3  # per-candidate hints the env supplies: relative change of cost, op count, FLOPs (0 for the no-op)
STATE_DIM = 2  # per-state scalars the env supplies: fraction of the horizon left, cost / original cost


@dataclass
class MetaGraph:
    """One or more states' graphs and candidates as one disjoint union (see the module docstring)."""

    graphs: Batch
    state_graph: Tensor  # [S] long
    cand_graph: Tensor  # [C] long
    cand_state: Tensor  # [C] long, sorted
    cand_attr: Tensor  # [C, CAND_DIM] float
    state_attr: Tensor  # [S, STATE_DIM] float

    @property
    def num_states(self) -> int:
        return int(self.state_graph.numel())

    @property
    def num_candidates(self) -> int:
        return int(self.cand_graph.numel())

    @property
    def num_nodes(self) -> int:
        return int(self.graphs.num_nodes)

    def candidate_counts(self) -> Tensor:
        """[S] candidates per state (the no-op included)."""
        return torch.bincount(self.cand_state, minlength=self.num_states)

    def to(self, device: torch.device | str) -> MetaGraph:
        return MetaGraph(self.graphs.to(device), self.state_graph.to(device), self.cand_graph.to(device),
                         self.cand_state.to(device), self.cand_attr.to(device), self.state_attr.to(device))

    @staticmethod
    def collate(items: Sequence[MetaGraph]) -> MetaGraph:
        """Several meta-graphs as one: graphs concatenated, every index shifted by what precedes it."""
        if len(items) == 1:
            return items[0]
        xs, eis, eas, us, batches, sg, cg, cs = [], [], [], [], [], [], [], []
        node_off = graph_off = state_off = 0
        for m in items:
            g = m.graphs
            xs.append(g.x)
            eis.append(g.edge_index + node_off)
            eas.append(g.edge_attr)
            us.append(g.u)
            batches.append(g.batch + graph_off)
            sg.append(m.state_graph + graph_off)
            cg.append(m.cand_graph + graph_off)
            cs.append(m.cand_state + state_off)
            node_off += g.num_nodes
            graph_off += g.num_graphs
            state_off += m.num_states
        from torch_geometric.data import Batch

        batch = torch.cat(batches)
        counts = torch.bincount(batch, minlength=graph_off)
        ptr = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
        graphs = Batch(x=torch.cat(xs), edge_index=torch.cat(eis, dim=1), edge_attr=torch.cat(eas),
                       u=torch.cat(us), batch=batch, ptr=ptr)
        return MetaGraph(graphs, torch.cat(sg), torch.cat(cg), torch.cat(cs),
                         torch.cat([m.cand_attr for m in items]), torch.cat([m.state_attr for m in items]))


def build_metagraph(current: Data, candidates: Sequence[Data], cand_attr: Tensor | None = None,
                    state_attr: Tensor | None = None) -> MetaGraph:
    """One state's meta-graph: `current` and its rewrites `candidates` (the no-op is added as candidate 0).

    `cand_attr` [len(candidates) + 1, CAND_DIM] and `state_attr` [STATE_DIM] default to zeros.
    """
    from torch_geometric.data import Batch

    graphs = Batch.from_data_list([current, *candidates])
    n = len(candidates) + 1
    if cand_attr is None:
        cand_attr = torch.zeros(n, CAND_DIM)
    if cand_attr.shape != (n, CAND_DIM):
        raise ValueError(f"cand_attr must be [{n}, {CAND_DIM}] (the no-op first), not {tuple(cand_attr.shape)}")
    if state_attr is None:
        state_attr = torch.zeros(STATE_DIM)
    return MetaGraph(graphs, torch.zeros(1, dtype=torch.long), torch.arange(n), torch.zeros(n, dtype=torch.long),
                     cand_attr.float(), state_attr.float().reshape(1, STATE_DIM))


class FeatureCache:
    """featurize memoised, least recently used first out.

    Keyed by canonical hash where a graph already has one (hashing a graph costs more than
    featurising it, so a hash is never computed just for the cache), else by the identity of the
    object the features belong to (the entry holds it, so an id is not reused while it lives).
    Pays when a graph comes back: every episode that restarts on a graph sees the same first
    candidates (the env keeps them), and rewrites applied in either order meet in one graph.
    """

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._items: OrderedDict[object, tuple[object, Data]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def __call__(self, graph: Graph) -> Data:
        return self.get(graph, lambda: graph)

    def get(self, owner: object, make_graph: Callable[[], Graph]) -> Data:
        """Features of the graph `make_graph()` builds for `owner` (a Graph, or e.g. a rewrite candidate)."""
        from xrl.features.featurize import featurize

        if self.capacity <= 0:
            return featurize(make_graph())
        key: object = getattr(owner, "__dict__", {}).get("canonical_hash") or id(owner)
        hit = self._items.get(key)
        if hit is not None and (isinstance(key, str) or hit[0] is owner):
            self._items.move_to_end(key)
            self.hits += 1
            return hit[1]
        self.misses += 1
        data = featurize(make_graph())
        self._items[key] = (owner, data)
        self._items.move_to_end(key)
        if len(self._items) > self.capacity:
            self._items.popitem(last=False)
        return data
