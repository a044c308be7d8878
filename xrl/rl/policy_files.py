"""Where the policies shipped with xrl are, and what `--policy` names. No torch here, so a wrong name is
refused before any work (`--search rl` runs greedy before it loads torch and the policy)."""

from __future__ import annotations

from pathlib import Path

from xrl.errors import XrlError


class PolicyNotFound(XrlError):
    """`--policy` names no file and no shipped policy."""


# what to do about a policy checkpoint that is not there (also the checkpoint loader's message)
MISSING_HINT = "train one with `xrl train`, or omit --policy to use the shipped one"


def default_policy_path() -> Path:
    """The policy shipped with xrl (trained on the built-in suite under the analytic cost model)."""
    return shipped_policy_path("default")


def shipped_policy_path(name: str) -> Path:
    from importlib.resources import files

    return Path(str(files("xrl.policies") / f"{name}.pt"))


def shipped_policy_names() -> list[str]:
    return sorted(p.stem for p in shipped_policy_path("default").parent.glob("*.pt"))


def resolve_policy_path(policy: str | Path | None) -> Path:
    """`--policy` as a user writes it: None is the shipped default; a bare name that is not a file here
    (`default`, `expert`) is one of the policies shipped in xrl/policies; anything else is a path."""
    if policy is None:
        return default_policy_path()
    text = str(policy)
    if Path(text).exists() or "/" in text or "\\" in text or text.endswith((".pt", ".onnx")):
        return Path(text)
    if text in shipped_policy_names():
        return shipped_policy_path(text)
    raise PolicyNotFound(f"{text}: no such policy file, and not a shipped policy "
                         f"(shipped: {', '.join(shipped_policy_names())})")


def existing_policy_path(policy: str | Path | None) -> Path:
    """`resolve_policy_path`, and the file must be there: checked before any work, without torch."""
    path = resolve_policy_path(policy)
    if not path.is_file():
        raise PolicyNotFound(f"{path}: no such policy checkpoint ({MISSING_HINT})")
    return path
