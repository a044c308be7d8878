"""Candidates as the regions they change: a state's meta-graph in O(|G| + sum of regions), not O(candidates x |G|).

A rewrite candidate differs from its state's graph G by a few nodes, and an L-layer message-passing
encoder changes node states only within L hops of a change. So G is featurised and encoded once, and
each candidate is described by its region (`region`), in the candidate graph's node space:

    D_0        nodes whose feature row or incident edges differ from G's: the added nodes, new weights,
               consumers of renamed values, and every producer that gained or lost an edge
    D_l        D_{l-1} + their neighbours (l = 1..L)
    boundary   neighbours of D_L outside it: read, never recomputed
    level[k]   min {l : k in D_l}, L + 1 on the boundary

with, per local node, the row of G it is (`prow`, -1 for a new node) and its feature row where that
changed (`x_new`), the candidate's edges into the region (G's edge ids where unchanged, new feature
rows otherwise), G's rows the candidate drops (`rem`), its global features `u` and node count. The
encoder (`GraphEncoder.encode_incremental`) recomputes layer l only where level <= l and reads G's
states elsewhere: exactly the full re-encoding, up to float rounding (tests/test_incremental_encoding.py).

No candidate graph is built: the region comes from the rewrite's delta (`removed`, `added`, `rename`,
`new_types`, `weights`: xrl.rewrite.candidate.Candidate) and follows `Graph.replace` (renamed uses, values
and weights nobody reads any more dropped). `IncrementalMeta` is the observation: the states' graphs
and the regions of all their candidates, collated like `MetaGraph`, and as compact to keep in a rollout.
"""

from __future__ import annotations

import importlib
import math
from collections import ChainMap, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Batch, Data

from xrl.errors import InvalidGraphError
from xrl.features.metagraph import CAND_DIM, STATE_DIM
from xrl.ir import Graph, Node, TensorType

F = importlib.import_module("xrl.features.featurize")  # the module (the package exports its function)
_INPUT, _WEIGHT = F._OP_INDEX["Input"], F._OP_INDEX["Weight"]
_TYPE_ROWS: dict[tuple[TensorType, bool, int], np.ndarray] = {}  # edge feature rows by (type, is-weight, slot)


def _edge_row(t: TensorType, is_weight: bool, slot: int) -> np.ndarray:
    key = (t, is_weight, slot)
    row = _TYPE_ROWS.get(key)
    if row is None:
        if len(_TYPE_ROWS) > 1 << 16:
            _TYPE_ROWS.clear()
        row = np.zeros(F.EDGE_DIM, dtype=np.float32)
        row[:F._TYPE_DIM] = F._type_features(t)
        row[F._TYPE_DIM] = is_weight
        row[F._TYPE_DIM + 1] = np.float32(min(slot, F.MAX_SLOT) / F.MAX_SLOT)
        _TYPE_ROWS[key] = row
    return row


def _op_x(op_row: tuple, is_output: bool) -> np.ndarray:
    """One operator's feature row, exactly as `featurize` writes it."""
    op, kind, act, attrs, flops, nbytes = op_row
    x = np.zeros(F.NODE_DIM, dtype=np.float32)
    x[op] = 1.0
    x[F._KIND_OFF + kind] = 1.0
    x[F._ATTR_OFF:F._ATTR_OFF + F.N_ATTR] = attrs
    if act >= 0:
        x[F._ACT_OFF + act] = 1.0
    x[F._COST_OFF] = np.log1p(np.float64(flops)) / math.log1p(F._FLOPS_REF)
    x[F._COST_OFF + 1] = np.log1p(np.float64(nbytes)) / math.log1p(F._BYTES_REF)
    x[F._OUT_FLAG] = is_output
    return x


def _source_x(op: int, nbytes: int, is_output: bool) -> np.ndarray:
    x = np.zeros(F.NODE_DIM, dtype=np.float32)
    x[op] = 1.0
    x[F._COST_OFF + 1] = F._log_scale(nbytes, F._BYTES_REF)
    x[F._OUT_FLAG] = is_output
    return x


