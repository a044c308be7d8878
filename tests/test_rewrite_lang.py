"""The rule language: good rules parse into what they say; each kind of bad rule is refused with file:line."""

from __future__ import annotations

import pickle
import textwrap
from pathlib import Path

import pytest

from xrl.errors import XrlError
from xrl.rewrite import RuleSyntaxError, parse_file, parse_rules
from xrl.rewrite.lang import Alias, Arg, AttrPat, ConstArg, OpNode

GOOD = textwrap.dedent("""\
    # A file comment, not attached to any rule

    # Merge two MatMuls that share their left operand
    rule merge2 family=merge
      y1 = MatMul(x, w1, activation=a)
      y2 = MatMul(x, w2, activation=a)   # trailing comments are fine
      where weight(w1) and weight(w2)
      where rank(w1) == 2 and rank(w2) == 2
      =>
      y1, y2 = Split(MatMul(x, Concat(w1, w2, axis=1), activation=a), axis=rank(y1) - 1,
                     split=(dim(w1, 1), dim(w2, 1)))
      example x=[B, M, K], w1=[K, N], w2=[K, P]

    # Fuse {act} into the conv before it
    rule fuse_{act} family=fusion act=Relu|Tanh
      y = {act}(Conv(x, w, opt(b), activation=None, **r))
      =>
      y = Conv(x, w, opt(b), activation="{act}", **r)

    # Remove two transposes that cancel
    rule cancel family=transpose shared=t
      t = Transpose(x, perm=p)
      y = Transpose(t, perm=q)
      where compose(p, q) == tuple(range(len(p)))
      =>
      y = x

    # Collapse two reshapes
    rule rr family=reshape
      y = Reshape(Reshape(x, s1), s2)
      =>
      y = Reshape(x, ints(shape(y)))
    """)


def test_good_file_parses_into_rules() -> None:
    rules = parse_rules(GOOD, "good.rules")
    assert [r.name for r in rules] == ["merge2", "fuse_Relu", "fuse_Tanh", "cancel", "rr"]
    merge = rules[0]
    assert merge.family == "merge" and merge.comment == "Merge two MatMuls that share their left operand"
    assert merge.location == "good.rules:4"
    assert merge.inputs == ("x", "w1", "w2") and merge.roots == ("y1", "y2") and merge.is_multi_output
    assert merge.source_ops == 2 and merge.target_ops == 3  # Concat, MatMul, Split
    assert len(merge.conditions) == 4  # top-level conjuncts of both where lines
    assert merge.source[0] == OpNode("MatMul", (Arg("x"), Arg("w1")), ("y1",), (AttrPat("activation", "a"),),
                                     None, 5)
    assert dict(merge.example)["x"].source == "[B, M, K]"

    relu = rules[1]
    assert relu.comment == "Fuse Relu into the conv before it"
    assert relu.source[0].op == "Conv" and relu.source[1].op == "Relu"  # sorted producers first
    assert relu.source[0].inputs[2] == Arg("b", optional=True) and relu.source[0].rest == "r"
    assert relu.optional == {"b"} and not relu.is_multi_output
    assert relu.target[0].attrs[0][1].source == "'Relu'"

    cancel = rules[3]
    assert cancel.shared == {"t"} and isinstance(cancel.target[0], Alias)
    assert isinstance(rules[4].target[0].inputs[1], ConstArg)
    assert rules[4].info().location == "good.rules:29"


def test_rules_pickle() -> None:
    rules = parse_rules(GOOD, "good.rules")
    back = pickle.loads(pickle.dumps(rules))
    assert [r.name for r in back] == [r.name for r in rules]
    assert back[0].conditions[0].expr.source == rules[0].conditions[0].expr.source


def _error(text: str) -> str:
    with pytest.raises(RuleSyntaxError) as e:
        parse_rules(textwrap.dedent(text), "bad.rules")
    assert isinstance(e.value, XrlError)
    return str(e.value)


RULE = "# c\nrule r family=algebraic\n"


