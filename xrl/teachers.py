"""The runner of imitation's teacher searches (`xrl.rl.imitation`): any registered search, run by name.

The search registry (`xrl.search.registry`) sits a layer above rl, so rl never imports it, and the registry loads
nothing of rl (this module sits below both): the registry registers its `run_search` here when it is loaded
(and `xrl train` loads it), or a caller passes a runner to `teacher_runs(..., run=...)`. This module imports nothing, so registering costs the registry nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xrl.errors import ConfigError

_RUN: Callable[..., Any] | None = None


def register_teacher_runner(run: Callable[..., Any]) -> None:
    """`run(name, graph, cost, *, seed, steps, time_limit, options)` -> a search result (the registry's)."""
    global _RUN
    _RUN = run


def teacher_runner() -> Callable[..., Any]:
    if _RUN is None:
        raise ConfigError("imitation teachers need the search registry: import xrl.search.registry first, or "
                          "pass run= to teacher_runs")
    return _RUN
