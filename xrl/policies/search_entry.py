"""`--search rl` in the search registry (`xrl.search.registry`, which imports this module on its first
lookup). It lives with the shipped policies rather than in `xrl.rl`: an exported .onnx policy runs without
xrl's training code (tests/test_policy_export.py runs it with `xrl.rl` and torch_geometric blocked).
Importing it loads neither torch nor a policy: the runner imports its code when it runs."""

from __future__ import annotations

from typing import Any

from xrl.search.registry import lazy_runner, register_search
from xrl.search.result import SearchResult


def run_policy(*args: Any, **options: Any) -> SearchResult:
    """A checkpoint goes to xrl.rl.rl_search; an exported .onnx policy to its release runner, which
    needs neither torch_geometric nor xrl's training code (xrl.policies.release)."""
    release = str(options.get("policy") or "").endswith(".onnx")
    run = lazy_runner("xrl.policies.release", "run_release") if release else lazy_runner("xrl.rl.rl_search",
                                                                                        "run_rl")
    return run(*args, **options)


# replace=False: a runner registered as "rl" in code before the first lookup is kept
register_search("rl", run_policy, description="a trained policy (the shipped one unless --policy says otherwise)",
                requires=("xrl.rl.rl_search",), replace=False)


def _rl_with(**preset: Any):  # noqa: ANN202 - a registry runner
    """`--search rl` with options preset (the caller's own options win)."""

    def runner(*args: Any, **options: Any) -> SearchResult:
        return lazy_runner("xrl.rl.rl_search", "run_rl")(*args, **{**preset, **options})

    return runner


# Issue 24's ablations as searches of their own, so `xrl compare --methods rl,rl-untrained,rl-uniform,rl-cost,
# rl-argmax` runs them beside the other searches on a user's graphs: the same guided search under another prior
# (xrl.rl.priors), or the trained policy's argmax rollout alone.
for _name, _preset, _what in (
        ("rl-untrained", {"prior": "untrained"}, "the guided search under the policy's network untrained (--seed)"),
        ("rl-uniform", {"prior": "uniform"}, "the guided search under a uniform prior"),
        ("rl-cost", {"prior": "cost"}, "the guided search under a softmax over each rewrite's estimated gain"),
        ("rl-argmax", {"mode": "argmax"}, "the trained policy's argmax rollout alone")):
    register_search(_name, _rl_with(**_preset), description=_what, requires=("xrl.rl.rl_search",), replace=False)
