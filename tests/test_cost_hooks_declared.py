"""Issue 33 item 2: `measured`, `per_op` and `stats` (and `budget_exhausted`) are declared on `CostModel`, so the
rewrite candidates, the env's state check, `xrl env` and the rollouts read them directly, never by getattr."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from xrl.cost import COST_MODELS, get_cost_model
from xrl.cost.base import CostModel
from xrl.errors import XrlError
from xrl.search.budget import CallBudget

# (per_op, measured) as each backend has always answered; the callers' old getattr defaults were
# per_op False and measured False (or True in candidate.delta_cost, for an object that is no CostModel)
EXPECTED = {
    "analytic": (True, False),
    "ort": (False, True),
    "op": (True, False),
    "e2e": (False, True),
    "cuda": (False, True),  # granularity "graph", the default
    "target": (False, False),
    "roofline": (False, False),
}


def test_the_base_class_declares_the_hooks() -> None:
    for hook in ("measured", "per_op", "stats", "budget_exhausted"):
        assert hook in vars(CostModel), hook
    assert CostModel.per_op is True and CostModel.measured is False
    assert isinstance(CostModel.stats, Mapping) and dict(CostModel.stats) == {}
    with pytest.raises(TypeError):  # read-only: a model that counts sets a dict of its own
        CostModel.stats["measured"] = 1  # type: ignore[index]


def test_the_table_is_the_one_this_test_knows() -> None:
    assert set(COST_MODELS) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_registered_cost_model_has_the_hooks_with_their_types(name: str) -> None:
    try:
        model: CostModel = get_cost_model(name, device="cpu", target="ort-cpu")
    except XrlError:  # a backend this machine cannot build (cuda without a GPU): its class answers
        model = COST_MODELS[name]  # type: ignore[assignment]
        assert name == "cuda", f"{name} could not be built on this machine"
    assert type(model.per_op) is bool and type(model.measured) is bool, name
    if isinstance(model, CostModel):  # cuda's flags are its inner model's, set when it is built
        assert (model.per_op, model.measured) == EXPECTED[name], name
    assert isinstance(model.stats, Mapping) and all(isinstance(v, int | float) for v in model.stats.values()), name
    if isinstance(model, CostModel):
        assert model.budget_exhausted() is False


def test_counting_models_keep_their_own_counts_and_a_budget_reports_exhaustion() -> None:
    target = get_cost_model("target", device="cpu", target="ort-cpu")
    if type(target).__name__ == "MeasuredKernelCostModel":
        assert target.stats is not CostModel.stats and "measured" in target.stats
    budget = CallBudget(get_cost_model("analytic", device="cpu"), 0)
    assert budget.model.budget_exhausted() is True and budget.model.stats == {}