@pytest.mark.parametrize(("text", "message"), [
    (RULE + "  y = Relu(x\n  =>\n  y = x\n", "bad.rules:3: rule r: unclosed bracket"),
    (RULE + "  y = Relu(x))\n  =>\n  y = x\n", "bad.rules:3: rule r: unbalanced brackets"),
    (RULE + "  y = Relu(x) +\n  =>\n  y = x\n", "bad.rules:3: rule r: syntax error"),
    (RULE + "  y = Frobnicate(x)\n  =>\n  y = x\n", "bad.rules:3: rule r: unknown op 'Frobnicate'"),
    (RULE + "  y = Relu(x)\n  =>\n  y = Relu(z)\n", "bad.rules:5: rule r: target uses 'z', which the source does "
                                                   "not bind"),
    (RULE + "  y = Relu(Neg(x))\n  =>\n  y = Relu(y)\n", "bad.rules:5: rule r: target reads 'y', which the source "
                                                       "computes"),
    (RULE + "  y = Relu(x, x)\n  =>\n  y = x\n", "bad.rules:3: rule r: Relu takes 1 inputs, not 2"),
    (RULE + "  y = Conv(x)\n  =>\n  y = x\n", "bad.rules:3: rule r: Conv takes 2 to 3 inputs, not 1"),
    (RULE + "  a, b = Relu(x)\n  =>\n  a = x\n", "bad.rules:3: rule r: Relu has 1 output(s), not 2"),
    (RULE + "  y = Relu(x)\n  y = Neg(x)\n  =>\n  y = x\n", "bad.rules:4: rule r: source defines 'y' twice"),
    (RULE + "  y = Relu(x)\n  where frob(x)\n  =>\n  y = x\n", "bad.rules:4: rule r: condition 'frob(x)': "
                                                              "unknown function 'frob'"),
    (RULE + "  y = Relu(x)\n  where x.shape\n  =>\n  y = x\n", "bad.rules:4: rule r: condition 'x.shape': "
                                                             "Attribute is not allowed"),
    (RULE + "  y = Relu(x)\n  where rank(z) == 1\n  =>\n  y = x\n", "bad.rules:4: rule r: condition uses 'z'"),
    (RULE + "  y = Relu(x)\n  =>\n  z = Neg(x)\n  y = x\n", "bad.rules:5: rule r: target computes 'z' but nothing "
                                                           "reads it"),
    (RULE + "  y = Relu(x)\n  =>\n  x = Neg(x)\n", "bad.rules:5: rule r: target redefines 'x', an input of"),
    (RULE + "  y = Relu(x)\n  =>\n  z = x\n", "bad.rules:2: rule r: the target redefines none of the source's"),
    (RULE + "  y = Relu(x)\n  y = x\n", "bad.rules:4: rule r: a source line must be an op call"),
    (RULE + "  y = Relu(x)\n", "bad.rules:2: rule r: no '=>'"),
    (RULE + "  y = Relu(x)\n  z = Neg(w)\n  =>\n  y = x\n  z = w\n", "bad.rules:2: rule r: the source pattern is "
                                                                    "not connected"),
    (RULE + "  y = Relu(x, **r)\n  =>\n  y = Neg(x, **q)\n", "bad.rules:5: rule r: '**q' is not bound"),
    (RULE + "  y = Relu(x)\n  =>\n  y = Neg(x, k=unknown)\n", "bad.rules:5: rule r: attribute k uses 'unknown'"),
    ("# c\nrule r family=magic\n  y = Relu(x)\n  =>\n  y = x\n", "bad.rules:2: rule r: unknown family 'magic'"),
    ("rule r family=algebraic\n  y = Relu(x)\n  =>\n  y = x\n", "bad.rules:1: rule r: no comment"),
    ("# c\nrule r\n  y = Relu(x)\n  =>\n  y = x\n", "bad.rules:2: rule 'r' has no family"),
    ("# c\nrule r_{op} family=algebraic\n  y = Relu(x)\n  =>\n  y = x\n", "bad.rules:2: rule name 'r_{op}' uses "
                                                                         "{op}"),
    ("y = Relu(x)\n", "bad.rules:1: expected 'rule NAME family=...'"),
    (RULE + "  y = Relu(x)\n  =>\n  y = x\n" + RULE + "  y = Neg(x)\n  =>\n  y = x\n",
     "bad.rules:7: rule 'r' is defined twice (first at line 2)"),
])
def test_bad_rules_are_refused_with_file_and_line(text: str, message: str) -> None:
    assert message in _error(text)


def test_parse_file_reports_its_path(tmp_path: Path) -> None:
    path = tmp_path / "x.rules"
    path.write_text(RULE + "  y = Nope(x)\n  =>\n  y = x\n")
    with pytest.raises(RuleSyntaxError, match=rf"{path}:3: rule r: unknown op 'Nope'"):
        parse_file(path)
    with pytest.raises(RuleSyntaxError, match="cannot read the rule file"):
        parse_file(tmp_path / "missing.rules")


def test_expressions_cannot_reach_python() -> None:
    for bad in ("__import__('os')", "(lambda: 1)()", "[i for i in range(3)]", "x.__class__", "open('f')"):
        msg = _error(RULE + f"  y = Relu(x)\n  where {bad}\n  =>\n  y = x\n")
        assert "bad.rules:4" in msg
