"""Loading the rule set: parse the rule files, keep only rules that pass numerical verification.

`load_rules()` returns the verified built-in rules. Verification runs once per process and rule
text (memoised), and its passing outcomes are kept on disk between processes (`verify_cache.py`: keyed
on the rule's text and the source of the code that checks it, so a stale outcome cannot be read back):
the 160+ built-in rules take 1-2 s on an idle 2-core machine and up to 10 s under load. A rule that fails
verification is never loaded; `xrl rules verify` (which always verifies afresh) reports why.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from xrl.rewrite.lang import Rule, RuleInfo, RuleSyntaxError, parse_file

if TYPE_CHECKING:
    from xrl.rewrite.verify import RuleCheck

_PACKAGE = Path(__file__).resolve().parent


def rules_dir() -> Path:
    """Where the built-in rule files live: `$XRL_RULES_DIR`, the installed package data, or the checkout."""
    env = os.environ.get("XRL_RULES_DIR")
    if env:
        return Path(env)
    for candidate in (_PACKAGE.parent / "rewrite_rules", _PACKAGE.parent.parent / "rewrite_rules"):
        if candidate.is_dir():
            return candidate
    return _PACKAGE.parent.parent / "rewrite_rules"


def rule_files(paths: Iterable[str | Path] | None = None) -> list[Path]:
    """The `.rules` files named (a folder stands for the files in it), sorted within each folder."""
    out: list[Path] = []
    for p in [rules_dir()] if paths is None else paths:
        p = Path(p)
        out.extend(sorted(p.glob("*.rules")) if p.is_dir() else [p])
    return out


@dataclass
class RuleSet:
    """Rules in file order, with each one's verification result (`checks` is empty when unverified)."""

    rules: tuple[Rule, ...]
    checks: dict[str, RuleCheck] = field(default_factory=dict)  # rule name -> its verification
    rejected: tuple[str, ...] = ()  # rules parsed but not loaded because they failed verification

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __getitem__(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(name)

    def names(self) -> list[str]:
        return [r.name for r in self.rules]

    def select(self, names: Iterable[str]) -> RuleSet:
        keep = set(names)
        return RuleSet(tuple(r for r in self.rules if r.name in keep), self.checks, self.rejected)

    def families(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rules:
            out[r.family] = out.get(r.family, 0) + 1
        return out

    def infos(self) -> list[RuleInfo]:
        return [r.info() for r in self.rules]

    def summary(self) -> dict:
        """JSON-ready: counts per family, multi-output count, and each rule's info."""
        return {"rules": len(self.rules), "multi_output": sum(r.is_multi_output for r in self.rules),
                "families": self.families(), "rejected": list(self.rejected),
                "items": [asdict(i) for i in self.infos()]}


def parse_rule_files(paths: Iterable[str | Path] | None = None) -> list[Rule]:
    """Every rule in the files (no verification). Raises RuleSyntaxError on a bad file."""
    rules: list[Rule] = []
    seen: dict[str, Rule] = {}
    for f in rule_files(paths):
        for r in parse_file(f):
            if r.name in seen:
                raise RuleSyntaxError(r.file, r.line, f"rule {r.name!r} is also defined at {seen[r.name].location}")
            seen[r.name] = r
            rules.append(r)
    return rules


_MEMO: dict[tuple, RuleSet] = {}
_PARSED: dict[tuple, list[Rule]] = {}


def load_rules(paths: Iterable[str | Path] | None = None, *, verified_only: bool = True,
               seed: int = 0, trials: int = 3) -> RuleSet:
    """The rules in `paths` (default: the built-in rule files).

    verified_only: keep only rules that pass `verify_rules(seed=seed, trials=trials)`; failing rules
    are left out with a warning.
    """
    files = rule_files(paths)
    stamp = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    rules = _PARSED.get(stamp)
    if rules is None:  # parsing 124 rules takes about a second: once per process while the files are unchanged
        rules = _PARSED[stamp] = parse_rule_files(files)
    if not verified_only:
        return RuleSet(tuple(rules))
    key = (tuple((r.name, r.family, r.text) for r in rules), seed, trials)
    if key in _MEMO:
        return _MEMO[key]
    from xrl.rewrite.match import outside_search
    from xrl.rewrite.verify_cache import verify_rules_cached

    with outside_search():  # a search's time limit must not fail rules by cutting their checks short
        checks = {c.name: c for c in verify_rules_cached(rules, seed=seed, trials=trials)}
    ok = tuple(r for r in rules if checks[r.name].ok)
    rejected = tuple(r.name for r in rules if not checks[r.name].ok)
    if rejected:
        warnings.warn(f"{len(rejected)} rewrite rule(s) failed verification and are not loaded: "
                      f"{', '.join(rejected)}; run `xrl rules verify` for details", stacklevel=2)
    out = _MEMO[key] = RuleSet(ok, checks, rejected)
    return out
