"""The runner of imitation's teacher searches (`xrl.rl.imitation`): any registered search, run by name.

The search registry (`xrl.search.registry`) sits a layer above rl, so rl never imports it, and the registry
loads nothing of rl (this module sits below both): the registry registers its `run_search` here when it is
loaded, or a caller passes a runner to `teacher_runs(..., run=...)`. A caller that did neither (a training
run started from Python) gets the registry loaded by module name, as the registry loads its own plug-ins.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

REGISTRY_MODULE = "xrl.search.registry"
_RUN: Callable[..., Any] | None = None


def register_teacher_runner(run: Callable[..., Any]) -> None:
    """`run(name, graph, cost, *, seed, steps, time_limit, options)` -> a search result (the registry's)."""
    global _RUN
    _RUN = run


def teacher_runner() -> Callable[..., Any]:
    if _RUN is None:
        importlib.import_module(REGISTRY_MODULE)  # registers its run_search on import
    assert _RUN is not None, f"{REGISTRY_MODULE} registers no teacher runner"
    return _RUN
