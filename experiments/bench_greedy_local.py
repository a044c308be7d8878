"""Greedy under the measured kernel cost, with and without local re-costing (issue 35, item 2), interleaved.

    .venv/bin/python experiments/bench_greedy_local.py GRAPH [STEPS]

Runs `greedy_search` for STEPS steps (default 3) on a built-in graph four times, alternating whole-graph costing
of every candidate (`xrl.search.greedy.LOCAL_COSTING = False`) and local costing, each with a fresh
`MeasuredKernelCostModel` whose kernels are timed first (the kernel cache, warm after the first run, is the
user's): what is compared is the search's own time. Prints steps, candidates costed, seconds and the final cost
(the same in all four).
"""

from __future__ import annotations

import sys
import time

from xrl.cost.kernel_measured import MeasuredKernelCostModel
from xrl.frontends.loader import load_model
from xrl.search import greedy


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    model = load_model(argv[0])
    graph = model.graph if hasattr(model, "graph") else model
    steps = int(argv[1]) if len(argv) > 1 else 3
    for local in (False, True, False, True):
        greedy.LOCAL_COSTING = local
        cost_model = MeasuredKernelCostModel()
        cost_model.cost(graph)  # its kernels timed (or read from the cache) before the clock starts
        t0 = time.perf_counter()
        result = greedy.greedy_search(graph, cost_model, max_steps=steps)
        print(f"local={local} steps={len(result.steps)} candidates={result.explored} "
              f"{time.perf_counter() - t0:.1f} s cost={result.cost:.6g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