def _u_row(flops: int, nbytes: int, n: int, e: int) -> np.ndarray:
    return np.array([F._log_scale(flops, F._TOTAL_FLOPS_REF), F._log_scale(nbytes, F._TOTAL_BYTES_REF),
                     F._log_scale(n, F._COUNT_REF), F._log_scale(e, F._COUNT_REF)], dtype=np.float32)


class _TypesView:
    """What featurising a node reads of its graph (`types`, `type_of`), for a candidate never built."""

    def __init__(self, types: Mapping[str, TensorType]) -> None:
        self.types = types

    def type_of(self, value: str) -> TensorType:
        try:
            return self.types[value]
        except KeyError:
            raise InvalidGraphError(f"value {value!r} has no type") from None


class StateIndex:
    """A state's graph featurised, with what regions are cut from: rows by name, edges by node, degrees."""

    def __init__(self, graph: Graph, data: Data | None = None) -> None:
        self.graph = graph
        self.data = data if data is not None else F.featurize(graph)
        order = graph.topological_order
        self.row_of_value: dict[str, int] = {v: i for i, v in enumerate(graph.inputs)}
        self.row_of_value.update((v, len(graph.inputs) + i) for i, v in enumerate(graph.initializers))
        n_src = len(self.row_of_value)
        self.row_of_node: dict[str, int] = {}
        self.flops = self.nbytes = 0
        for k, node in enumerate(order):
            self.row_of_node[node.name] = n_src + k
            for v in node.outputs:
                self.row_of_value[v] = n_src + k
            row = F._cached_op_row(node, graph)
            self.flops += row[4]
            self.nbytes += row[5]
        self.n = n_src + len(order)
        src, dst = self.data.edge_index.tolist()
        self.e = len(src)
        self.in_edges: list[list[tuple[int, int]]] = [[] for _ in range(self.n)]  # row -> [(producer row, edge id)]
        self.out_nbrs: list[list[int]] = [[] for _ in range(self.n)]  # row -> consumer rows, one per edge
        for eid, (s, d) in enumerate(zip(src, dst)):
            self.in_edges[d].append((s, eid))
            self.out_nbrs[s].append(d)
        self.out_flag = self.data.x[:, F._OUT_FLAG].numpy() > 0

    def nbrs(self, row: int) -> list[int]:
        return [s for s, _ in self.in_edges[row]] + self.out_nbrs[row]


@dataclass
class Region:
    """One candidate as the region it changes (see the module docstring); arrays are region-local."""

    prow: np.ndarray  # [n] int64: G's row of each local node, -1 for a new one
    xnew: np.ndarray  # [n] int64: row of `x_new` where the node's features differ from G's, else -1
    level: np.ndarray  # [n] int64: 0..L inside the region, L + 1 on its boundary
    deg: np.ndarray  # [n] float32: the node's degree in the candidate graph (GCN's normalisation)
    x_new: np.ndarray  # [m, NODE_DIM]
    edge_index: np.ndarray  # [2, e] int64: local producer -> local consumer
    eid: np.ndarray  # [e] int64: G's edge id where the edge is G's, else -1
    enew: np.ndarray  # [e] int64: row of `edge_attr_new` otherwise, else -1
    edge_attr_new: np.ndarray  # [k, EDGE_DIM]
    rem: np.ndarray  # [r] int64: G's rows the candidate drops (removed operators, weights nobody reads)
    u: np.ndarray  # [GLOBAL_DIM]
    count: int  # the candidate graph's node count
    keys: list[str]  # each local node's name: its operator's name, or the value a source node stands for


