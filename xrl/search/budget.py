"""A search budget counted in cost-model calls (issue 32.4), beside the seconds every search already takes.

`CallBudget(model, max_calls).model` is a copy of `model` whose `cost` and `delta_cost` pass at most
`max_calls` calls on to the real model; past that they answer +inf without asking it (a graph the search
may not price is never better), so greedy, beam, TASO and the guided search all stop improving there
and keep the best graph they priced. Re-cost the result with the real model afterwards. `calls` counts
the calls that reached the model, `refused` those answered +inf.
"""

from __future__ import annotations

import copy
import math
from typing import Any


class CallBudget:
    def __init__(self, inner: Any, max_calls: int | None) -> None:
        if max_calls is not None and max_calls < 0:
            raise ValueError(f"a cost-call budget must be >= 0, not {max_calls}")
        self.max_calls, self.calls, self.refused = max_calls, 0, 0
        self.model = copy.copy(inner)  # a copy, so isinstance checks and every other attribute stay the model's
        cost, delta = inner.cost, inner.delta_cost

        def budgeted(fn: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> float:
                if self.exhausted:
                    self.refused += 1
                    return math.inf
                self.calls += 1
                return fn(*args, **kwargs)
            return call

        self.model.cost, self.model.delta_cost = budgeted(cost), budgeted(delta)
        if inner.local_costing:  # greedy's local re-costing is a cost call too
            self.model.local_cost = budgeted(inner.local_cost)
        # a search that would only spin on +inf answers asks this and stops (xrl.rl.guided's clock)
        self.model.budget_exhausted = lambda: self.exhausted

    @property
    def exhausted(self) -> bool:
        return self.max_calls is not None and self.calls >= self.max_calls


__all__ = ["CallBudget"]
