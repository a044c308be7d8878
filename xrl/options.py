"""Every option of `xrl.api.optimize`, checked before any model is loaded: one `ConfigError` line each.

A wrong type, a value out of range, NaN where a number is needed, an unknown key of `cost_options`,
`guard_options`, `measure_options` or `search_options`, a string where a sequence is expected: each is
refused here, in microseconds, with a message that names the option and what it takes, instead of a raw
TypeError minutes into a search (or a silently accepted `time_limit=nan`). The checks are a table
(`OPTIONS`, `GUARD_OPTIONS`, `MEASURE_OPTIONS`, `SEARCH_OPTIONS`): one row per option, so a new option is
one new row. Options the table does not name pass through unchecked (the callee checks them).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from xrl.errors import ConfigError

MEASURE_ENGINES = ("auto", "ort", "torch")  # `optimize(measure=...)`: what times end to end
# An rng seed: numpy's default_rng refuses a negative one, torch's manual_seed one of 2^64 and more
MAX_SEED = (1 << 63) - 1

Check = Callable[[str, Any], None]  # raises ConfigError naming the option


def _type_name(value: Any) -> str:
    return type(value).__name__


def _fail(name: str, takes: str, value: Any) -> NoReturn:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise ConfigError(f"{name} takes {takes}, not {shown} ({_type_name(value)})")


def whole(low: int | None = 0, high: int | None = None, *, none: bool = False) -> Check:
    """A whole number (not a bool) in [low, high]; None too with `none`."""
    takes = ("a whole number" + (f" of at least {low}" if low is not None else "")
             + (f" and at most {high}" if high is not None else "") + (", or None" if none else ""))

    def check(name: str, value: Any) -> None:
        if value is None and none:
            return
        if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low) \
                or (high is not None and value > high):
            _fail(name, takes, value)
    return check


def number(low: float = 0.0, *, strict: bool = True, inf: bool = False, none: bool = False) -> Check:
    """A real number above `low` (or at least it, without `strict`): never NaN; infinity only with `inf`."""
    takes = (f"a number {'above' if strict else 'of at least'} {low:g}" + (" (inf for none)" if inf else "")
             + (", or None" if none else ""))

    def check(name: str, value: Any) -> None:
        if value is None and none:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(name, takes, value)
        v = float(value)
        if math.isnan(v) or (math.isinf(v) and not (inf and v > 0)) or v < low or (strict and v == low):
            _fail(name, takes, value)
    return check


def flag(*, none: bool = False) -> Check:
    def check(name: str, value: Any) -> None:
        if not (isinstance(value, bool) or (value is None and none)):
            _fail(name, "True or False" + (", or None" if none else ""), value)
    return check


def text(choices: Sequence[str] | Callable[[], Sequence[str]] | None = None, *, none: bool = False,
         unknown: str = "") -> Check:
    """A string (one of `choices` where given; a callable is asked only when a value is checked). `unknown`
    names what a value outside the choices is ("unknown cost model")."""
    def check(name: str, value: Any) -> None:
        if value is None and none:
            return
        if not isinstance(value, str):
            _fail(name, "a string" + (", or None" if none else ""), value)
        valid = choices() if callable(choices) else choices
        if valid is not None and value not in valid:
            raise ConfigError(f"{unknown or f'unknown {name}'} {value!r}; choose one of: {', '.join(valid)}")
    return check


def path(*, none: bool = False, suffix: str | None = None) -> Check:
    def check(name: str, value: Any) -> None:
        if value is None and none:
            return
        if not isinstance(value, (str, os.PathLike)) or isinstance(value, bytes):
            _fail(name, "a path (a string or pathlib.Path)" + (", or None" if none else ""), value)
        if suffix and not os.fspath(value).lower().endswith(suffix):
            raise ConfigError(f"{name} {os.fspath(value)!s} must end in {suffix}")
    return check


def mapping(keys: Mapping[str, Check] | None = None, *, what: str = "") -> Check:
    """None or a mapping with string keys; with `keys`, only those, each value checked by its row."""
    def check(name: str, value: Any) -> None:
        if value is None:
            return
        if not isinstance(value, Mapping):
            _fail(name, "a dict of options, or None", value)
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"{name} has a key {k!r} that is not a string")
            if keys is not None and k not in keys:
                valid = ", ".join(keys) or "none"
                raise ConfigError(f"{name} has no option {k!r}{what}; its options: {valid}")
            if keys is not None:
                keys[k](f"{name}[{k!r}]", v)
    return check


def _input_shapes(name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, Mapping):
        _fail(name, "a dict of input name -> shape, or None", value)
    for k, shape in value.items():
        if not isinstance(k, str):
            raise ConfigError(f"{name} has a key {k!r} that is not an input name (a string)")
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or not shape or any(
                isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
            raise ConfigError(f"{name}[{k!r}] takes a sequence of positive whole numbers, e.g. (1, 3, 224, 224), "
                              f"not {shape!r}")


def _search_names() -> Sequence[str]:
    from xrl.search.registry import search_names

    return search_names()


def _cost_names() -> Sequence[str]:
    from xrl.cost import COST_MODELS

    return list(COST_MODELS)


def _target_names() -> Sequence[str]:
    from xrl.cost import TARGETS

    return ["auto", *TARGETS]


# `guard_options`: `xrl.cost.guard.measure_guard`'s keywords
GUARD_OPTIONS: dict[str, Check] = {
    "rounds": whole(1, 1000), "max_rounds": whole(1, 1000), "min_rounds": whole(1, 1000),
    "budget_s": number(0.0, inf=True),
}
# `measure_options`: `xrl.api.measure_model`'s keywords (the end-to-end timer of --measure and the guard)
MEASURE_OPTIONS: dict[str, Check] = {"repeats": whole(1, 100_000), "warmup": whole(0, 100_000),
                                     "threads": whole(1, none=True)}
# `search_options` of the built-in searches (a search not named here checks its own)
SEARCH_OPTIONS: dict[str, dict[str, Check]] = {
    "none": {}, "random": {}, "greedy": {"screen_top": whole(0)},
    "beam": {"width": whole(1), "alpha": number(0.0)}, "exhaustive": {"max_states": whole(1)},
    "taso": {"alpha": number(0.0), "budget": whole(1, none=True)},
}
# The options of the cost models' constructors, by name (others are checked by the type of their default)
COST_OPTION_CHECKS: dict[str, Check] = {
    "threads": whole(1, none=True), "repeats": whole(1, 100_000), "warmup": whole(0, 100_000),
    "seed": whole(0, MAX_SEED), "min_sample_s": number(0.0), "max_kernels_per_batch": whole(1),
    "cache_path": path(none=True), "opset": whole(7, none=True), "cache": flag(), "cuda_graph": flag(),
    "flush_l2": flag(), "dtype": text(), "timer": text(), "engine": text(), "granularity": text(),
    "graph_optimization_level": text(),
}

# optimize's own options: name -> its check
OPTIONS: dict[str, Check] = {
    "output": path(none=True, suffix=".onnx"),
    "search": text(_search_names, unknown="unknown search method"),
    "cost": text(_cost_names, unknown="unknown cost model"),
    "device": text(none=True),
    "target": text(_target_names, none=True, unknown="unknown target"),
    "seed": whole(0, MAX_SEED),
    "steps": whole(0, none=True),
    "time_limit": number(0.0, inf=True, none=True),
    "input_shapes": _input_shapes,
    "force": flag(),
    "verify_trials": whole(1, 1000),
    "search_options": mapping(),
    "cost_options": mapping(),
    "measure": text(MEASURE_ENGINES, none=True, unknown="unknown measurement engine"),
    "measure_options": mapping(MEASURE_OPTIONS),
    "measure_rounds": whole(1, 1000),
    "guard": flag(none=True),
    "guard_options": mapping(GUARD_OPTIONS),
    "threads": whole(1, none=True),
}


def prepass_names(name: str, value: Any) -> tuple[str, ...] | None:
    """`prepass` as names: None (the target's own), a sequence of names, or one string of names joined by
    commas ("onnxslim", "onnxslim,ort-transformers"; "none" or "" for none), each a known pre-pass."""
    from xrl.frontends.prepass import PREPASSES

    if value is None:
        return None
    if isinstance(value, str):
        names = [p.strip() for p in value.split(",")]
    elif isinstance(value, Sequence) and not isinstance(value, bytes):
        names = list(value)
    else:
        _fail(name, "a sequence of pre-pass names, a comma-separated string of them, or None", value)
    bad = [p for p in names if not isinstance(p, str)]
    if bad:
        raise ConfigError(f"{name} takes pre-pass names (strings), not {bad[0]!r} ({_type_name(bad[0])})")
    names = [p for p in names if p and p != "none"]
    unknown = [p for p in names if p not in PREPASSES]
    if unknown:
        raise ConfigError(f"unknown pre-pass {unknown[0]!r}; choose from: {', '.join(PREPASSES)} (or none)")
    return tuple(names)


def _cost_options(options: Mapping[str, Any]) -> None:
    """`cost_options`' keys are the options of the cost model `cost` resolves to (under `target`, `device`),
    each value checked by its row (`COST_OPTION_CHECKS`)."""
    from xrl.cost import cost_model_options, get_target

    given = options.get("cost_options")
    if not given:
        return
    cost, target, device = options.get("cost", "target"), options.get("target"), options.get("device")
    tgt = get_target("paper" if target is None and cost == "analytic" else target, device)
    accepted = cost_model_options(cost, device=device or "auto", target=tgt.name)
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise ConfigError(f"cost_options has no option {unknown[0]!r} for cost model {cost!r}; its options: "
                          f"{', '.join(accepted) or 'none'}")
    for k, v in given.items():
        COST_OPTION_CHECKS.get(k, _unchecked)(f"cost_options[{k!r}]", v)


def _unchecked(name: str, value: Any) -> None:
    """An option of a cost model the table does not name: its constructor checks it."""


def check_optimize_options(options: Mapping[str, Any]) -> tuple[str, ...] | None:
    """Check every option of `xrl.api.optimize` (its keyword arguments, by name) before any model is
    loaded: a ConfigError line for the first that is wrong. Returns `prepass` as a tuple of names (None:
    the target's own), so that a string ("onnxslim", or names joined by commas) means what it says."""
    for name, check in OPTIONS.items():
        if name in options:
            check(name, options[name])
    prepass = prepass_names("prepass", options.get("prepass"))
    search = options.get("search", "greedy")
    known = SEARCH_OPTIONS.get(search)
    if known is not None:
        mapping(known, what=f" for search {search!r}")("search_options", options.get("search_options"))
    guard = options.get("guard_options") or {}
    rounds = guard.get("rounds", options.get("measure_rounds", 6))
    if "max_rounds" in guard and guard["max_rounds"] < rounds:
        raise ConfigError(f"guard_options['max_rounds'] ({guard['max_rounds']}) is below its rounds ({rounds})")
    _cost_options(options)
    return prepass
