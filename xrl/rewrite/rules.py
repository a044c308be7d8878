"""Loading the rule set: parse the rule files, keep only rules that pass numerical verification.

`load_rules()` returns the verified built-in rules. Verification runs once per process and rule
text (memoised), and its passing outcomes are kept on disk between processes (`verify_cache.py`: keyed
on the rule's text and the source of the code that checks it, so a stale outcome cannot be read back):
the 160+ built-in rules take 1-2 s on an idle 2-core machine and up to 10 s under load. A rule that fails
verification is never loaded; `xrl rules verify` (which always verifies afresh) reports why.

Named rule sets (issue 32). Every rule is `kind=elementary` or `kind=composite` (`xrl.rewrite.lang`), and
`load_rules(rule_set=NAME)` keeps the verified rules of the set NAME names:

- `all` (the default of `xrl optimize`): every rule but the elementary steps declared `in_all=no` (steps
  only a composite needs, which alone would change what the default search finds: `all` is the set the
  default optimisation had before rule sets existed);
- `elementary`: the elementary rules, the research setting (a composite's work then takes its sequence
  of steps, some of which raise the cost or only reorder: the foresight a learned policy can add);
- `composite`: the composite rules;
- a rule file's stem (`lora`, `reparam`, `algebraic`, ...): that file's rules;
- sets joined with `+`: their union, in file order (`elementary+lora`). `+` rather than a comma, since a
  comma in a Hydra override (`xrl train rules=...`) means a sweep.

An unknown name is a one-line `ConfigError` listing the choices (`check_rule_set`). `rule_set=None` takes
the process's current selection, `"all"` unless a caller is inside `use_rules(NAME)`: that is how
`xrl optimize --rules`, `xrl compare --rules` and `xrl.api.optimize(rules=...)` reach every search (each
builds its engine with `RewriteEngine.default()`, i.e. `load_rules()`) without a parameter in each runner.
"""

from __future__ import annotations

import copyreg
import functools
import hashlib
import hmac
import inspect
import io
import marshal
import os
import pickle
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from xrl.atomic import write_atomic
from xrl.cache import cache_dir, cache_secret
from xrl.errors import ConfigError
from xrl.rewrite.expr import Compiled
from xrl.rewrite.lang import KINDS, Rule, RuleInfo, RuleSyntaxError, parse_file

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

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rules:
            out[r.kind] = out.get(r.kind, 0) + 1
        return out

    def select_set(self, rule_set: str) -> RuleSet:
        """The rules of the named set (see the module docstring); ConfigError for an unknown name."""
        keep = rule_set_members(self.rules, rule_set)
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
                "families": self.families(), "kinds": self.kinds(), "rejected": list(self.rejected),
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


# ----- named rule sets ------------------------------------------------------------------------------
DEFAULT_RULE_SET = "all"
_ACTIVE: list[str] = [DEFAULT_RULE_SET]  # the selection `rule_set=None` means; `use_rules` pushes and pops it


def rule_set_choices(rules: Iterable[Rule]) -> list[str]:
    """The names a rule set may be built from: all, the kinds, and each rule file's stem."""
    stems = sorted({Path(r.file).stem for r in rules})
    return ["all", *KINDS, *(s for s in stems if s not in ("all", *KINDS))]


def rule_set_members(rules: Iterable[Rule], rule_set: str) -> set[str]:
    """The names of the rules in the set `rule_set` names (`a+b`: the union). ConfigError for an unknown name."""
    rules = tuple(rules)
    choices = rule_set_choices(rules)
    parts = [p.strip() for p in str(rule_set).split("+")]
    bad = [p for p in parts if p not in choices]
    if bad or not parts:
        hint = " (join sets with '+', not ',')" if "," in str(rule_set) else ""
        raise ConfigError(f"unknown rule set {bad[0] if bad else rule_set!r}{hint}; choose from "
                          f"{', '.join(choices)}, or several joined with '+' (e.g. elementary+lora)")
    keep: set[str] = set()
    for p in parts:
        keep |= {r.name for r in rules if (p == "all" and r.in_all) or r.kind == p or Path(r.file).stem == p}
    return keep


def check_rule_set(rule_set: str, paths: Iterable[str | Path] | None = None) -> str:
    """`rule_set` with spaces removed, once its names are checked against the rule files (no verification)."""
    rule_set_members(_parsed(rule_files(paths)), rule_set)
    return "+".join(p.strip() for p in str(rule_set).split("+"))


def active_rule_set() -> str:
    """The rule set `load_rules()` (and so `RewriteEngine.default()`) loads now."""
    return _ACTIVE[-1]


@contextmanager
def use_rules(rule_set: str | None) -> Iterator[str]:
    """Within the block, `load_rules()` without `rule_set` loads this set (None: leave the selection as it is).
    Process-wide rather than per thread: a search's worker threads must see the selection of the call that
    started them."""
    if rule_set is None:
        yield active_rule_set()
        return
    name = check_rule_set(rule_set)
    _ACTIVE.append(name)
    try:
        yield name
    finally:
        _ACTIVE.pop()


