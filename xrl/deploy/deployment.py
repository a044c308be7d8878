"""The deployment: what a model is optimised for (target, device, threads), its cost model and its timers.

One value replaces the loose (target, device, threads) triple `optimize` passed down, and the
`device or "auto"` each consumer repeated: `device` here is already what the backends take.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xrl.cost import cost_model_options, get_cost_model, get_target, target_timing
from xrl.cost.base import CostModel
from xrl.cost.targets import Target
from xrl.errors import XrlError
from xrl.options import MEASURE_ENGINES  # the one list the options check reads too

GUARD_ENV = "XRL_GUARD"
# per graph per round (`Deployment.guard_timer`): a sample of at least 20 ms is one call of bert-base (245 ms)
# and ~170 of a 0.12 ms family member, whose single calls measured an A/A spread of 18% over 20 rounds
GUARD_TIMING = {"warmup": 1, "repeats": 3, "min_run_s": 0.02}


def measure_model(engine: str = "auto", device: str | None = None, *, repeats: int = 10, warmup: int = 3,
                  threads: int | None = 1, min_run_s: float = 0.0) -> CostModel:
    """The end-to-end timer `optimize(measure=...)` uses. `device` is "cpu" or "cuda"; anything else
    (a device profile of the analytic model, None) means the device this machine has."""
    if engine not in MEASURE_ENGINES:
        raise XrlError(f"unknown measurement engine {engine!r}; choose one of {', '.join(MEASURE_ENGINES)}")
    where = device if device in ("cpu", "cuda") else "auto"
    # never a cached timing: each call is a fresh measurement (the guard's and --measure's rounds)
    return get_cost_model("e2e", device=where, engine=engine, warmup=warmup, repeats=repeats, threads=threads,
                          cache=False, min_run_s=min_run_s)


@dataclass
class Deployment:
    target: Target
    device: str  # what the backends take: the user's device, or "auto" (this machine) for None
    requested_device: str | None  # as the user gave it (measure_model and target timing read None as this machine)
    threads: int | None  # onnxruntime intra-op threads (None: one per core)
    cost_model: CostModel
    guarded: bool  # the measured guard runs (`guard_on`)
    measure_options: Mapping[str, Any] | None = None

    def guard_timer(self) -> CostModel:
        """The end-to-end timer of the guard: onnxruntime on the target's provider, at the deployment's threads.
        One warm-up run and the median of three: a fresh session's first run measured no slower than its
        later ones (bert-base, one thread, thread CPU time) and runs within a session vary by 1-2% while
        sessions differ by up to 5%, so the rounds (a fresh session each) carry the precision, not the runs
        (2+5 runs cost 40% more guard time for no narrower interval)."""
        return measure_model("ort", self.target.provider, **{**GUARD_TIMING, "threads": self.threads,
                                                             **dict(self.measure_options or {})})

    def provider_timer(self, **timing: Any) -> CostModel:
        """onnxruntime on the target's provider at the deployment's threads (the pre-passes' pre-check)."""
        return measure_model("ort", self.target.provider, threads=self.threads, **timing)

    def measure_timer(self, engine: str) -> CostModel:
        """--measure's timer: `engine` on the user's device, at the deployment's threads."""
        return measure_model(engine, self.requested_device,
                             **{"threads": self.threads, **dict(self.measure_options or {})})

    def cost_of(self, name: str, **options: Any) -> CostModel:
        """Another cost model for the same target and device (the roofline alternative's)."""
        return get_cost_model(name, device=self.device, target=self.target.name, **options)


def guard_on(guard: bool | None, tgt: Target, device: str | None) -> bool:
    """The guard runs for onnxruntime targets whose runtime is on this machine (an estimate for another
    device's profile cannot be measured here); `guard` False, or $XRL_GUARD=0, turns it off."""
    if guard is None:
        guard = os.environ.get(GUARD_ENV, "1") not in ("0", "off", "false", "no")
    if not guard or tgt.runtime != "onnxruntime":
        return False
    if tgt.provider == "cpu":
        return True
    return target_timing(device, tgt.name) == "measured"


def deployment(cost: str, *, device: str | None, target: str | None, threads: int | None,
               cost_options: Mapping[str, Any] | None, guard: bool | None,
               measure_options: Mapping[str, Any] | None = None) -> Deployment:
    """The deployment stage: the target, its cost model (at the deployment's threads where it takes them)
    and whether the guard runs."""
    # the per-op analytic model is the research setting's cost: asked for by name, it means that target
    tgt = get_target("paper" if target is None and cost == "analytic" else target, device)
    # device None from a user means this machine (the factory's None is each backend's own default)
    where = device or "auto"
    options = dict(cost_options or {})
    if "threads" in cost_model_options(cost, device=where, target=tgt.name):
        options.setdefault("threads", threads)
    cost_model = get_cost_model(cost, device=where, target=tgt.name, **options)
    return Deployment(tgt, where, device, threads, cost_model, guard_on(guard, tgt, device), measure_options)
