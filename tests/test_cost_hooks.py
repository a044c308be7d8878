"""Issue 33 item 2: what callers ask of a cost model is declared on `CostModel` (no hasattr/getattr sniffing)."""

from __future__ import annotations

from xrl.cost import AnalyticCostModel, get_cost_model
from xrl.cost.base import CostModel
from xrl.cost.ort import OrtCostModel
from xrl.search.registry import measured_screen


def test_hooks_are_declared_on_the_base_class() -> None:
    for hook in ("deadline", "target", "local_costing", "report", "per_op_estimate", "timing_device"):
        assert hook in vars(CostModel), hook


def test_per_op_estimate_and_target() -> None:
    analytic = AnalyticCostModel(device="cpu")
    assert analytic.per_op_estimate() is analytic
    assert analytic.target is None and analytic.timing_device() is None
    roofline = get_cost_model("roofline", device="cpu", target="ort-cpu")
    assert not roofline.per_op and roofline.per_op_estimate() is roofline.analytic
    assert roofline.target is not None and roofline.target.runtime == "onnxruntime"


def test_timing_device_picks_the_screen() -> None:
    ort = OrtCostModel(device="cpu", warmup=1, repeats=1)
    assert ort.per_op_estimate() is None
    assert ort.timing_device() == "cpu"
    assert measured_screen(ort).device.name == "cpu"


def test_local_costing_is_a_declared_flag() -> None:
    from xrl.cost.kernel_measured import MeasuredKernelCostModel
    from xrl.cost.targets import TargetCostModel

    assert MeasuredKernelCostModel.local_costing and not TargetCostModel.local_costing
    assert not AnalyticCostModel.local_costing
