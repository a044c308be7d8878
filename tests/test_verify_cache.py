"""The rule verification outcomes kept between processes (xrl/rewrite/verify_cache.py): read back only
while the rule text and the checking code are unchanged, never when altered, never for a failing rule."""

from __future__ import annotations

import json

import pytest

from xrl.rewrite import verify_cache
from xrl.rewrite.lang import parse_rules
from xrl.rewrite.verify import RuleCheck

GOOD = """
# Relu is idempotent
rule relu_relu family=algebraic
  y = Relu(Relu(x))
  =>
  y = Relu(x)
  example x=[A, B]
"""
WRONG = """
# wrong on purpose
rule relu_drop family=algebraic
  y = Relu(x)
  =>
  y = Neg(x)
  example x=[A, B]
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XRL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("XRL_NO_RULE_CACHE", raising=False)
    return tmp_path / verify_cache.FILE


def _counting(monkeypatch) -> list[str]:
    calls: list[str] = []
    import xrl.rewrite.verify as verify

    real = verify.verify_rule

    def counted(rule, **kw):
        calls.append(rule.name)
        return real(rule, **kw)

    monkeypatch.setattr(verify, "verify_rule", counted)
    return calls


def test_a_passing_outcome_is_read_back_and_a_failing_one_is_verified_again(cache, monkeypatch):
    rules = parse_rules(GOOD + WRONG)
    calls = _counting(monkeypatch)
    first = verify_cache.verify_rules_cached(rules, seed=0, trials=2)
    assert [c.ok for c in first] == [True, False] and calls == ["relu_relu", "relu_drop"]
    second = verify_cache.verify_rules_cached(rules, seed=0, trials=2)
    assert calls == ["relu_relu", "relu_drop", "relu_drop"]  # only the failing rule again
    assert second[0] == first[0] and not second[1].ok


def test_a_changed_rule_text_seed_or_code_misses(cache, monkeypatch):
    (rule,) = parse_rules(GOOD)
    calls = _counting(monkeypatch)
    verify_cache.verify_rules_cached([rule], seed=0, trials=2)
    verify_cache.verify_rules_cached([rule], seed=1, trials=2)
    (edited,) = parse_rules(GOOD.replace("example x=[A, B]", "example x=[A, B, C]"))  # new text
    verify_cache.verify_rules_cached([edited], seed=0, trials=2)
    monkeypatch.setattr(verify_cache, "code_fingerprint", lambda: "other code")
    verify_cache.verify_rules_cached([rule], seed=0, trials=2)
    assert len(calls) == 4


@pytest.mark.parametrize("damage", ["flip", "forged_ok", "garbage", "huge"])
def test_an_altered_cache_file_is_never_trusted(cache, monkeypatch, damage):
    (wrong,) = parse_rules(WRONG)
    (good,) = parse_rules(GOOD)
    verify_cache.verify_rules_cached([good], seed=0, trials=2)
    doc = json.loads(cache.read_text())
    if damage == "flip":  # a bit changed in an entry: the checksum no longer matches
        key = next(iter(doc["entries"]))
        doc["entries"][key]["max_err"] = 1.0
        cache.write_text(json.dumps(doc))
    elif damage == "forged_ok":  # an "ok" written by hand for the wrong rule, checksum recomputed
        key = verify_cache.rule_key(wrong, seed=0, trials=2, attempts=300)
        doc["entries"][key] = vars(RuleCheck(wrong.name, wrong.family, True, 0.0, 2, ""))
        doc["checksum"] = "0" * 64
        cache.write_text(json.dumps(doc))
    elif damage == "garbage":
        cache.write_bytes(b"\xff\xfe{not json")
    else:
        cache.write_bytes(b" " * (verify_cache.MAX_BYTES + 1))
    assert verify_cache.read() == {}
    (check,) = verify_cache.verify_rules_cached([wrong], seed=0, trials=2)
    assert not check.ok


def test_no_rule_cache_turns_it_off(cache, monkeypatch):
    monkeypatch.setenv("XRL_NO_RULE_CACHE", "1")
    verify_cache.verify_rules_cached(parse_rules(GOOD), seed=0, trials=2)
    assert not cache.exists()
