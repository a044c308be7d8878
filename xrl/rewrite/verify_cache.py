"""Rule verification outcomes kept between processes, so that `xrl` does not re-verify 160+ rules at every
start (1-2 s on an idle 2-core machine, up to 10 s under load, in every process: the CLI, each test
worker, each pre-pass and Ray worker).

Only passing outcomes are kept, and each is keyed on everything that decides it: the rule's name, family
and text, the seed, trials and attempts, numpy's version, and a fingerprint of the source of every module
that instantiates, matches, rewrites or executes a rule (`xrl/ir`, `xrl/rewrite`). Change any of them and
the key changes, so a stale "ok" cannot be read back. The file carries a checksum of its entries; a file
that does not parse or does not match its checksum is ignored (and rewritten), never trusted. A failing
rule is verified again in every process, so its message is always current. `xrl rules verify` never reads
this cache; `XRL_NO_RULE_CACHE=1` turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from xrl.atomic import write_atomic
from xrl.cache import cache_dir
from xrl.rewrite.lang import Rule
from xrl.rewrite.verify import RuleCheck

FILE = "rule_checks.json"
FORMAT = "xrl-rule-checks/1"
MAX_BYTES = 4 << 20  # a cache file larger than this is not ours: ignored
MAX_ENTRIES = 4096  # old fingerprints' entries beyond this are dropped on write
_CODE_DIRS = ("ir", "rewrite")


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 over the source of the modules that decide a verification outcome, and numpy's version."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(np.__version__.encode())
    for sub in _CODE_DIRS:
        for f in sorted((root / sub).glob("*.py")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def rule_key(rule: Rule, *, seed: int, trials: int, attempts: int) -> str:
    text = json.dumps([rule.name, rule.family, rule.text, seed, trials, attempts, code_fingerprint()])
    return hashlib.sha256(text.encode()).hexdigest()


def _path() -> Path:
    return cache_dir() / FILE


def _digest(entries: dict) -> str:
    return hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()


def read() -> dict[str, dict]:
    """The kept outcomes (key -> RuleCheck fields); empty when the file is missing, unreadable or altered."""
    path = _path()
    try:
        if not path.is_file() or path.stat().st_size > MAX_BYTES:
            return {}
        doc = json.loads(path.read_text(encoding="utf-8"))
        entries = doc["entries"]
        if doc.get("format") != FORMAT or not isinstance(entries, dict) or doc.get("checksum") != _digest(entries):
            return {}
        return entries
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return {}


def write(entries: dict[str, dict]) -> None:
    """Best effort: a cache that cannot be written only costs the next process its verification time."""
    if len(entries) > MAX_ENTRIES:
        entries = dict(list(entries.items())[-MAX_ENTRIES:])
    doc = {"format": FORMAT, "checksum": _digest(entries), "entries": entries}
    try:
        write_atomic(_path(), json.dumps(doc), mkdir=True)
    except OSError:
        pass


def enabled() -> bool:
    return os.environ.get("XRL_NO_RULE_CACHE", "") in ("", "0")


def verify_rules_cached(rules: Sequence[Rule], *, seed: int, trials: int, attempts: int = 300) -> list[RuleCheck]:
    """`verify_rules`, reading passing outcomes kept by an earlier process and keeping new ones."""
    from xrl.rewrite.verify import verify_rule

    if not enabled():
        return [verify_rule(r, seed=seed, trials=trials, attempts=attempts) for r in rules]
    kept = read()
    out, added = [], {}
    for rule in rules:
        key = rule_key(rule, seed=seed, trials=trials, attempts=attempts)
        fields = kept.get(key)
        check = None
        if isinstance(fields, dict):
            try:
                check = RuleCheck(**fields)
            except TypeError:
                check = None
        if check is None or not check.ok or check.name != rule.name:
            check = verify_rule(rule, seed=seed, trials=trials, attempts=attempts)
            if check.ok:
                added[key] = asdict(check)
        out.append(check)
    if added:
        write({**read(), **added})  # read again: another process may have added its own meanwhile
    return out
