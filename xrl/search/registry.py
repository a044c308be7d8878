"""The one table of searches: each name `xrl optimize --search`, `xrl compare` and the API accept, its runner
and what the pipeline needs to know about it.

A runner has the signature

    runner(graph, cost_model, *, seed, steps, time_limit, **options) -> SearchResult

and `register_search(name, runner, ...)` adds (or replaces) one; the name is then accepted everywhere a
search is named and listed in `--help` and in errors. The built-in searches are registered below by
module and function name, imported on first use, so `xrl optimize --search greedy` never loads torch
or egglog.

Two sources outside this module are read on the first lookup (`search_names`, `get_search`, `run_search`),
both declared as entry points in a distribution's metadata, so this package imports nothing above it:

* search providers: the group `xrl.search_providers` (`name = "module:function"`), each a function that
  registers its searches (`register_search(..., replace=False)`), called once in the order the group lists
  them. xrl's own RL searches come in this way (xrl's pyproject.toml: `xrl.policies.search_entry:
  register_searches`): they run a trained policy, a checkpoint through `xrl.rl` or an exported .onnx one
  through `xrl.policies.release`, so their code sits above this package.
* single searches: the group `xrl.searches` (`name = "module:attr"`), whose object is a runner or a
  `SearchEntry`. Their names are listed from the metadata alone; the module is imported when the search
  first runs. A name registered in code (or by a provider) wins over a plug-in of the same name.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from xrl.cost.base import CostModel
from xrl.errors import ConfigError, XrlError
from xrl.ir import Graph
from xrl.search.result import SearchResult

ENTRY_POINT_GROUP = "xrl.searches"
PROVIDER_GROUP = "xrl.search_providers"  # functions registering several searches (xrl's RL ones among them)

Runner = Callable[..., SearchResult]


class SearchUnavailableError(XrlError):
    """A registered search whose code cannot be imported here (a plug-in or optional dependency missing)."""


@dataclass(frozen=True)
class SearchEntry:
    """One search in the table.

    `roofline_alternative`: under measured kernel costs, the guard also times this search's result under
    the same kernels' roofline (cheap searches only: it runs the search twice).
    `default_time_limit`: the pipeline gives the search DEFAULT_TIME_LIMIT_S when no limit is set; False
    for searches whose own limits bound them (tensat's saturation and ILP).
    `requires`: modules that must be importable for the search to run (compare reports it unavailable
    otherwise, rather than failed).
    """

    name: str
    runner: Runner
    description: str = ""
    roofline_alternative: bool = False
    default_time_limit: bool = True
    requires: tuple[str, ...] = ()

    def unavailable(self) -> str | None:
        """None if the search can run here, else why not."""
        import importlib.util

        for module in self.requires:
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:  # a parent package is missing
                found = False
            if not found:
                return f"{module} is not installed"
        return None


def lazy_runner(module: str, function: str) -> Runner:
    """A runner imported on first use: `module.function`."""

    def runner(*args: Any, **kwargs: Any) -> SearchResult:
        return getattr(importlib.import_module(module), function)(*args, **kwargs)

    runner.__qualname__ = runner.__name__ = f"{module}:{function}"
    return runner


def _no_search(graph: Graph, cost: CostModel, *, seed: int, steps: int | None, time_limit: float | None,
               **options: Any) -> SearchResult:
    return SearchResult(graph=graph, method="none")


def _greedy(graph: Graph, cost: CostModel, *, seed: int, steps: int | None, time_limit: float | None,
            **options: Any) -> SearchResult:
    """Greedy search; under a measured whole-graph cost its candidates are screened by an estimate."""
    from xrl.search.greedy import greedy_search

    screen_top = int(options.get("screen_top", 8))
    screen = measured_screen(cost) if cost.measured and screen_top > 0 else None
    # engine None: the search module's default, the built-in verified rules
    res = greedy_search(graph, cost, None, max_steps=steps, time_limit=time_limit, screen=screen,
                        screen_top=max(screen_top, 1))
    res.details = {"explored": res.explored, **res.details}
    return res


def measured_screen(cost: CostModel) -> CostModel:
    """The analytic model of the device a whole-graph model times on: what proposes the candidates a
    measured greedy search times (its `cpu` profile, or this machine's GPU's)."""
    from xrl.cost import get_cost_model

    # the one factory: "auto" is this machine's profile (its GPU's, else cpu)
    return get_cost_model("analytic", device="cpu" if cost.timing_device() == "cpu" else "auto")


def _random(graph: Graph, cost: CostModel, *, seed: int, steps: int | None, time_limit: float | None,
            **options: Any) -> SearchResult:
    from xrl.search.random_search import random_search

    res = random_search(graph, cost, None, steps=steps if steps is not None else 30, seed=seed)
    res.details = {"explored": res.explored}
    return res


_SEARCHES: dict[str, SearchEntry] = {}
_plugins_loaded = False


def register_search(name: str, runner: Runner, *, description: str = "", roofline_alternative: bool = False,
                    default_time_limit: bool = True, requires: tuple[str, ...] = (), replace: bool = True
                    ) -> SearchEntry:
    """Add `runner` under `name` (replacing one of that name unless `replace` is False, in which case the
    existing entry is kept); returns the entry in the table."""
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(f"a search name is letters, digits, '-' and '_', not {name!r}")
    if not callable(runner):
        raise ConfigError(f"search {name!r}: the runner must be callable, not {type(runner).__name__}")
    entry = SearchEntry(name, runner, description, roofline_alternative, default_time_limit, tuple(requires))
    if replace or name not in _SEARCHES:
        _SEARCHES[name] = entry
    return _SEARCHES[name]


def _register_builtins() -> None:
    builtins = (
        ("none", _no_search, "no search: the model after the pre-passes", {"default_time_limit": False}),
        ("greedy", _greedy, "the best single rewrite until none lowers the cost (default)",
         {"roofline_alternative": True}),
        ("random", _random, "uniformly random rewrites (a baseline)", {}),
        ("taso", lazy_runner("xrl.search.taso", "taso_runner"), "TASO's cost-based backtracking search", {}),
        ("tensat", lazy_runner("xrl.search.tensat", "tensat_runner"),
         "Tensat's equality saturation and extraction", {"default_time_limit": False}),
        ("beam", lazy_runner("xrl.search.beam", "beam_runner"), "beam search over rewrites", {}),
        ("exhaustive", lazy_runner("xrl.search.beam", "exhaustive_runner"),
         "every reachable graph, up to a cap (small graphs)", {}),
    )
    for name, runner, description, flags in builtins:
        register_search(name, runner, description=description, **flags)


_register_builtins()


def _load_plugins() -> None:
    """The two entry-point groups, once (see the module docstring)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=PROVIDER_GROUP):
        try:
            register = ep.load()
        except Exception as e:  # noqa: BLE001 - one broken provider must not take every other search with it
            warnings.warn(f"search provider {ep.name} ({ep.value}) is not available: {type(e).__name__}: {e}",
                          stacklevel=2)
            continue
        register()  # registers its searches, without replacing a name registered in code
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _SEARCHES:  # listed now, imported by get_search
            register_search(ep.name, _not_loaded, description=f"plug-in {ep.value}")
            _PLUGINS[ep.name] = ep


