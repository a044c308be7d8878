"""The exact merges taken before the pre-passes (xrl.deploy.exact_merges) are the rules declared `tags=exact_merge`,
not those whose names start with a prefix: renaming a rule cannot drop it from the stage."""

from __future__ import annotations

import dataclasses

import pytest

from xrl.deploy.exact_merges import exact_merge_engine, exact_merge_rules
from xrl.rewrite.lang import RuleSyntaxError, parse_rules
from xrl.rewrite.rules import parse_rule_files

OLD_PREFIXES = ("merge_lowrank_", "merge_dora_")  # what the stage selected by before (xrl/search/exact_first.py)


def test_the_tag_selects_what_the_name_prefixes_did() -> None:
    rules = parse_rule_files()
    tagged = {r.name for r in exact_merge_rules(rules)}
    assert tagged == {r.name for r in rules if r.name.startswith(OLD_PREFIXES)}
    assert len(tagged) == 16  # lora.rules' 12 merges and dora.rules' 4
    assert {r.file.rsplit("/", 1)[-1] for r in exact_merge_rules(rules)} == {"lora.rules", "dora.rules"}


def test_the_engine_holds_the_verified_tagged_rules() -> None:
    engine_rules = {r.name for r in exact_merge_engine().rules}
    assert engine_rules == {r.name for r in parse_rule_files() if r.name.startswith(OLD_PREFIXES)}


def test_a_renamed_rule_keeps_its_tag_and_a_name_alone_selects_nothing() -> None:
    merge = next(r for r in parse_rule_files() if r.name == "merge_lowrank_linear")
    renamed = dataclasses.replace(merge, name="fold_adapter_into_linear")
    untagged = dataclasses.replace(merge, tags=frozenset())
    assert exact_merge_rules([renamed, untagged]) == [renamed]


RULE = "# c\nrule r family=algebraic{tags}\n  y = Relu(Neg(x))\n  =>\n  y = Neg(Relu(x))\n"


def test_the_header_declares_tags() -> None:
    assert parse_rules(RULE.format(tags=""))[0].tags == frozenset()
    assert parse_rules(RULE.format(tags=" tags=exact_merge"))[0].tags == {"exact_merge"}
    with pytest.raises(RuleSyntaxError, match="unknown tag 'exact_merges'"):  # a typo is an error, not a lost rule
        parse_rules(RULE.format(tags=" tags=exact_merges"))
