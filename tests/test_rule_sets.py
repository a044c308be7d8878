"""Issue 32, item 1: rules declare their kind; named, combinable rule sets selectable everywhere."""

from __future__ import annotations

import re

import pytest

from xrl.errors import ConfigError
from xrl.rewrite.lang import RuleSyntaxError, parse_rules
from xrl.rewrite.rules import active_rule_set, check_rule_set, load_rules, rule_files, use_rules

RULE = """# Fold a scalar multiplication after a MatMul into its weight
rule fold_it family=algebraic{kind}
  t = MatMul(x, w)
  y = Mul(t, s)
  where weight(w) and weight(s) and numel(s) == 1 and shape(y) == shape(t)
  =>
  y = MatMul(x, Mul(w, Reshape(s, ints(()))))
  example x=[B, M, K], w=[K, N], s=choice([1], [])
"""


def test_kind_is_parsed_and_defaults_to_elementary() -> None:
    assert parse_rules(RULE.format(kind=" kind=composite"))[0].kind == "composite"
    assert parse_rules(RULE.format(kind=" kind=elementary"))[0].kind == "elementary"
    assert parse_rules(RULE.format(kind=""))[0].kind == "elementary"
    with pytest.raises(RuleSyntaxError, match="unknown kind 'atomic'"):
        parse_rules(RULE.format(kind=" kind=atomic"))
    assert not parse_rules(RULE.format(kind=" kind=elementary in_all=no"))[0].in_all
    with pytest.raises(RuleSyntaxError, match="in_all is yes or no"):
        parse_rules(RULE.format(kind=" kind=composite in_all=no"))


def test_every_builtin_rule_declares_its_kind() -> None:
    for f in rule_files():
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if line.startswith("rule "):
                assert re.search(r"\bkind=(elementary|composite)\b", line), f"{f.name}:{n} declares no kind="


def test_named_sets() -> None:
    everything = load_rules()
    elementary = load_rules(rule_set="elementary")
    composite = load_rules(rule_set="composite")
    assert {r.kind for r in elementary} == {"elementary"} and {r.kind for r in composite} == {"composite"}
    # `all` is the default optimisation's set: the steps declared in_all=no are in the elementary set only
    only_elementary = {r.name for r in elementary if not r.in_all}
    assert only_elementary >= {"move_bias_past_product", "avgpool_conv1x1_as_conv"}
    assert not only_elementary & set(everything.names())
    assert set(everything.names()) | only_elementary == set(elementary.names()) | set(composite.names())
    assert load_rules(rule_set="all") is everything
    # the merges that took the headroom away are composite
    assert {r.name for r in composite} >= {"merge_lowrank_linear_scaled", "merge_lowrank_gemm",
                                           "merge_sum_conv_bn_branches", "merge_sum_conv_identity"}
    lora = load_rules(rule_set="lora")
    union = load_rules(rule_set="elementary + lora")
    assert set(union.names()) == set(elementary.names()) | set(lora.names())
    every = load_rules(rule_set="all+elementary").names()
    assert union.names() == [n for n in every if n in set(union.names())]  # file order kept


def test_unknown_set_is_one_config_error_listing_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"unknown rule set 'bogus'; choose from all, elementary, composite, .*lora"):
        load_rules(rule_set="elementary+bogus")
    with pytest.raises(ConfigError, match=r"join sets with '\+', not ','"):
        check_rule_set("elementary,lora")


def test_use_rules_reaches_the_default_engine() -> None:
    from xrl.rewrite import RewriteEngine

    assert active_rule_set() == "all"
    with use_rules("elementary"):
        names = {r.name for r in RewriteEngine.default().rules}
        assert "merge_lowrank_linear" not in names and "assoc_matmul_right" in names
    assert active_rule_set() == "all"
    assert "merge_lowrank_linear" in {r.name for r in RewriteEngine.default().rules}


def test_api_and_compare_take_rules() -> None:
    import inspect

    from xrl.api import optimize
    from xrl.search.compare import CompareConfig, run_compare

    assert inspect.signature(optimize).parameters["rules"].default == "all"
    with pytest.raises(ConfigError, match="unknown rule set"):
        optimize("mlp", rules="nope")
    with pytest.raises(ConfigError, match="unknown rule set"):
        run_compare(CompareConfig(graphs=("mlp",), methods=("greedy",), rules="nope"))


def test_cli_rules(capsys: pytest.CaptureFixture[str]) -> None:
    from xrl.cli.main import main

    assert main(["rules", "list", "--rules", "bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown rule set 'bogus'" in err[0]
    assert main(["rules", "list", "--rules", "composite"]) == 0
    out = capsys.readouterr().out
    assert "merge_lowrank_linear" in out and "factor_matmul_lhs" not in out and "composite" in out
    assert main(["candidates", "mlp", "--rules", "elementary", "--json"]) == 0
    assert '"rules": "elementary"' in capsys.readouterr().out


def test_hydra_key() -> None:
    from pathlib import Path

    conf = (Path(__file__).resolve().parents[1] / "conf" / "train.yaml").read_text()
    assert re.search(r"^rules: all\b", conf, re.M)