def region(st: StateIndex, cand: Any, layers: int) -> Region:
    """The region of rewrite `cand` (an engine Candidate of `st.graph`) for an encoder of `layers` layers."""
    g = st.graph
    n = st.n
    removed = {node.name for node in cand.removed}
    removed_rows = {st.row_of_node[name] for name in removed}
    rename: Mapping[str, str] = cand.rename
    new_types: Mapping[str, TensorType] = cand.new_types
    types = ChainMap(dict(new_types), g.types)
    view = _TypesView(types)
    # Values whose type, or weight, the rewrite replaces in place (rare): their readers and producer change too.
    retyped = {v for v, t in new_types.items() if v in g.types and g.types[v] != t}
    retyped |= {w for w in cand.weights if w in g.initializers}

    # Values an added node now produces under their old name: their readers get a new producer.
    reproduced = [v for node in cand.added for v in node.outputs if v in st.row_of_value]

    # Kept operators whose inputs (or rows) change, as the candidate graph holds them (Graph.replace).
    changed: dict[str, Node] = {}
    for v in (*rename, *retyped, *reproduced):
        for c in g.consumers.get(v, ()):
            if c.name not in removed and c.name not in changed:
                ins = tuple(rename.get(x, x) for x in c.inputs)
                changed[c.name] = c if ins == c.inputs else Node(c.name, c.op, ins, c.outputs, c.attrs, c.domain)
    for v in retyped:
        p = g.producer(v)
        if p is not None and p.name not in removed and p.name not in changed:
            changed[p.name] = p
    changed_rows = {st.row_of_node[name] for name in changed}

    # New nodes get ids from n on: added operators, then the new weights someone reads.
    keys: dict[int, str] = {}
    prod_new: dict[str, int] = {}
    readers: list[tuple[int, Node]] = []
    for k, node in enumerate(cand.added):
        keys[n + k] = node.name
        prod_new.update((v, n + k) for v in node.outputs)
        readers.append((n + k, node))
    readers += [(st.row_of_node[name], node) for name, node in changed.items()]
    outputs = {rename.get(v, v) for v in g.outputs}
    read = {v for _, node in readers for v in node.inputs if v}
    new_weights = [w for w in cand.weights if w not in g.initializers and (w in read or w in outputs)]
    for w in new_weights:
        prod_new[w] = n + len(keys)
        keys[n + len(keys)] = w
    new_weight_set = set(new_weights)
    # Parent weights nobody reads any more are dropped (Graph.replace).
    maybe_dropped = {v for node in cand.removed for v in node.inputs if v in g.initializers}
    maybe_dropped |= {v for name in changed for v in g.nodes[name].inputs if v in g.initializers}
    dropped = {w for w in maybe_dropped if w not in read and w not in outputs
               and not any(c.name not in removed and c.name not in changed for c in g.consumers.get(w, ()))}
    dropped_rows = {st.row_of_value[w] for w in dropped}
    gone = removed_rows | dropped_rows

    def prod(v: str) -> int:
        p = prod_new.get(v)
        if p is None:
            p = st.row_of_value.get(v)
            if p is None or p in gone:
                raise InvalidGraphError(f"candidate {getattr(cand, 'rule', '?')}: value {v!r} has no producer")
        return p

    # The changed operators' incoming edges, and who reads what through them.
    edge_rows: list[np.ndarray] = []
    new_in: dict[int, list[tuple[int, int]]] = {}  # id -> [(producer id, row of edge_rows)]
    rev: dict[int, list[int]] = {}  # producer id -> changed consumers, one per edge
    for k, node in readers:
        lst = []
        for s, v in enumerate(node.inputs):
            if not v:
                continue
            p = prod(v)
            lst.append((p, len(edge_rows)))
            edge_rows.append(_edge_row(types[v], v in g.initializers or v in new_weight_set, s))
            rev.setdefault(p, []).append(k)
        new_in[k] = lst

    # D_0: new or changed nodes, and every node that gained or lost an incident edge or its output flag.
    d0 = set(new_in) | set(rev) | {prod_new[w] for w in new_weights}
    for node in (*cand.removed, *(g.nodes[name] for name in changed)):
        d0.update(st.row_of_value[v] for v in node.inputs if v)
    for v in g.outputs:
        if v in rename:
            d0.update((st.row_of_value[v], prod(rename[v])))
    d0 |= {st.row_of_value[w] for w in retyped if w in g.initializers}
    d0 -= gone

    def nbrs(k: int) -> list[int]:
        if k >= n or k in changed_rows:
            ins = [p for p, _ in new_in.get(k, ())]
        else:
            ins = [s for s, _ in st.in_edges[k]]
        if k >= n:
            return ins + rev.get(k, [])
        if k in d0:
            return ins + [c for c in st.out_nbrs[k] if c not in gone and c not in changed_rows] + rev.get(k, [])
        return ins + st.out_nbrs[k]

    level = dict.fromkeys(d0, 0)
    frontier = list(d0)
    for lv in range(1, layers + 2):  # the last ring (L + 1) is the boundary
        nxt = []
        for k in frontier:
            for j in nbrs(k):
                if j not in level:
                    level[j] = lv
                    nxt.append(j)
        frontier = nxt

    local = {k: i for i, k in enumerate(level)}
    names = _row_names(st)
    n_src = n - len(g)
    changed_at = {st.row_of_node[name]: node for name, node in changed.items()}
    weight_of = {prod_new[w]: w for w in new_weights}
    m = len(local)
    prow = np.array([k if k < n else -1 for k in local], dtype=np.int64)
    lev = np.fromiter(level.values(), dtype=np.int64, count=m)
    deg = np.empty(m, dtype=np.float32)
    xnew = np.full(m, -1, dtype=np.int64)
    x_rows: list[np.ndarray] = []
    src: list[int] = []
    dst: list[int] = []
    eid: list[int] = []
    enew: list[int] = []
    for k, i in local.items():
        lv = level[k]
        deg[i] = len(nbrs(k))
        # Feature rows: new and changed nodes, and kept ones whose output flag moved.
        row = None
        if k in weight_of:
            w = weight_of[k]
            row = _source_x(_WEIGHT, types[w].nbytes, w in outputs)
        elif k >= n or k in changed_rows:
            node = cand.added[k - n] if k >= n else changed_at[k]
            row = _op_x(F._cached_op_row(node, view), any(v in outputs for v in node.outputs))
        elif lv == 0:
            if k < n_src:
                v = names[k]
                flag = v in outputs
                if v in retyped:
                    row = _source_x(_INPUT if k < len(g.inputs) else _WEIGHT, types[v].nbytes, flag)
            else:
                flag = any(v in outputs for v in g.topological_order[k - n_src].outputs)
            if row is None and flag != st.out_flag[k]:
                row = st.data.x[k].numpy().copy()
                row[F._OUT_FLAG] = flag
        if row is not None:
            xnew[i] = len(x_rows)
            x_rows.append(row)
        # Edges into this node that reach the region proper (all of them where the node is inside).
        if k in new_in:
            for p, r in new_in[k]:
                if lv <= layers or level[p] <= layers:
                    src.append(local[p])
                    dst.append(i)
                    eid.append(-1)
                    enew.append(r)
        elif k < n:
            for p, e in st.in_edges[k]:
                if lv <= layers or level.get(p, layers + 1) <= layers:
                    src.append(local[p])
                    dst.append(i)
                    eid.append(e)
                    enew.append(-1)

    # Global features: G's totals less what left, plus what came.
    flops, nbytes = st.flops, st.nbytes
    e_count = st.e
    for node in cand.removed:
        r = F._cached_op_row(node, g)
        flops, nbytes = flops - r[4], nbytes - r[5]
        e_count -= sum(1 for v in node.inputs if v)
    for name, node in changed.items():
        old, new = F._cached_op_row(g.nodes[name], g), F._cached_op_row(node, view)
        flops, nbytes = flops - old[4] + new[4], nbytes - old[5] + new[5]
        e_count -= sum(1 for v in g.nodes[name].inputs if v)
    for node in cand.added:
        r = F._cached_op_row(node, view)
        flops, nbytes = flops + r[4], nbytes + r[5]
    e_count += sum(len(lst) for lst in new_in.values())
    count = n - len(gone) + len(cand.added) + len(new_weights)

    key_list = [keys[k] if k >= n else names[k] for k in local]
    return Region(prow, xnew, lev, deg,
                  np.stack(x_rows) if x_rows else np.zeros((0, F.NODE_DIM), np.float32),
                  np.array([src, dst], dtype=np.int64).reshape(2, -1), np.array(eid, dtype=np.int64),
                  np.array(enew, dtype=np.int64),
                  np.stack(edge_rows) if edge_rows else np.zeros((0, F.EDGE_DIM), np.float32),
                  np.array(sorted(gone), dtype=np.int64), _u_row(flops, nbytes, count, e_count), count, key_list)