def _not_loaded(*args: Any, **kwargs: Any) -> SearchResult:
    raise AssertionError("a plug-in's placeholder runner is replaced by get_search before it runs")


_PLUGINS: dict[str, Any] = {}  # name -> importlib.metadata.EntryPoint not imported yet


def _load_plugin(name: str) -> None:
    """Import plug-in `name` and put its runner (or its SearchEntry, flags and all) in the table."""
    ep = _PLUGINS[name]
    try:
        obj = ep.load()
    except Exception as e:  # noqa: BLE001 - any import failure means the plug-in cannot run here
        raise SearchUnavailableError(f"search {name!r} (plug-in {ep.value}) is not available: "
                                     f"{type(e).__name__}: {e}") from e
    if isinstance(obj, SearchEntry):
        _SEARCHES[name] = replace(obj, name=name)
    elif callable(obj):
        _SEARCHES[name] = replace(_SEARCHES[name], runner=obj)
    else:
        raise SearchUnavailableError(f"search {name!r}: plug-in {ep.value} is neither a runner nor a SearchEntry")
    del _PLUGINS[name]


def search_names() -> tuple[str, ...]:
    """Every registered search, in registration order (built-ins first); plug-ins are not imported."""
    _load_plugins()
    return tuple(_SEARCHES)


def searches() -> Mapping[str, SearchEntry]:
    """The table itself (read it; add to it with register_search); plug-ins not yet run hold placeholders."""
    _load_plugins()
    return _SEARCHES


def get_search(name: str) -> SearchEntry:
    """The entry of `name`, its plug-in imported if it is one: ConfigError listing every registered name when
    there is none, SearchUnavailableError when its plug-in does not import."""
    _load_plugins()
    entry = _SEARCHES.get(name)
    if entry is not None and entry.runner is _not_loaded:
        _load_plugin(name)
        entry = _SEARCHES[name]
    if entry is None:
        raise ConfigError(f"unknown search method {name!r}; choose one of: {', '.join(_SEARCHES)}")
    return entry


def run_search(method: str, graph: Graph, cost: CostModel, *, seed: int, steps: int | None,
               time_limit: float | None, options: Mapping[str, Any]) -> SearchResult:
    """Run the search registered as `method` on `graph`, under the pipeline's time limit and progress display."""
    from xrl.rewrite.match import enumeration_deadline
    from xrl.search.progress import DEFAULT_TIME_LIMIT_S, search_progress

    entry = get_search(method)
    if time_limit is None and entry.default_time_limit:
        time_limit = DEFAULT_TIME_LIMIT_S
    options = dict(options)
    # a budget in cost-model calls (issue 32.4), for every search alike: the search sees a model that answers
    # +inf past N calls (xrl.search.budget), so none needs its own counting
    budget = call_budget(cost, options.pop(MAX_COST_CALLS, None))
    # enumerating one state's candidates stops at the limit too; a terminal shows the progress
    with enumeration_deadline(time_limit), search_progress(method, cost, graph, time_limit):
        res = entry.runner(graph, budget.model if budget else cost, seed=seed, steps=steps, time_limit=time_limit,
                           **options)
    if budget is not None:
        res.details = {**(res.details or {}), "cost_calls": budget.calls, MAX_COST_CALLS: budget.max_calls}
    return res


MAX_COST_CALLS = "max_cost_calls"  # the search option (`--search-option max_cost_calls=N`, `xrl bench --calls N`)


def call_budget(cost: CostModel, max_calls: Any) -> Any:
    """A CallBudget of `max_calls` (an int >= 1, or text of one) on `cost`; None for no budget."""
    if max_calls is None:
        return None
    from xrl.search.budget import CallBudget

    try:
        n = int(max_calls)
    except (TypeError, ValueError):
        raise ConfigError(f"{MAX_COST_CALLS} takes a whole number of cost-model calls, not {max_calls!r}") from None
    if n < 1 or n != float(max_calls):
        raise ConfigError(f"{MAX_COST_CALLS} must be a whole number >= 1, not {max_calls!r}")
    return CallBudget(cost, n)
