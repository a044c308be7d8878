"""`--search rl`: optimise a graph with a trained policy (the shipped one unless told otherwise).

Two modes. `guided` (the default) is the prior-guided search of `xrl.rl.guided`: the argmax
rollout, then a beam over the prior's choices ranked by its value, within a budget of
GUIDED_BUDGET_S seconds (TASO's time in the comparisons) or the time limit if that is shorter, and
stopping earlier where the search stops paying (the value head bounds what is left below the best
found, or the search has spent twice the time it took to find its best; option `stop=false` runs to
the budget). Option `prior` picks what guides it (xrl.rl.priors): `trained` (the checkpoint, the
default), `untrained` (the checkpoint's network shape initialised from `seed`), `uniform` or `cost`:
the ablations of issue 24, runnable on a user's own graphs.
With the stop rule (the default) the search is anchored on greedy search (option `anchor`, default: on
with `stop`): greedy runs first, to completion unless a time limit or budget cuts it, and its result is the
guided search's incumbent (which runs on a memoising engine, `xrl.rl.guided.MemoEngine`). The earned time then
counts from greedy's end, so where nothing beyond greedy is found the whole search takes about
ANCHOR_EARN (1.5) times greedy's time (xrl.rl.guided); the result is never below greedy's; rule-first
descents look for what greedy's first rule closed off; then the argmax rollout and the beam. Without a
budget or time limit the guided part has
GUIDED_BUDGET_S seconds after greedy; a `budget` or `time_limit` bounds the whole run, greedy, torch's import and
the policy's load included (a limit that leaves less than the load is expected to take returns greedy's result
without loading the policy: details policy_loaded=false).
`argmax` plays the policy greedily from the input graph until it chooses to stop, for at most
`steps` rewrites. The default cap is the graph's op count (at least 50, X-RLflow's training horizon):
a policy trained on 50-step episodes still knows when to stop, and large CNNs need a few hundred
rewrites (Inception-v3: 220 by greedy search; with a 50-step cap the shipped policy reached 1.14x of
the 1.90x it reaches uncapped); `samples=k` adds k sampled rollouts, and the cheapest graph any rollout
passed through is returned. Each step offers the policy the candidate set it was trained on: at
most the training run's `env.max_candidates` rewrites (the cheapest by estimate), unless
`max_candidates` says otherwise (0: all of them). Unlike the other searches this one reads a checkpoint, so it
lives in `xrl.rl` (above the search package, whose greedy search and result type it uses).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from xrl.cost.base import CostModel
from xrl.errors import ConfigError
from xrl.ir import Graph
from xrl.search.result import SearchResult

MODES = ("guided", "argmax")
PRIORS = ("trained", "untrained", "uniform", "cost")  # xrl.rl.priors.PRIORS, without importing torch
GUIDED_BUDGET_S = 60.0
# What loading the policy is expected to take (issue 32.4: a time limit includes it): torch and torch_geometric's
# import when they are not loaded yet (2.8 s on the loaded 2-core machine), else the policy file's (0.07 s). A run
# whose limit leaves less after greedy returns greedy's result without loading the policy (PolicyRun.policy_loaded).
COLD_LOAD_S, WARM_LOAD_S = 2.5, 0.1


def rl_search(graph: Graph, cost_model: CostModel, *, policy: str | Path | None = None, steps: int | None = None,
              samples: int = 0, seed: int = 0, time_limit: float | None = None, max_candidates: int | None = None,
              engine: Any = None, mode: str = "guided", width: int | None = None, expand: int | None = None,
              budget: float | None = None, prior: str = "trained", stop: bool = True,
              trace: list[tuple[float, float]] | None = None, anchor: bool | None = None,
              value_weight: float | None = None, value_stop: float | None = None, action: str = "flat",
              top_rules: int | None = None):
    """Run a policy checkpoint (None: the shipped default) on `graph`; returns `xrl.rl.policy_run.PolicyRun`.
    The time limit counts from the call: greedy's run, torch's import and the policy's load come out of it.
    `value_weight` / `value_stop`: the guided search's use of the value head (None: its defaults); `action`: flat
    or factored (xrl.rl.factored: only the `top_rules` best-scored rules' rewrites built at a state)."""
    if steps is not None and steps < 1:
        raise ConfigError(f"--steps must be at least 1 for --search rl, not {steps}")
    if samples < 0:
        raise ConfigError(f"samples must be 0 or more, not {samples}")
    if mode not in MODES:
        raise ConfigError(f"unknown rl search mode {mode!r}; choose one of: {', '.join(MODES)}")
    for name, value in (("width", width), ("expand", expand), ("budget", budget)):
        if value is not None and not value > 0:
            raise ConfigError(f"{name} must be positive, not {value}")
    if prior not in PRIORS:
        raise ConfigError(f"unknown prior {prior!r} for --search rl; choose one of: {', '.join(PRIORS)}")
    if value_weight is not None and not value_weight >= 0:
        raise ConfigError(f"value_weight must be >= 0, not {value_weight}")
    if value_stop is not None and not value_stop >= 0:
        raise ConfigError(f"value_stop must be >= 0 (percent of the input's cost), not {value_stop}")
    if action not in ("flat", "factored"):
        raise ConfigError(f"unknown action {action!r} for --search rl; choose flat or factored")
    if top_rules is not None and top_rules < 1:
        raise ConfigError(f"top_rules must be at least 1, not {top_rules}")
    if action != "flat" and mode != "guided":
        raise ConfigError("action factored applies to the guided mode of --search rl")
    if prior != "trained" and mode != "guided":
        raise ConfigError(f"prior {prior!r} guides the search of mode guided; mode argmax plays the trained policy")
    from xrl.rl.policy_files import existing_policy_path  # no torch: a wrong --policy is refused before any work

    path = existing_policy_path(policy)
    t0, incumbent = time.perf_counter(), None
    given = [t for t in (time_limit, budget) if t is not None]
    anchored = mode == "guided" and (stop if anchor is None else anchor)
    if anchored:
        # greedy first, before torch and the policy load: its time is the run's, and `time_limit` (which the
        # pipeline's enumeration deadline also counts from the run's start) must not be spent on imports first
        from xrl.search.greedy import greedy_search

        if engine is None:
            from xrl.rewrite import RewriteEngine

            engine = RewriteEngine.default()
        # on the plain engine: greedy inside rl measured 20-30% slower than alone on ort-cpu bert when it ran
        # on the memo, which keeps every candidate it costed alive (each with its skeleton graph)
        first = greedy_search(graph, cost_model, getattr(engine, "engine", engine),
                              time_limit=min(given) if given else None)
        incumbent = (first.graph, first.cost, list(first.steps))
    if given and time.perf_counter() + expected_load_s() > t0 + min(given):
        return unloaded(graph, first.original_cost if anchored else cost_model.cost(graph), incumbent, t0)
    from xrl.env.graph_rewrite import default_horizon  # torch and torch_geometric: after greedy (see above)
    from xrl.rl.checkpoint import load_policy
    from xrl.rl.evaluate import one_torch_thread, optimize_with_policy

    net, ckpt = load_policy(path)
    horizon, cap = steps or default_horizon(graph), candidate_cap(ckpt, max_candidates)
    with one_torch_thread():
        if mode == "guided":
            from xrl.rl import guided
            from xrl.rl.priors import make_prior

            engine = guided.memo_engine(engine)
            if anchored:  # no limit given: the guided part's own budget starts after greedy
                limit = min(given) if given else time.perf_counter() - t0 + GUIDED_BUDGET_S
            else:  # t0 stays the run's start: the time limit includes torch's import and the policy's load
                limit = min(t for t in (time_limit, budget or GUIDED_BUDGET_S) if t is not None)
            values = {k: v for k, v in (("value_weight", value_weight), ("value_stop", value_stop)) if v is not None}
            return guided.guided_search(make_prior(prior, policy=net, seed=seed), graph, cost_model, engine=engine,
                                        horizon=horizon, max_candidates=cap, width=int(width or guided.WIDTH),
                                        expand=int(expand or guided.EXPAND), time_limit=limit, stop=stop,
                                        trace=trace, incumbent=incumbent, t0=t0, action=action, top_rules=top_rules,
                                        **values)
        left = None if time_limit is None else max(0.0, time_limit - (time.perf_counter() - t0))  # the load's out
        return optimize_with_policy(net, graph, cost_model, engine=engine, horizon=horizon, samples=samples,
                                    seed=seed, max_candidates=cap, time_limit=left)


def expected_load_s() -> float:
    """What loading a policy will take in this process: COLD_LOAD_S until torch_geometric is imported."""
    return WARM_LOAD_S if "torch_geometric" in sys.modules else COLD_LOAD_S


def unloaded(graph: Graph, c0: float, incumbent: tuple[Graph, float, list[str]] | None, t0: float):
    """The run when its time limit leaves no time to load the policy: greedy's result (the input without one);
    `c0`: the input's cost."""
    from xrl.rl.policy_run import PolicyRun

    best, cost, steps = incumbent if incumbent is not None else (graph, c0, [])
    return PolicyRun(best, cost, c0, list(steps), 0, 0, time.perf_counter() - t0, False, policy_loaded=False)


def candidate_cap(ckpt: dict[str, Any], requested: int | None) -> int | None:
    """The cap on candidates per step: `requested` (0: none), else the one the policy was trained with."""
    if requested is not None:
        if requested < 0:
            raise ConfigError(f"max_candidates must be 0 (no cap) or more, not {requested}")
        return requested or None
    return (ckpt.get("config", {}).get("env") or {}).get("max_candidates")


def run_rl(graph: Graph, cost: CostModel, *, seed: int, steps: int | None, time_limit: float | None,
           **options: Any) -> SearchResult:
    """The runner of `--search rl` (registered by xrl.policies.search_entry): options `policy` (a checkpoint path),
    `mode` (guided | argmax), `prior`,
    `width`, `expand`, `budget`, `stop`, `anchor`, `value_weight` and `value_stop` (guided), `samples` (argmax: extra
    sampled rollouts), `max_candidates`, `action` (flat | factored) and `top_rules` (guided)."""
    known = ("policy", "mode", "prior", "width", "expand", "budget", "stop", "anchor", "value_weight", "value_stop",
             "samples", "max_candidates", "action", "top_rules")
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"--search rl has no option {', '.join(map(repr, unknown))}; its options: {', '.join(known)}")
    mode = str(options.get("mode") or ("argmax" if options.get("samples") else "guided"))
    if options.get("samples") and mode != "argmax":
        raise ConfigError("samples (extra sampled rollouts) apply to the argmax mode of --search rl")
    trace: list[tuple[float, float]] = []
    run = rl_search(graph, cost, policy=options.get("policy"), steps=steps, samples=int(options.get("samples") or 0),
                    seed=seed, time_limit=time_limit, max_candidates=options.get("max_candidates"), mode=mode,
                    width=options.get("width"), expand=options.get("expand"), budget=options.get("budget"),
                    prior=str(options.get("prior") or "trained"), stop=as_flag(options.get("stop", True), "stop"),
                    trace=trace, anchor=None if options.get("anchor") is None else as_flag(options["anchor"], "anchor"),
                    value_weight=as_number(options.get("value_weight"), "value_weight"),
                    value_stop=as_number(options.get("value_stop"), "value_stop"),
                    action=str(options.get("action") or "flat"),
                    top_rules=None if options.get("top_rules") is None else int(as_number(options["top_rules"],
                                                                                          "top_rules")))
    return SearchResult(graph=run.graph, cost=run.cost, original_cost=run.original_cost, steps=list(run.steps),
                        explored=run.env_steps, time_s=run.time_s, method="rl", details={
                            "policy": str(options.get("policy") or "default"), "mode": mode,
                            "prior": str(options.get("prior") or "trained"), "rollouts": run.rollouts,
                            "env_steps": run.env_steps, "uphill_paid_off": run.uphill_paid_off,
                            # trace, guided: (seconds, best cost) at every new best
                            "policy_loaded": run.policy_loaded, "trace": trace})


def as_number(value: Any, name: str) -> float | None:
    """A numeric search option, given as a number or as text (None: not given)."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"option {name} must be a number, not {value!r}") from None


def as_flag(value: Any, name: str) -> bool:
    """A boolean search option, given as a bool or as text (a CLI's or a config's)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"option {name} must be true or false, not {value!r}")