def _row_names(st: StateIndex) -> list[str]:
    names = st.__dict__.get("_names")
    if names is None:
        g = st.graph
        names = [*g.inputs, *g.initializers, *(node.name for node in g.topological_order)]
        st.__dict__["_names"] = names
    return names


@dataclass
class IncrementalMeta:
    """One or more states' graphs and the regions of all their candidates (cf. MetaGraph).

    Region fields index the states' batch: `loc_prow` and `rem_row` its rows, `loc_eid` its edges;
    `cand_region` names each action's region (-1: the no-op, whose graph is its state's).
    """

    graphs: Batch  # the S states' graphs
    loc_prow: Tensor  # [n] long, -1: new node
    loc_xnew: Tensor  # [n] long, -1: the state's row
    loc_level: Tensor  # [n] long
    loc_deg: Tensor  # [n] float
    loc_region: Tensor  # [n] long
    x_new: Tensor  # [m, NODE_DIM]
    loc_edge_index: Tensor  # [2, e] long, local node indices
    loc_eid: Tensor  # [e] long, -1: a new edge
    loc_enew: Tensor  # [e] long, -1: the state's edge
    edge_attr_new: Tensor  # [k, EDGE_DIM]
    rem_row: Tensor  # [r] long
    rem_region: Tensor  # [r] long
    region_u: Tensor  # [R, GLOBAL_DIM]
    region_count: Tensor  # [R] float: nodes of each candidate graph
    region_state: Tensor  # [R] long
    cand_region: Tensor  # [C] long
    cand_state: Tensor  # [C] long, sorted
    cand_attr: Tensor  # [C, CAND_DIM]
    state_attr: Tensor  # [S, STATE_DIM]

    @property
    def num_states(self) -> int:
        return int(self.graphs.num_graphs)

    @property
    def num_regions(self) -> int:
        return int(self.region_state.numel())

    @property
    def num_candidates(self) -> int:
        return int(self.cand_state.numel())

    @property
    def num_nodes(self) -> int:
        """Nodes the encoder reads: the states' and every region's (boundaries included)."""
        return int(self.graphs.num_nodes) + int(self.loc_prow.numel())

    def candidate_counts(self) -> Tensor:
        return torch.bincount(self.cand_state, minlength=self.num_states)

    def to(self, device: torch.device | str) -> IncrementalMeta:
        return IncrementalMeta(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    @staticmethod
    def collate(items: Sequence[IncrementalMeta]) -> IncrementalMeta:
        """Several as one: every index shifted by what precedes it (-1, "none", stays -1)."""
        if len(items) == 1:
            return items[0]
        offsets = {"node": 0, "edge": 0, "state": 0, "region": 0, "loc": 0, "xnew": 0, "enew": 0}
        parts: dict[str, list[Tensor]] = {f.name: [] for f in fields(IncrementalMeta) if f.name != "graphs"}
        shift = {"loc_prow": "node", "loc_xnew": "xnew", "loc_region": "region", "loc_edge_index": "loc",
                 "loc_eid": "edge", "loc_enew": "enew", "rem_row": "node", "rem_region": "region",
                 "region_state": "state", "cand_region": "region", "cand_state": "state"}
        for m in items:
            for name, lst in parts.items():
                t = getattr(m, name)
                key = shift.get(name)
                if key is not None and offsets[key]:
                    t = torch.where(t >= 0, t + offsets[key], t)
                lst.append(t)
            offsets["node"] += int(m.graphs.num_nodes)
            offsets["edge"] += int(m.graphs.edge_index.size(1))
            offsets["state"] += m.num_states
            offsets["region"] += m.num_regions
            offsets["loc"] += int(m.loc_prow.numel())
            offsets["xnew"] += int(m.x_new.size(0))
            offsets["enew"] += int(m.edge_attr_new.size(0))
        graphs = _cat_batches([m.graphs for m in items])
        out = {name: torch.cat(lst, dim=1 if name == "loc_edge_index" else 0) for name, lst in parts.items()}
        return IncrementalMeta(graphs=graphs, **out)


def _cat_batches(batches: Sequence[Batch]) -> Batch:
    """Disjoint union of batches of graphs (x, edge_index, edge_attr, u, batch, ptr)."""
    node_off = graph_off = 0
    eis, bs = [], []
    for b in batches:
        eis.append(b.edge_index + node_off)
        bs.append(b.batch + graph_off)
        node_off += int(b.num_nodes)
        graph_off += int(b.num_graphs)
    batch = torch.cat(bs)
    counts = torch.bincount(batch, minlength=graph_off)
    ptr = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
    return Batch(x=torch.cat([b.x for b in batches]), edge_index=torch.cat(eis, dim=1),
                 edge_attr=torch.cat([b.edge_attr for b in batches]), u=torch.cat([b.u for b in batches]),
                 batch=batch, ptr=ptr)


class IncrementalFeatures:
    """Builds `IncrementalMeta` observations; states and regions memoised by object identity.

    The state's index is kept per graph object, a region per candidate object (the env keeps the
    first step's candidates across episodes, so every episode after the first starts from cache).
    Least recently used first out; an entry holds its key object, so an id is not reused while it lives.
    """

    def __init__(self, layers: int, capacity: int = 4096) -> None:
        self.layers = layers
        self.capacity = capacity
        self._states: OrderedDict[int, tuple[Graph, StateIndex]] = OrderedDict()
        self._regions: OrderedDict[int, tuple[Any, Region]] = OrderedDict()

    def _memo(self, store: OrderedDict, owner: Any, make: Any, capacity: int | None = None) -> Any:
        capacity = self.capacity if capacity is None else capacity
        hit = store.get(id(owner))
        if hit is not None and hit[0] is owner:
            store.move_to_end(id(owner))
            return hit[1]
        value = make()
        if capacity > 0:
            store[id(owner)] = (owner, value)
            if len(store) > capacity:
                store.popitem(last=False)
        return value

    def state(self, graph: Graph) -> StateIndex:
        # Few states come back (an episode's start graph, mostly), and an index weighs like its graph.
        return self._memo(self._states, graph, lambda: StateIndex(graph), min(self.capacity, 64))

    def region(self, st: StateIndex, cand: Any) -> Region:
        return self._memo(self._regions, cand, lambda: region(st, cand, self.layers))

    def __call__(self, graph: Graph, candidates: Sequence[Any], cand_attr: Tensor | None = None,
                 state_attr: Tensor | None = None) -> IncrementalMeta:
        """One state's observation: `graph` and its rewrites `candidates` (the no-op is action 0)."""
        st = self.state(graph)
        regions = [self.region(st, c) for c in candidates]
        return assemble(st, regions, cand_attr, state_attr)

    def observe(self, env: Any) -> IncrementalMeta:
        """The observation of a GraphRewriteEnv's current state (candidate k = action k)."""
        return self(env.graph, env.candidates, torch.from_numpy(env.candidate_hints()),
                    torch.from_numpy(env.state_features()))


def assemble(st: StateIndex, regions: Sequence[Region], cand_attr: Tensor | None = None,
             state_attr: Tensor | None = None) -> IncrementalMeta:
    """One state's `IncrementalMeta` from its index and its candidates' regions (in action order, no-op excluded)."""
    r = len(regions)
    sizes = np.array([len(x.prow) for x in regions], dtype=np.int64)
    loc_off = np.concatenate([[0], np.cumsum(sizes)])[:-1]
    xn_off = np.concatenate([[0], np.cumsum([len(x.x_new) for x in regions])])[:-1]
    en_off = np.concatenate([[0], np.cumsum([len(x.edge_attr_new) for x in regions])])[:-1]

    def cat(arrays: list[np.ndarray], dtype: Any, width: int = 0) -> Tensor:
        if not arrays:
            return torch.zeros((0, width) if width else (0,), dtype=dtype)
        return torch.from_numpy(np.concatenate(arrays))

    def shifted(a: np.ndarray, off: int) -> np.ndarray:
        return np.where(a >= 0, a + off, a)

    n = r + 1
    if cand_attr is None:
        cand_attr = torch.zeros(n, CAND_DIM)
    if cand_attr.shape != (n, CAND_DIM):
        raise ValueError(f"cand_attr must be [{n}, {CAND_DIM}] (the no-op first), not {tuple(cand_attr.shape)}")
    if state_attr is None:
        state_attr = torch.zeros(STATE_DIM)
    d = st.data
    graphs = Batch.from_data_list([Data(x=d.x, edge_index=d.edge_index, edge_attr=d.edge_attr, u=d.u,
                                        num_nodes=d.num_nodes)])
    return IncrementalMeta(
        graphs=graphs,
        loc_prow=cat([x.prow for x in regions], torch.long),
        loc_xnew=cat([shifted(x.xnew, int(o)) for x, o in zip(regions, xn_off)], torch.long),
        loc_level=cat([x.level for x in regions], torch.long),
        loc_deg=cat([x.deg for x in regions], torch.float32),
        loc_region=torch.from_numpy(np.repeat(np.arange(r, dtype=np.int64), sizes)),
        x_new=cat([x.x_new for x in regions], torch.float32, F.NODE_DIM).reshape(-1, F.NODE_DIM),
        loc_edge_index=(torch.from_numpy(np.concatenate([x.edge_index + o for x, o in zip(regions, loc_off)], axis=1))
                        if r else torch.zeros(2, 0, dtype=torch.long)),
        loc_eid=cat([x.eid for x in regions], torch.long),
        loc_enew=cat([shifted(x.enew, int(o)) for x, o in zip(regions, en_off)], torch.long),
        edge_attr_new=cat([x.edge_attr_new for x in regions], torch.float32, F.EDGE_DIM).reshape(-1, F.EDGE_DIM),
        rem_row=cat([x.rem for x in regions], torch.long),
        rem_region=torch.from_numpy(np.repeat(np.arange(r, dtype=np.int64), [len(x.rem) for x in regions])),
        region_u=(torch.from_numpy(np.stack([x.u for x in regions])) if r
                  else torch.zeros(0, F.GLOBAL_DIM)),
        region_count=torch.tensor([float(x.count) for x in regions], dtype=torch.float32),
        region_state=torch.zeros(r, dtype=torch.long),
        cand_region=torch.arange(-1, r, dtype=torch.long),
        cand_state=torch.zeros(n, dtype=torch.long),
        cand_attr=cand_attr.float(),
        state_attr=state_attr.float().reshape(1, STATE_DIM),
    )
