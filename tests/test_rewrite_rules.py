"""The built-in rule set: size and coverage, every rule numerically verified, and wrong rules caught."""

from __future__ import annotations

import json
import textwrap
from dataclasses import asdict
from pathlib import Path

import pytest

from xrl.rewrite import RuleSet, load_rules, parse_rule_files, parse_rules, verify_rule, verify_rules

FAMILIES = {"merge", "fusion", "distributivity", "associativity", "transpose", "concat_split", "reshape", "algebraic"}


@pytest.fixture(scope="module")
def rules() -> list:
    return parse_rule_files()


def test_rule_set_size_and_coverage(rules: list) -> None:
    assert len(rules) >= 60
    assert sum(r.is_multi_output for r in rules) >= 10
    assert {r.family for r in rules} == FAMILIES
    for r in rules:
        assert r.comment and r.location.endswith(f":{r.line}")
    names = {r.name for r in rules}
    for wanted in ("merge_matmul_3", "merge_linear_3", "merge_conv_2", "merge_conv_pad_kernel", "enlarge_conv_kernel",
                   "merge_group_conv_2", "merge_gemm_2", "fuse_conv_Relu", "fuse_conv_bn", "fuse_conv_mul",
                   "fuse_matmul_add_gemm", "fuse_gemm_Gelu", "factor_matmul_lhs", "assoc_matmul_right",
                   "assoc_matmul_left", "scale_matmul_weight", "transpose_cancel", "transpose_matmul",
                   "sink_transpose_Relu", "sink_transpose_Add_pair", "split_concat_cancel_2", "concat_split_cancel_2",
                   "concat_of_Relu", "Relu_of_concat", "reshape_reshape", "squeeze_unsqueeze_cancel",
                   "remove_identity", "remove_dropout", "remove_mul_one", "remove_add_zero", "remove_double_neg",
                   "remove_relu_relu"):
        assert wanted in names, wanted


def test_every_builtin_rule_verifies(rules: list) -> None:
    # More trials than load_rules uses: more random shapes and attributes per rule.
    checks = verify_rules(rules, seed=1, trials=8)
    bad = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
    assert not bad, "\n".join(bad)
    assert all(c.trials == 8 and c.max_err <= 1e-9 for c in checks)


def test_load_rules_loads_the_verified_set() -> None:
    rs = load_rules()
    assert isinstance(rs, RuleSet) and len(rs) >= 60 and not rs.rejected
    assert load_rules() is rs  # verified once per process
    summary = rs.summary()
    json.dumps(summary)
    assert summary["rules"] == len(rs) and summary["multi_output"] >= 10
    assert sum(summary["families"].values()) == len(rs)
    json.dumps([asdict(c) for c in rs.checks.values()])


WRONG = textwrap.dedent("""\
    # Wrong: swaps the two outputs of a merge
    rule swapped_merge family=merge
      y1 = MatMul(x, w1)
      y2 = MatMul(x, w2)
      where weight(w1) and weight(w2) and rank(w1) == 2 and rank(w2) == 2
      =>
      y2, y1 = Split(MatMul(x, Concat(w1, w2, axis=1)), axis=rank(y1) - 1, split=(dim(w1, 1), dim(w2, 1)))
      example x=[B, M, K], w1=[K, N], w2=[K, N]

    # Wrong: relu does not commute with averaging
    rule relu_avgpool family=algebraic
      y = AveragePool(Relu(x), **r)
      =>
      y = Relu(AveragePool(x, **r))
      example x=[N, C, H, W], H=between(3, 6), W=between(3, 6)

    # Wrong by a little: folds BatchNormalization without its epsilon
    rule bn_no_eps family=fusion
      y = BatchNormalization(Conv(x, w, activation=None, **r), scale, bias, mean, var, epsilon=eps)
      where weight(w) and weight(scale) and weight(bias) and weight(mean) and weight(var)
      =>
      f = Div(scale, Sqrt(var))
      y = Conv(x, Mul(w, Reshape(f, ints((dim(w, 0),) + (1,) * (rank(w) - 1)))), Sub(bias, Mul(mean, f)), **r)
      example x=[N, C, H, W], w=[O, C, K, K], scale=[O], bias=[O], mean=[O], var=positive([O]), K=choice(1, 3)

    # Wrong: x * c is not x when c broadcasts x to a larger shape (the shape condition is missing)
    rule mul_one_broadcast family=algebraic
      y = Mul(x, c)
      where all_equal(c, 1.0)
      =>
      y = x
      example x=[A], c=fill([B, A], 1.0)

    # Unverifiable: its condition never holds
    rule never family=algebraic
      y = Relu(x)
      where rank(x) > 10
      =>
      y = x

    # Right: a control
    rule double_neg family=algebraic
      y = Neg(Neg(x))
      =>
      y = x
    """)