def with_rule_set(fn: Callable) -> Callable:
    """Decorate a function with a `rules` keyword: its body runs inside `use_rules(rules)` (the API's entry points)."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        with use_rules(bound.arguments.get("rules")):
            return fn(*args, **kwargs)

    return wrapper


_MEMO: dict[tuple, RuleSet] = {}
_SELECTED: dict[tuple, RuleSet] = {}
_PARSED: dict[tuple, list[Rule]] = {}


def _parsed(files: list[Path]) -> list[Rule]:
    stamp = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    rules = _PARSED.get(stamp)
    if rules is None:  # parsing 215 rules takes 1.5-5 s: once per process, and from the disk cache across them
        rules = _PARSED[stamp] = _parsed_cached(files)
    return rules


# ----- parsed rules kept between processes ----------------------------------------------------------
# Parsing the built-in rule files (each expression checked and compiled) took 1.5 s on an idle core and 4-5 s
# under load, in every `xrl` process, before anything is searched; the parsed rules are kept in the user's
# cache folder (`xrl.cache`), keyed on the bytes of every rule file and of the code that parses them (xrl/ir,
# xrl/rewrite) and on Python's version (the compiled expressions are its bytecode): a changed rule file or
# parser parses afresh. `XRL_NO_RULE_CACHE=1` turns it off (as for the verification outcomes).
PARSED_DIR = "rules_parsed"
_PARSED_FORMAT = b"xrl-parsed-rules/1"
_PARSED_KEEP = 8  # cache files kept (one per rule-file set and code version); older ones are removed


def _code_stamp() -> bytes:
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for sub in ("ir", "rewrite"):
        for f in sorted((root / sub).glob("*.py")):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.digest()


def parsed_cache_key(files: Iterable[Path]) -> str:
    """The key of the parsed rules of `files`: their paths and bytes, the parser's source, Python's version."""
    h = hashlib.sha256(_PARSED_FORMAT + sys.version.encode() + _code_stamp())
    for f in files:
        data = Path(f).read_bytes()
        h.update(f"{Path(f).resolve()}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


def _cache_on() -> bool:
    return os.environ.get("XRL_NO_RULE_CACHE", "") in ("", "0")


def _compiled_state(c: Compiled) -> tuple:
    # the expression's bytecode as marshal writes it: Compiled's own pickling compiles it again (most of a load)
    return _compiled_from, (c.source, tuple(sorted(c.names)), c.where, marshal.dumps(c._code))


def _compiled_from(source: str, names: tuple[str, ...], where: str, code: bytes) -> Compiled:
    c = object.__new__(Compiled)
    c.source, c.names, c.where, c._code = source, frozenset(names), where, marshal.loads(code)
    return c


def _parsed_mac(secret: bytes, key: str, body: bytes) -> bytes:
    return hmac.new(secret, key.encode() + b"\0" + body, hashlib.sha256).hexdigest().encode()  # 64 bytes


def _parsed_cached(files: list[Path]) -> list[Rule]:
    """`parse_rule_files(files)`, read from the cache where the same files and parser were parsed before. A cache
    file that is missing, unreadable or of another key is parsed afresh (and written, best effort)."""
    if not _cache_on():
        return parse_rule_files(files)
    try:
        key = parsed_cache_key(files)
    except OSError:
        return parse_rule_files(files)  # a file that cannot be read: parsing says which, as it always did
    path = cache_dir() / PARSED_DIR / f"{key}.pickle"
    try:
        # unpickling runs code: only a file this install wrote is read (an HMAC-SHA256 of the key and the
        # pickle under the install's secret, as the timing rows are), never one planted in the cache folder
        cache_dir().mkdir(parents=True, exist_ok=True)
        secret = cache_secret(cache_dir())
    except OSError:
        return parse_rule_files(files)
    try:
        data = path.read_bytes()
        mac, body = data[:64], data[64:]
        if hmac.compare_digest(mac, _parsed_mac(secret, key, body)):
            rules = pickle.loads(body)  # noqa: S301 - signed by this install's secret
            if isinstance(rules, list) and all(isinstance(r, Rule) for r in rules):
                return rules
    except Exception:  # noqa: BLE001 - missing, truncated, forged or from another version: parse afresh
        pass
    rules = parse_rule_files(files)
    try:
        buf = io.BytesIO()
        pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.dispatch_table = {**copyreg.dispatch_table, Compiled: _compiled_state}
        pickler.dump(rules)
        body = buf.getvalue()
        write_atomic(path, _parsed_mac(secret, key, body) + body, mkdir=True)
        old = sorted(path.parent.glob("*.pickle"), key=lambda f: f.stat().st_mtime)[:-_PARSED_KEEP]
        for f in old:
            f.unlink(missing_ok=True)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        pass  # a cache that cannot be written only costs the next process its parse
    return rules


def load_rules(paths: Iterable[str | Path] | None = None, *, verified_only: bool = True,
               seed: int = 0, trials: int = 3, rule_set: str | None = None) -> RuleSet:
    """The rules of the named set `rule_set` in `paths` (default: the built-in rule files).

    rule_set: "all", "elementary", "composite", a rule file's stem, or several joined with "+" (see the
    module docstring); None: the current selection (`use_rules`; "all" outside one). ConfigError if unknown.
    verified_only: keep only rules that pass `verify_rules(seed=seed, trials=trials)`; failing rules
    are left out with a warning.
    """
    rule_set = active_rule_set() if rule_set is None else rule_set
    full = _load_all(paths, verified_only=verified_only, seed=seed, trials=trials)
    if not verified_only:
        return full.select_set(rule_set)
    key = (id(full), rule_set)
    out = _SELECTED.get(key)
    if out is None:  # one RuleSet object per selection, so that engines built on it compare equal
        out = _SELECTED[key] = full.select_set(rule_set)
    return out


def _load_all(paths: Iterable[str | Path] | None, *, verified_only: bool, seed: int, trials: int) -> RuleSet:
    files = rule_files(paths)
    rules = _parsed(files)
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
                      f"{', '.join(rejected)}; run `xrl rules verify` for details", stacklevel=3)
    out = _MEMO[key] = RuleSet(ok, checks, rejected)
    return out
