"""An op's arity lives in its OpSpec (xrl/ir/ops.py), the one per-op table; the rule compiler reads it there."""

from __future__ import annotations

import dataclasses

import pytest

import xrl.rewrite.attrs
from xrl.errors import XrlError
from xrl.ir import ops
from xrl.rewrite.attrs import arity
from xrl.rewrite.lang import parse_rules


def test_no_second_arity_table() -> None:
    assert not hasattr(xrl.rewrite.attrs, "ARITY")
    assert not hasattr(xrl.rewrite.attrs, "BINARY")


def test_every_op_reads_its_arity_from_the_op_table(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, spec in ops.OPS.items():
        assert arity(name) == spec.arity
    # changing the op table's entry changes what the rule compiler sees: nothing else holds a copy
    conv = ops.OPS["Conv"]
    monkeypatch.setitem(ops.OPS, "Conv", dataclasses.replace(conv, arity=(2, 2, 1)))
    assert arity("Conv") == (2, 2, 1)
    assert arity("NotAnOp") == (1, 1, 1)  # an op the IR does not know: one in, one out


def test_arities_are_well_formed_and_spot_values() -> None:
    for name, (lo, hi, outs) in ((n, s.arity) for n, s in ops.OPS.items()):
        assert lo >= 0 and (hi is None or hi >= lo), name
        assert outs is None or isinstance(outs, int) or all(isinstance(k, int) for k in outs), name
    assert arity("Add") == (2, 2, 1) and arity("Not") == (1, 1, 1) and arity("And") == (2, 2, 1)
    assert arity("Where") == (3, 3, 1) and arity("Max") == (1, None, 1) and arity("Relu") == (1, 1, 1)
    assert arity("Split") == (1, 2, None) and arity("GroupQueryAttention") == (7, 7, (1, 3))


def test_rule_compiler_checks_a_rule_against_the_op_table(monkeypatch: pytest.MonkeyPatch) -> None:
    rule = "# c\nrule r family=algebraic\n  y = Relu(Neg(x))\n  =>\n  y = Neg(Relu(x))\n"
    parse_rules(rule)
    relu = ops.OPS["Relu"]
    monkeypatch.setitem(ops.OPS, "Relu", dataclasses.replace(relu, arity=(2, 2, 1)))
    with pytest.raises(XrlError, match="Relu takes 2 inputs, not 1"):
        parse_rules(rule)