def test_verification_catches_wrong_rules() -> None:
    checks = {c.name: c for c in verify_rules(parse_rules(WRONG, "wrong.rules"))}
    assert not checks["swapped_merge"].ok and "differs" in checks["swapped_merge"].detail
    assert not checks["relu_avgpool"].ok and "differs" in checks["relu_avgpool"].detail
    assert not checks["bn_no_eps"].ok and checks["bn_no_eps"].max_err < 1e-3  # small errors are caught too
    assert not checks["mul_one_broadcast"].ok
    assert not checks["never"].ok and "only 0 of 3 trials" in checks["never"].detail
    assert checks["double_neg"].ok and checks["double_neg"].trials == 3


def test_a_failing_rule_is_never_loaded(tmp_path: Path) -> None:
    (tmp_path / "mixed.rules").write_text(WRONG)
    with pytest.warns(UserWarning, match="failed verification"):
        rs = load_rules([tmp_path])
    assert rs.names() == ["double_neg"]
    assert set(rs.rejected) == {"swapped_merge", "relu_avgpool", "bn_no_eps", "mul_one_broadcast", "never"}
    assert len(load_rules([tmp_path], verified_only=False)) == 6


def test_verification_is_deterministic(rules: list) -> None:
    rule = next(r for r in rules if r.name == "merge_conv_pad_kernel")
    a, b = verify_rule(rule, seed=3), verify_rule(rule, seed=3)
    assert (a.ok, a.max_err, a.trials) == (b.ok, b.max_err, b.trials)


WRONG_PAD = """
# Fold a zero Pad into the Conv after it, but forget to add the pads (wrong)
rule forget_the_pad family=fusion
  y = Conv(Pad(x, p, opt(v), mode="constant"), w, opt(b), pads=q, group=g, activation=a, auto_pad="NOTSET", **r)
  where weight(p) and numel(p) == 2 * rank(x) and min(value(p)) >= 0
  where value(p)[0] == 0 and value(p)[1] == 0 and value(p)[rank(x)] == 0 and value(p)[rank(x) + 1] == 0
  where not present(v) or all_equal(v, 0.0)
  =>
  y = Conv(x, w, opt(b), pads=q, group=g, activation=a, **r)
  example R=choice(1, 2), K=choice(1, 3), H=between(3, 6), W=between(3, 6), D=between(3, 5), G=choice(1, 2)
  example x=[N, G * C, H, W, D][:R + 2], w=[G * M, C, K, K, K][:R + 2], b=[G * M], v=fill([], 0.0)
  example p=ints([0, 0, P1, P2, P3][:R + 2] + [0, 0, P4, P5, P6][:R + 2]), P1=between(0, 2), P2=between(0, 2)
  example P3=between(0, 2), P4=between(0, 2), P5=between(0, 2), P6=between(0, 2)
"""


def test_a_rule_whose_rewrite_changes_a_shape_fails() -> None:
    """Dropping the Pad without adding its pads changes the output's shape whenever a pad is nonzero: the
    engine rejects those rewrites, and verification must fail the rule rather than retry until a draw of
    all-zero pads hides the mistake."""
    for seed in range(3):
        check = verify_rule(parse_rules(WRONG_PAD, "wrong_pad.rules")[0], seed=seed, trials=10)
        assert not check.ok and "does not type-check" in check.detail, check.detail
