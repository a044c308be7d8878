"""The rewrite environment's observation as fixed-size arrays: the state itself, for any RL library.

A Dict of Box arrays padded to declared maxima, with counts (what Stable-Baselines3 and most libraries
consume; gymnasium's Graph space is not supported by them). With A = max_candidates + 1 actions,
N = max_nodes, E = max_edges:

    summary        [6]              size, FLOPs, bytes, cost relative to the start; horizon used; log #candidates
    num_actions    Discrete(A + 1)  valid actions this step (the no-op included)
    state          [STATE_DIM]      fraction of the horizon left, estimated cost / start cost
    node_x         [N, NODE_DIM]    the current graph's nodes (xrl.features.featurize layout), zero-padded
    edge_index     [2, E] int64     producer row -> consumer row; padding edges are (0, 0) beyond num_edges
    edge_attr      [E, EDGE_DIM]
    graph_attr     [GLOBAL_DIM]
    num_nodes      [1] int64        rows of node_x in use
    num_edges      [1] int64        columns of edge_index in use
    cand_rule      [A] int64        action k's rule: 1 + index in engine.rules; 0 for the no-op and padding
    cand_loc       [A, MAX_LOC]     1 + node_x row of each matched node (pattern order); 0: none
    cand_added_op  [A, MAX_ADDED]   1 + OP_VOCAB index of each node the rewrite adds; 0: none
    cand_hints     [A, CAND_DIM]    estimated relative change of cost, op count, FLOPs (0 for the no-op)
    action_mask    MultiBinary(A)   1 where the action is valid (the same as `env.action_masks()`)

A candidate is described by what it changes (rule, where, what it adds, estimated effect), not by its
whole rewritten graph: A full graphs per step would not fit a replay or rollout buffer. A graph larger
than the declared maxima is cut to them (later rows and their edges dropped) with a warning.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM, OP_VOCAB
from xrl.features.metagraph import CAND_DIM, STATE_DIM, FeatureCache
from xrl.ir import Graph

log = logging.getLogger(__name__)

MAX_LOC = 8  # matched nodes kept per candidate: rule sources are small patterns
MAX_ADDED = 8  # added nodes kept per candidate
SUMMARY_DIM = 6
SUMMARY_HIGH = 1e6
FEATURE_HIGH = 1e6  # features are scaled to about [0, 1]; this bound only makes the Box finite
_OP_ID = {op: i + 1 for i, op in enumerate(OP_VOCAB)}
_OTHER_ID = _OP_ID["other"]


def graph_rows(graph: Graph) -> int:
    """Rows `featurize` gives a graph: its inputs, its weights, its operators."""
    return len(graph.inputs) + len(graph.initializers) + len(graph)


def graph_edges(graph: Graph) -> int:
    return sum(1 for n in graph.topological_order for v in n.inputs if v)


@dataclass(frozen=True)
class ObservationLayout:
    max_nodes: int
    max_edges: int
    num_actions: int  # the action space's size: max_candidates + 1
    num_rules: int

    def space(self) -> spaces.Dict:
        n, e, a = self.max_nodes, self.max_edges, self.num_actions
        f32, i64 = np.float32, np.int64
        return spaces.Dict({
            "summary": spaces.Box(0.0, SUMMARY_HIGH, (SUMMARY_DIM,), f32),
            "num_actions": spaces.Discrete(a + 1),
            "state": spaces.Box(0.0, SUMMARY_HIGH, (STATE_DIM,), f32),
            "node_x": spaces.Box(0.0, FEATURE_HIGH, (n, NODE_DIM), f32),
            "edge_index": spaces.Box(0, n - 1, (2, e), i64),
            "edge_attr": spaces.Box(0.0, FEATURE_HIGH, (e, EDGE_DIM), f32),
            "graph_attr": spaces.Box(0.0, FEATURE_HIGH, (GLOBAL_DIM,), f32),
            "num_nodes": spaces.Box(0, n, (1,), i64),
            "num_edges": spaces.Box(0, e, (1,), i64),
            "cand_rule": spaces.Box(0, self.num_rules, (a,), i64),
            "cand_loc": spaces.Box(0, n, (a, MAX_LOC), i64),
            "cand_added_op": spaces.Box(0, len(OP_VOCAB), (a, MAX_ADDED), i64),
            "cand_hints": spaces.Box(-SUMMARY_HIGH, SUMMARY_HIGH, (a, CAND_DIM), f32),
            "action_mask": spaces.MultiBinary(a),
        })


def default_maxima(graph: Graph, growth: float = 2.0) -> tuple[int, int]:
    """Room for the start graph grown `growth` times (the engine's default growth limit), at least 64/128."""
    return max(64, math.ceil(growth * graph_rows(graph))), max(128, math.ceil(growth * graph_edges(graph)))


class Observer:
    """Builds observations of one layout; the current graph's features are memoised (FeatureCache)."""

    def __init__(self, layout: ObservationLayout, rule_names: Sequence[str]) -> None:
        self.layout = layout
        self.rule_id = {name: i + 1 for i, name in enumerate(rule_names)}
        self.features = FeatureCache(64)
        self._cut_warned: set[str] = set()

    def __call__(self, graph: Graph, candidates: Sequence[Any], hints: np.ndarray, state: np.ndarray,
                 summary: np.ndarray) -> dict[str, Any]:
        lay = self.layout
        n_max, e_max, a = lay.max_nodes, lay.max_edges, lay.num_actions
        data = self.features(graph)
        x, ei, ea = data.x.numpy(), data.edge_index.numpy(), data.edge_attr.numpy()
        n, e = x.shape[0], ei.shape[1]
        if n > n_max or e > e_max:
            if graph.name not in self._cut_warned:
                log.warning("%s: %d nodes and %d edges exceed the observation's %d and %d; the rest is cut "
                            "(raise max_nodes / max_edges)", graph.name, n, e, n_max, e_max)
                self._cut_warned.add(graph.name)
            keep = (ei[0] < n_max) & (ei[1] < n_max)
            ei, ea = ei[:, keep][:, :e_max], ea[keep][:e_max]
            n, e = min(n, n_max), ei.shape[1]
        node_x = np.zeros((n_max, NODE_DIM), np.float32)
        node_x[:n] = x[:n]
        edge_index = np.zeros((2, e_max), np.int64)
        edge_index[:, :e] = ei
        edge_attr = np.zeros((e_max, EDGE_DIM), np.float32)
        edge_attr[:e] = ea

        n_src = len(graph.inputs) + len(graph.initializers)
        row = {node.name: n_src + k for k, node in enumerate(graph.topological_order)}
        k = len(candidates) + 1
        cand_rule = np.zeros(a, np.int64)
        cand_loc = np.zeros((a, MAX_LOC), np.int64)
        cand_added = np.zeros((a, MAX_ADDED), np.int64)
        for i, c in enumerate(candidates, start=1):
            cand_rule[i] = self.rule_id.get(str(getattr(c.rule, "name", c.rule)), 0)
            locs = [row[v] + 1 for v in c.location[:MAX_LOC] if v in row and row[v] < n_max]
            cand_loc[i, :len(locs)] = locs
            ops = [_OP_ID.get(nd.op, _OTHER_ID) for nd in c.added[:MAX_ADDED]]
            cand_added[i, :len(ops)] = ops
        cand_hints = np.zeros((a, CAND_DIM), np.float32)
        cand_hints[:k] = np.clip(hints[:k], -SUMMARY_HIGH, SUMMARY_HIGH)
        mask = np.zeros(a, np.int8)
        mask[:k] = 1
        return {
            "summary": summary, "num_actions": k, "state": np.clip(state, 0.0, SUMMARY_HIGH).astype(np.float32),
            "node_x": np.clip(node_x, 0.0, FEATURE_HIGH), "edge_index": edge_index,
            "edge_attr": np.clip(edge_attr, 0.0, FEATURE_HIGH),
            "graph_attr": np.clip(data.u.numpy()[0], 0.0, FEATURE_HIGH),
            "num_nodes": np.array([n], np.int64), "num_edges": np.array([e], np.int64),
            "cand_rule": cand_rule, "cand_loc": cand_loc, "cand_added_op": cand_added, "cand_hints": cand_hints,
            "action_mask": mask,
        }
