"""Cost models: one interface (`CostModel`), several backends, picked by name.

    analytic  roofline per op on a named device profile (DEVICE_PROFILES); deterministic, microseconds
    ort       onnxruntime end-to-end wall time of the whole graph on this machine
    op        each distinct operator configuration timed alone through PyTorch (TASO), cached on disk
    e2e       the whole graph timed with onnxruntime or a PyTorch executor (CUDA graphs on a GPU)
    cuda      op or e2e timing through the native harness in cuda/ (needs a GPU)
    target    what a target's runtime runs after its own fusions, kernel by kernel: each kernel timed alone
              on this machine and cached (xrl.cost.kernel_measured) where the target's runtime is here,
              else (and with timing="roofline") their roofline estimate (xrl.cost.targets)
    roofline  the roofline estimate of those kernels, by name

To add a backend: subclass `CostModel` with a keyword-only `__init__(self, *, device=None, ...)`,
import heavy libraries inside its methods (so `import xrl.cost` stays cheap), and add one line to
COST_MODELS.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from xrl.cost.analytic import AnalyticCostModel
from xrl.cost.base import CostModel, Measurement, op_key
from xrl.cost.devices import DEVICE_PROFILES, DeviceProfile, get_device
from xrl.cost.e2e import CudaCostModel, E2ECostModel  # torch loads inside their methods
from xrl.cost.kernel_measured import MeasuredKernelCostModel
from xrl.cost.op_measured import OpMeasuredCostModel
from xrl.cost.ort import OrtCostModel
from xrl.cost.targets import TARGETS, Target, TargetCostModel, default_target, get_target
from xrl.errors import ConfigError

COST_MODELS: dict[str, type[CostModel]] = {
    "analytic": AnalyticCostModel,
    "ort": OrtCostModel,
    "op": OpMeasuredCostModel,
    "e2e": E2ECostModel,
    "cuda": CudaCostModel,
    "target": MeasuredKernelCostModel,
    "roofline": TargetCostModel,
}
# How "target" costs kernels when nobody says: "measured" (the default) or "roofline". The test suite sets
# roofline for the tests that do not test measurement: deterministic and instant on any machine.
TIMING_ENV = "XRL_TARGET_COST"
TIMINGS = ("measured", "roofline")


def target_timing(device: str | None, target: str | None, timing: str | None = None) -> str:
    """How the "target" cost model times kernels: `timing`, else $XRL_TARGET_COST, else measured where
    the target's runtime runs on this machine (onnxruntime's CPU provider; its CUDA provider where
    onnxruntime-gpu and a GPU are here and no other device's profile is named), else roofline."""
    timing = timing or os.environ.get(TIMING_ENV) or None
    if timing is not None and timing not in TIMINGS:
        raise ConfigError(f"unknown kernel timing {timing!r} (from {TIMING_ENV} or timing=); "
                          f"choose one of: {', '.join(TIMINGS)}")
    if timing is not None:
        return timing
    tgt = get_target(target, device)
    if tgt.provider == "cpu":
        return "measured"
    from xrl.cost.devices import gpu_model_names, this_machine_profile

    foreign = device not in (None, "auto", "cuda") and gpu_model_names() and device != this_machine_profile()
    import onnxruntime as ort

    here = bool(gpu_model_names()) and "CUDAExecutionProvider" in ort.get_available_providers()
    return "measured" if here and not foreign else "roofline"


def get_cost_model(name: str = "analytic", *, device: str | DeviceProfile | None = None, target: str | None = None,
                   **options: Any) -> CostModel:
    """The one cost-model factory: a cost model by name, for `device` and (for "target" and "roofline") `target`.

    device None means the backend's default: the analytic model's "h100" profile (what training and the
    environments use), this machine for the measured backends. "auto" means this machine everywhere: for the
    analytic model its NVIDIA GPU's profile, else cpu; "cuda" its GPU's (ConfigError without one).
    "target" is the cost of the kernels `target` (None: this machine's default) runs, each measured on this
    machine where its runtime is here (`xrl.cost.kernel_measured`, unless `timing="roofline"` or
    $XRL_TARGET_COST says otherwise), and "roofline" their roofline estimate; under a target whose every op
    is a kernel (the research target `paper`) both are the analytic model on the target's profile. Other
    backends ignore `target`.

    Raises ConfigError for an unknown name or an option the backend does not take.
    """
    name, cls, device, options = _backend(name, device, target, options)
    accepted = _keyword_options(cls)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        valid = ", ".join(p for p in accepted if p != "device") or "none"
        raise ConfigError(f"cost model {name!r} has no option {', '.join(map(repr, unknown))}; its options: {valid}")
    return cls(device=device, **options)


def cost_model_options(name: str, *, device: str | None = None, target: str | None = None) -> list[str]:
    """The options `get_cost_model(name, device=device, target=target, ...)` accepts (for "target", those of
    the backend it resolves to: `threads` where kernels are measured, none where they are estimated)."""
    _, cls, _, _ = _backend(name, device, target, {})
    return [p for p in _keyword_options(cls) if p not in ("device", "target")]


def _backend(name: str, device: str | DeviceProfile | None, target: str | None, options: dict[str, Any]
             ) -> tuple[str, type[CostModel], str | DeviceProfile | None, dict[str, Any]]:
    """What `get_cost_model` builds: the backend's name, its class, its device and its options (`target` filled
    in, `timing` taken); "target" and "roofline" under a target whose every op is a kernel are "analytic"."""
    options = dict(options)
    if name in ("target", "roofline"):
        tgt = get_target(target, device if isinstance(device, str) else None)
        if tgt.runtime == "kernels":
            options.pop("timing", None)
            return _backend("analytic", tgt.device_profile if device in (None, "auto") else device, None, options)
        options["target"] = tgt.name
    cls = _cost_class(name, device, options.get("target"), options.pop("timing", None))
    if name == "analytic" and device in ("auto", "cuda"):
        device = _this_machine_profile(device)
    return name, cls, device, options


def _cost_class(name: str, device: str | DeviceProfile | None, target: str | None, timing: str | None
                ) -> type[CostModel]:
    cls = COST_MODELS.get(name)
    if name == "target":
        measured = target_timing(device, target, timing) == "measured"  # type: ignore[arg-type]
        cls = MeasuredKernelCostModel if measured else TargetCostModel
    if cls is None:
        raise ConfigError(f"unknown cost model {name!r}; choose one of: {', '.join(COST_MODELS)}")
    return cls


def _keyword_options(cls: type[CostModel]) -> list[str]:
    params = inspect.signature(cls.__init__).parameters
    return [p for p, spec in params.items() if p != "self" and spec.kind is inspect.Parameter.KEYWORD_ONLY]


def _this_machine_profile(device: str) -> str:
    """The analytic profile of this machine ("auto": its NVIDIA GPU's, else cpu; "cuda": its GPU's)."""
    from xrl.cost.devices import gpu_model_names, this_machine_profile

    if device == "cuda" and not gpu_model_names():
        raise ConfigError("--device cuda: no NVIDIA GPU found on this machine; name a profile "
                          "(h100, a100, v100, gtx1080, cpu) to estimate for another device")
    return this_machine_profile()


__all__ = [
    "COST_MODELS",
    "DEVICE_PROFILES",
    "AnalyticCostModel",
    "CostModel",
    "DeviceProfile",
    "Measurement",
    "OrtCostModel",
    "TARGETS",
    "Target",
    "MeasuredKernelCostModel",
    "TargetCostModel",
    "default_target",
    "get_target",
    "get_cost_model",
    "get_device",
    "op_key",
]
