"""The table of rollout collectors, filled through the entry-point group `xrl.collectors`.

`xrl train collector=<name>` (the `kind` of the `collector` section) picks the collector registered
under that name. xrl registers three in its pyproject.toml:

    process   xrl.rl.rollout:ProcessCollector              `workers` spawned processes (0: this process)
    local     xrl.rl.rollout:LocalCollector                this process
    ray       xrl.distributed.ray_collector:RayCollector   Ray actors (pip install 'xrl[ray]')

A plug-in adds one from its own package, with no change to xrl:

    [project.entry-points."xrl.collectors"]
    mine = "my_package.module:MyCollector"     # a subclass of xrl.rl.rollout.RolloutCollector

Its class method `from_config(name, spec, workers, options)` builds it from the section's other settings.
An entry point is loaded only when chosen, so a plug-in's dependencies (Ray) are needed only by its users.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from xrl.errors import ConfigError
from xrl.rl.rollout import CollectorSpec, RolloutCollector

GROUP = "xrl.collectors"
# Where xrl itself is not installed as a distribution (its source on sys.path), its entry points are not
# either: the collectors of xrl proper stay available.
BUILTIN = {name: EntryPoint(name, f"xrl.rl.rollout:{cls}", GROUP)
           for name, cls in (("process", "ProcessCollector"), ("local", "LocalCollector"))}


def available_collectors() -> dict[str, EntryPoint]:
    """Every registered collector by name (an installed distribution's entry point overrides a built-in)."""
    return {**BUILTIN, **{ep.name: ep for ep in entry_points(group=GROUP)}}


def collector_class(name: str) -> type[RolloutCollector]:
    """The class registered as `name`; ConfigError naming the registered ones if there is none."""
    table = available_collectors()
    if name not in table:
        raise ConfigError(f"unknown collector {name!r}; choose one of: {', '.join(sorted(table))}")
    cls = table[name].load()
    if not (isinstance(cls, type) and issubclass(cls, RolloutCollector)):
        raise ConfigError(f"collector {name!r} ({table[name].value}) is not a RolloutCollector subclass")
    return cls


def make_collector(spec: CollectorSpec, workers: int, options: Mapping[str, Any] | None = None) -> RolloutCollector:
    """The collector `options` (the `collector` config section) names; without it, `workers` processes,
    or this process alone for workers <= 0."""
    opts = dict(options or {})
    name = opts.pop("kind", "process")
    return collector_class(name).from_config(name, spec, workers, opts)
