"""What every search returns: the graph it chose, its cost, and how it got there."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from xrl.ir import Graph


@dataclass
class SearchResult:
    """The outcome of one search (greedy, random, TASO, Tensat, RL, or a registered plug-in).

    `steps` lists the rewrites applied to reach `graph`, as `rule@node,node` (a method whose result
    is not a sequence of rewrites, like Tensat's extraction, describes its changes there instead).
    `details` holds method-specific extras. A runner (`xrl.search.registry`) needs to fill in only
    `graph`, `steps` and `details`: the pipeline recomputes every cost itself. The searches also report
    their own `cost` and `original_cost` (NaN when not reported), `explored` (what the method examined:
    candidates for greedy and random search, graphs expanded for TASO, e-nodes for Tensat), the seconds
    they took and their `method` name.
    """

    graph: Graph
    steps: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    cost: float = math.nan
    original_cost: float = math.nan
    explored: int = 0
    time_s: float = 0.0
    method: str = ""

    @property
    def speedup(self) -> float:
        """original_cost / cost: above 1 is faster."""
        return self.original_cost / self.cost if self.cost > 0 else float("inf")

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, without the graph itself (its size and hash stand for it)."""
        return {"method": self.method, "cost": self.cost, "original_cost": self.original_cost,
                "speedup": self.speedup, "steps": list(self.steps), "explored": self.explored,
                "time_s": self.time_s, "nodes": len(self.graph), "graph_hash": self.graph.canonical_hash,
                "details": dict(self.details)}
