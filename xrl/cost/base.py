"""The cost interface every backend implements: `cost(graph) -> seconds`, plus per-op costs.

Per-op backends (analytic, measured per operator) sum op costs, so a rewrite is re-costed from its
delta: the old cost, minus the removed nodes' costs, plus the added ones' (`delta_cost`). Whole-
graph backends (onnxruntime, end-to-end GPU timing) set `per_op = False` and measure the graph.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from xrl.errors import ConfigError
from xrl.ir import Graph, Node

if TYPE_CHECKING:
    from xrl.cost.targets import Target


@dataclass(frozen=True)
class Measurement:
    """A timed quantity: median of `repeats` runs after warm-up, and its coefficient of variation."""

    median_s: float
    repeats: int
    cv: float  # std / mean over the repeats; 0 for a model that does not measure
    min_s: float = 0.0
    max_s: float = 0.0


def op_key(node: Node, graph: Graph) -> tuple:
    """What determines one operator's run time: op, attributes, input types (not names, not values)."""
    return (node.domain, node.op, node.attr_key(), tuple(str(graph.type_of(v)) if v else "" for v in node.inputs),
            tuple(graph.is_weight(v) for v in node.inputs), tuple(str(graph.type_of(v)) for v in node.outputs))


class CostModel(ABC):
    """Estimated or measured run time of a graph, in seconds."""

    name: str = "base"
    per_op: bool = True  # True: graph cost is the sum of op costs, and delta_cost is exact
    measured: bool = False  # True: a noisy timing, which a search must confirm before it trusts a gain
    # time.monotonic() past which a measuring model times no new kernel (the search's time limit); the
    # estimates ignore it. Declared here so that callers set it on any model, never by hasattr
    deadline: float | None = None
    # the runtime whose kernels a target model costs (xrl.cost.targets sets it); None for the research
    # models, which cost the IR as it is
    target: Target | None = None
    # True where the model re-costs a rewrite from the kernels near it (`plan_costs` once a step, then
    # `local_cost` per candidate: xrl.cost.kernel_measured); greedy and the call budget read this flag
    local_costing: bool = False
    # what a measuring model counted so far (kernels or ops timed, cache hits, ...): rollouts report the
    # difference over an update. Empty, and read-only, for a model that counts nothing; a counting model
    # sets its own dict in __init__
    stats: Mapping[str, float] = MappingProxyType({})

    def __init__(self) -> None:
        self._op_cache: dict[tuple, float] = {}

    @abstractmethod
    def _op_cost(self, node: Node, graph: Graph) -> float:
        """Seconds for one node in `graph` (uncached)."""

    def op_cost(self, node: Node, graph: Graph) -> float:
        key = op_key(node, graph)
        c = self._op_cache.get(key)
        if c is None:
            c = self._op_cache[key] = self._op_cost(node, graph)
        return c

    def op_costs(self, graph: Graph) -> dict[str, float]:
        """node name -> seconds."""
        return {n.name: self.op_cost(n, graph) for n in graph.nodes.values()}

    def cost(self, graph: Graph) -> float:
        """Seconds for the whole graph."""
        # fsum: graphs that differ only in node order get bit-identical costs
        return math.fsum(self.op_cost(n, graph) for n in graph.nodes.values())

    def measure(self, graph: Graph) -> Measurement:
        """The graph's cost with its spread; an analytic model has none."""
        c = self.cost(graph)
        return Measurement(c, 1, 0.0, c, c)

    def report(self) -> dict[str, Any] | None:
        """What the model did for the result's `cost_report` (a measuring model's cache hits and timing
        time); None where there is nothing to say (an estimate)."""
        return None

    def budget_exhausted(self) -> bool:
        """True once a cost-call budget (xrl.search.budget.CallBudget, which replaces this on its copy of
        the model) has been spent: a search that would only spin on +inf answers stops."""
        return False

    def per_op_estimate(self) -> CostModel | None:
        """A per-op model for what needs a sum over ops (tensat's ILP extraction): this model when it is
        one; a target's model answers its device's roofline (the kernels' fusions couple neighbours); None
        for a whole-graph timer."""
        return self if self.per_op else None

    def timing_device(self) -> str | None:
        """Where a measuring model times: "cpu", "cuda" or "auto" (this machine's pick), for the analytic
        screen a measured search proposes candidates with; None for an estimate, or a model that cannot say."""
        return None

    def remeasure(self, graph: Graph) -> Measurement:
        """A fresh measurement, never a remembered one. Estimates and cached per-op timings do not
        change between calls, so by default this is `measure`; whole-graph timers run the graph again."""
        return self.measure(graph)

    def delta_cost(self, old: Graph, old_cost: float, new: Graph,
                   removed: Iterable[Node], added: Iterable[Node]) -> float:
        """Cost of `new`, which is `old` with nodes `removed` replaced by `added`.

        Exact and cheap for per-op models; whole-graph models re-measure `new`.
        """
        if not self.per_op:
            return self.cost(new)
        return old_cost - sum(self.op_cost(n, old) for n in removed) + sum(self.op_cost(n, new) for n in added)

    def describe(self) -> str:
        return self.name


class WholeGraphCostModel(CostModel):
    """A backend that times whole graphs: no per-op cost, and `delta_cost` re-measures the new graph.

    Measurements are kept per process by the graph's canonical hash (`self.cache`): searches revisit
    graphs, and a graph's run time does not change between visits.
    """

    per_op = False
    measured = True
    cache: bool = True

    def __init__(self) -> None:
        super().__init__()
        self._measured: dict[str, Measurement] = {}

    @abstractmethod
    def _time(self, graph: Graph) -> Measurement:
        """Time `graph` (uncached)."""

    def _op_cost(self, node: Node, graph: Graph) -> float:
        raise ConfigError(f"the {self.name!r} cost model times whole graphs and has no per-op cost")

    def cost(self, graph: Graph) -> float:
        return self.measure(graph).median_s

    def remeasure(self, graph: Graph) -> Measurement:
        return self._time(graph)

    def measure(self, graph: Graph) -> Measurement:
        if not self.cache:
            return self._time(graph)
        key = graph.canonical_hash
        m = self._measured.get(key)
        if m is None:
            m = self._measured[key] = self._time(graph)
        return m
