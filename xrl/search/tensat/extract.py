"""Extraction: pick one e-node per needed e-class so that the graph they form is cheapest.

The problem is stated on a plain exported e-graph (`ExtractionProblem`: e-nodes with their e-class,
child e-classes and cost) so that it knows nothing of egglog or of tensors, and is solved two ways:

- `greedy_extract`: egg's bottom-up extractor. Each e-class costs its cheapest e-node plus the
  costs of its children, computed to a fixed point. It costs every e-class as a *tree*, so a value
  shared by two consumers is paid twice in the decision; it cannot see that one merged node
  serving two outputs is cheaper than two separate ones.
- `ilp_extract`: Tensat's integer program, solved with HiGHS. One binary x_n per e-node:

      minimise    sum_n cost_n * x_n
      subject to  sum_{n in r} x_n = 1                 for every root e-class r
                  sum_{m in d} x_m >= x_n              for every e-node n and child e-class d of n
                  t_c - t_d >= eps - (1 + eps)(1 - x_n) for n in e-class c with child e-class d

  The objective counts each chosen e-node once, which is the cost of the DAG. The last family
  (continuous t_c in [0, 1], eps = 1 / (classes + 1)) orders the chosen e-classes topologically,
  so the chosen nodes cannot form a cycle: an e-graph holds cyclic terms (x = Transpose(
  Transpose(x)) after a union) that no dataflow graph can run. Those rows are added lazily, for
  the e-classes on a cycle a solution picked. The greedy answer is the warm start, so a solve
  that hits its time limit is never worse than greedy.

Costs are reported in the problem's own unit (seconds, for xrl); the solver sees them divided by the
largest e-node cost, so that its absolute tolerances are meaningful for microsecond-sized costs.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from xrl.errors import XrlError
from xrl.quiet import native_stdout_silenced


class ExtractionError(XrlError):
    """No acyclic choice of e-nodes computes the roots (cannot happen for an e-graph built from a graph)."""


@dataclass(frozen=True)
class ENode:
    """One e-node: an operator application whose arguments are e-classes."""

    id: str
    eclass: str
    op: str
    children: tuple[str, ...]  # child e-classes, in argument order
    cost: float


@dataclass
class ExtractionProblem:
    """An exported e-graph and the e-classes whose values the extracted graph must compute."""

    nodes: Mapping[str, ENode]
    roots: tuple[str, ...]
    classes: dict[str, tuple[str, ...]] = field(init=False)

    def __post_init__(self) -> None:
        classes: dict[str, list[str]] = {}
        for n in self.nodes.values():
            classes.setdefault(n.eclass, []).append(n.id)
        self.classes = {c: tuple(ids) for c, ids in classes.items()}
        missing = [r for r in self.roots if r not in self.classes]
        if missing:
            raise ExtractionError(f"root e-class {missing[0]!r} has no e-node")


@dataclass(frozen=True)
class Extraction:
    """A choice of one e-node for every e-class the roots need."""

    choice: dict[str, str]  # e-class -> chosen e-node id
    cost: float  # each chosen e-node counted once: the cost of the graph it describes
    method: str  # "greedy" | "ilp"
    status: str  # "optimal", "time limit", HiGHS's status, or why greedy stood in
    time_s: float


# ----- helpers shared by both extractors ---------------------------------------------------------
def chosen_nodes(problem: ExtractionProblem, choice: Mapping[str, str]) -> list[ENode]:
    """The e-nodes the roots reach through `choice`, children before parents (each once).

    Raises ExtractionError if the choice has a cycle or leaves a needed e-class unchosen.
    """
    order: list[ENode] = []
    state: dict[str, int] = {}  # e-class -> 1 while on the stack, 2 when done
    for root in problem.roots:
        if state.get(root) == 2:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        state[root] = 1
        while stack:
            cls, i = stack[-1]
            node_id = choice.get(cls)
            if node_id is None:
                raise ExtractionError(f"e-class {cls!r} is needed but no e-node was chosen for it")
            node = problem.nodes[node_id]
            if i < len(node.children):
                stack[-1] = (cls, i + 1)
                child = node.children[i]
                s = state.get(child)
                if s == 1:
                    raise ExtractionError(f"the chosen e-nodes form a cycle through e-class {child!r}")
                if s is None:
                    state[child] = 1
                    stack.append((child, 0))
                continue
            stack.pop()
            state[cls] = 2
            order.append(node)
    return order


def dag_cost(problem: ExtractionProblem, choice: Mapping[str, str]) -> float:
    return math.fsum(n.cost for n in chosen_nodes(problem, choice))


def _usable_nodes(problem: ExtractionProblem) -> list[ENode]:
    """E-nodes that could ever be chosen: a node that is its own argument never can."""
    return [n for n in problem.nodes.values() if n.eclass not in n.children]


# ----- greedy --------------------------------------------------------------------------------------
def greedy_extract(problem: ExtractionProblem) -> Extraction:
    """Bottom-up tree-cost extraction (egg's `Extractor`), iterated to a fixed point.

    A class's recorded cost changes only on a strict improvement, and every cost is non-negative,
    so the choice is acyclic: a node is chosen only when its children already had (no larger)
    costs that did not depend on it.
    """
    t0 = time.perf_counter()
    nodes = _usable_nodes(problem)
    parents: dict[str, list[ENode]] = {}
    for n in nodes:
        for c in set(n.children):
            parents.setdefault(c, []).append(n)
    best: dict[str, float] = {}
    choice: dict[str, str] = {}
    # Worklist in deterministic order: leaves first, then parents of any class whose cost improved.
    pending = [n for n in nodes if not n.children]
    queued = {n.id for n in pending}
    while pending:
        next_round: list[ENode] = []
        for n in pending:
            queued.discard(n.id)
            if any(c not in best for c in n.children):
                continue
            cost = n.cost + math.fsum(best[c] for c in n.children)
            if cost < best.get(n.eclass, math.inf):
                best[n.eclass] = cost
                choice[n.eclass] = n.id
                for p in parents.get(n.eclass, ()):
                    if p.id not in queued:
                        queued.add(p.id)
                        next_round.append(p)
        pending = next_round
    unreached = [r for r in problem.roots if r not in best]
    if unreached:
        raise ExtractionError(f"root e-class {unreached[0]!r} has no finite term")
    needed = {n.eclass: n.id for n in chosen_nodes(problem, choice)}
    return Extraction(needed, dag_cost(problem, needed), "greedy", "fixed point", time.perf_counter() - t0)


# ----- ILP ---------------------------------------------------------------------------------------
def ilp_extract(problem: ExtractionProblem, *, time_limit: float = 60.0, warm_start: Extraction | None = None,
                mip_rel_gap: float = 1e-6, threads: int | None = None) -> Extraction:
    """Tensat's ILP extraction with HiGHS (formulation in the module docstring).

    The order constraints are added lazily: solve without them, and while the solution's chosen
    nodes form a cycle, add them for the e-classes on it and solve again. Most e-classes are on no
    cycle, so the solver sees a fraction of the big-M rows that make the full model slow (the full
    model takes ~25 s on squeezenet's e-graph; the lazy one well under a second), and the answer
    is the same: optimal over acyclic choices. `warm_start` (default: the greedy extraction)
    seeds every solve, and is returned unchanged if HiGHS finds nothing better within
    `time_limit` seconds in all.
    """
    import highspy

    t0 = time.perf_counter()
    deadline = t0 + max(time_limit, 0.01)
    greedy = warm_start if warm_start is not None else greedy_extract(problem)
    nodes = _usable_nodes(problem)
    classes = sorted({n.eclass for n in nodes} | {c for n in nodes for c in n.children})
    members: dict[str, list[int]] = {c: [] for c in classes}
    for i, n in enumerate(nodes):
        members[n.eclass].append(i)
    cls_index = {c: len(nodes) + k for k, c in enumerate(classes)}  # t_c columns follow the x_n columns
    n_x, n_cols = len(nodes), len(nodes) + len(classes)
    eps = 1.0 / (len(classes) + 1)
    scale = max((n.cost for n in nodes), default=1.0) or 1.0

    log = bool(os.environ.get("XRL_HIGHS_LOG"))
    with native_stdout_silenced(keep=log):  # the constructor prints HiGHS's banner on fd 1
        h = highspy.Highs()
    h.setOptionValue("output_flag", log)
    h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    h.setOptionValue("random_seed", 0)
    if threads is not None:
        h.setOptionValue("threads", int(threads))
    costs = np.zeros(n_cols)
    costs[:n_x] = [n.cost / scale for n in nodes]
    h.addCols(n_cols, costs, np.zeros(n_cols), np.ones(n_cols), 0, np.zeros(0, np.int32), np.zeros(0, np.int32),
              np.zeros(0))
    h.changeColsIntegrality(n_x, np.arange(n_x, dtype=np.int32), np.full(n_x, highspy.HighsVarType.kInteger.value,
                                                                        dtype=np.uint8))
    rows = _RowBuilder()
    for r in dict.fromkeys(problem.roots):
        rows.add(members[r], [1.0] * len(members[r]), 1.0, 1.0)
    for i, n in enumerate(nodes):
        for d in dict.fromkeys(n.children):
            rows.add(members[d] + [i], [1.0] * len(members[d]) + [-1.0], 0.0, highspy.kHighsInf)  # children covered
    rows.flush(h)
    ordered: set[str] = set()
    warm = _warm_start_vector(problem, greedy, nodes, classes, eps)
    rounds = 0
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return Extraction(greedy.choice, greedy.cost, "ilp", "greedy (time limit)", time.perf_counter() - t0)
        h.setOptionValue("time_limit", float(left))
        h.setSolution(warm)
        h.run()
        rounds += 1
        status = h.modelStatusToString(h.getModelStatus())
        if h.getInfo().primal_solution_status != highspy.kSolutionStatusFeasible:
            return Extraction(greedy.choice, greedy.cost, "ilp", f"greedy (HiGHS: {status})", time.perf_counter() - t0)
        x = np.asarray(h.getSolution().col_value[:n_x])
        picked: dict[str, str] = {}
        # Several e-nodes of one class may be 1 where it costs nothing (zero-cost views): any will do.
        for i in np.flatnonzero(x > 0.5):
            picked.setdefault(nodes[i].eclass, nodes[i].id)
        cycle = find_cycle(problem, picked)
        if not cycle:
            break
        for i, n in enumerate(nodes):  # t_c - t_d - (1 + eps) x_n >= eps - (1 + eps) = -1
            if n.eclass in cycle and n.eclass not in ordered:
                for d in dict.fromkeys(n.children):
                    rows.add([cls_index[n.eclass], cls_index[d], i], [1.0, -1.0, -(1.0 + eps)], -1.0,
                             highspy.kHighsInf)
        ordered |= set(cycle)
        rows.flush(h)
    needed = {n.eclass: n.id for n in chosen_nodes(problem, picked)}
    cost = dag_cost(problem, needed)
    if cost > greedy.cost:  # only if HiGHS stopped early on a worse incumbent than the warm start
        return Extraction(greedy.choice, greedy.cost, "ilp", f"greedy ({status})", time.perf_counter() - t0)
    where = f", {rounds} solves" if rounds > 1 else ""
    return Extraction(needed, cost, "ilp", f"{status.lower()}{where}", time.perf_counter() - t0)


def find_cycle(problem: ExtractionProblem, choice: Mapping[str, str]) -> list[str]:
    """E-classes on a cycle of the choice reachable from the roots ([] if there is none)."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    for root in problem.roots:
        if root in state:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path = [root]
        state[root] = 1
        while stack:
            cls, i = stack[-1]
            node = problem.nodes[choice[cls]]
            if i < len(node.children):
                stack[-1] = (cls, i + 1)
                child = node.children[i]
                if state.get(child) == 1:
                    return path[path.index(child):]
                if child not in state:
                    state[child] = 1
                    stack.append((child, 0))
                    path.append(child)
                continue
            stack.pop()
            path.pop()
            state[cls] = 2
    return []


def _warm_start_vector(problem: ExtractionProblem, start: Extraction, nodes: list[ENode], classes: list[str],
                       eps: float):
    """The warm start as a full HiGHS solution: x from the choice, t from each class's height."""
    import highspy

    index = {n.id: i for i, n in enumerate(nodes)}
    height: dict[str, int] = {}
    for n in chosen_nodes(problem, start.choice):  # children first
        height[n.eclass] = 1 + max((height[c] for c in n.children), default=0)
    values = np.zeros(len(nodes) + len(classes))
    for node_id in start.choice.values():
        values[index[node_id]] = 1.0
    for k, c in enumerate(classes):
        values[len(nodes) + k] = min(1.0, height.get(c, 0) * eps)
    sol = highspy.HighsSolution()
    sol.col_value = list(values)
    sol.value_valid = True
    return sol


class _RowBuilder:
    """Rows accumulated in CSR form and handed to HiGHS in one call."""

    def __init__(self) -> None:
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.starts: list[int] = []
        self.index: list[int] = []
        self.value: list[float] = []

    def add(self, cols: Iterable[int], vals: Iterable[float], lo: float, hi: float) -> None:
        self.starts.append(len(self.index))
        self.index.extend(cols)
        self.value.extend(vals)
        self.lower.append(lo)
        self.upper.append(hi)

    def flush(self, h) -> None:
        """Hand the rows added since the last flush to HiGHS."""
        if self.lower:
            h.addRows(len(self.lower), np.asarray(self.lower), np.asarray(self.upper), len(self.index),
                      np.asarray(self.starts, dtype=np.int32), np.asarray(self.index, dtype=np.int32),
                      np.asarray(self.value))
        self.__init__()
