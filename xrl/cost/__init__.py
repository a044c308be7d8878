"""Cost models: one interface (`CostModel`), several backends, picked by name.

    analytic  roofline per op on a named device profile (DEVICE_PROFILES); deterministic, microseconds
    ort       onnxruntime end-to-end wall time of the whole graph on this machine
    op        each distinct operator configuration timed alone through PyTorch (TASO), cached on disk
    e2e       the whole graph timed with onnxruntime or a PyTorch executor (CUDA graphs on a GPU)
    cuda      op or e2e timing through the native harness in cuda/ (needs a GPU)
    target    the roofline of the kernels a target's runtime runs after its own fusions (xrl.cost.targets)

To add a backend: subclass `CostModel` with a keyword-only `__init__(self, *, device=None, ...)`,
import heavy libraries inside its methods (so `import xrl.cost` stays cheap), and add one line to
COST_MODELS.
"""

from __future__ import annotations

import inspect
from typing import Any

from xrl.cost.analytic import AnalyticCostModel
from xrl.cost.base import CostModel, Measurement, op_key
from xrl.cost.devices import DEVICE_PROFILES, DeviceProfile, get_device
from xrl.cost.e2e import CudaCostModel, E2ECostModel  # torch loads inside their methods
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
    "target": TargetCostModel,
}


def get_cost_model(name: str = "analytic", *, device: str | DeviceProfile | None = None, **options: Any) -> CostModel:
    """A cost model by name. `device` None means the backend's default (analytic: "h100"; ort: "auto").

    Raises ConfigError for an unknown name or an option the backend does not take.
    """
    cls = COST_MODELS.get(name)
    if cls is None:
        raise ConfigError(f"unknown cost model {name!r}; choose one of: {', '.join(COST_MODELS)}")
    params = inspect.signature(cls.__init__).parameters
    accepted = [p for p, spec in params.items() if p != "self" and spec.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        valid = ", ".join(p for p in accepted if p != "device") or "none"
        raise ConfigError(f"cost model {name!r} has no option {', '.join(map(repr, unknown))}; its options: {valid}")
    return cls(device=device, **options)


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
    "TargetCostModel",
    "default_target",
    "get_target",
    "get_cost_model",
    "get_device",
    "op_key",
]
