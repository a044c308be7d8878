"""`--search rl` and its ablations, as rows of the search registry (`xrl.search.registry`): xrl's
pyproject.toml declares `register_searches` in the entry-point group `xrl.search_providers`, which the
registry reads on its first lookup, so the registry imports nothing of this layer. The rows live with the
shipped policies rather than in `xrl.rl`: an exported .onnx policy runs without xrl's training code
(tests/test_policy_export.py runs it with `xrl.rl` and torch_geometric blocked). Registering loads neither
torch nor a policy: the runner imports its code when it runs."""

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


def _rl_with(**preset: Any):  # noqa: ANN202 - a registry runner
    """`--search rl` with options preset (the caller's own options win)."""

    def runner(*args: Any, **options: Any) -> SearchResult:
        return lazy_runner("xrl.rl.rl_search", "run_rl")(*args, **{**preset, **options})

    return runner


# Issue 24's ablations as searches of their own, so `xrl compare --methods rl,rl-untrained,rl-uniform,rl-cost,
# rl-argmax` runs them beside the other searches on a user's graphs: the same guided search under another prior
# (xrl.rl.priors), or the trained policy's argmax rollout alone.
ABLATIONS = (
    ("rl-untrained", {"prior": "untrained"}, "the guided search under the policy's network untrained (--seed)"),
    ("rl-uniform", {"prior": "uniform"}, "the guided search under a uniform prior"),
    ("rl-cost", {"prior": "cost"}, "the guided search under a softmax over each rewrite's estimated gain"),
    ("rl-argmax", {"mode": "argmax"}, "the trained policy's argmax rollout alone"),
)


def register_searches() -> None:
    """The search provider (entry-point group `xrl.search_providers`): "rl" and its ablations. replace=False:
    a runner registered under one of these names in code before the registry's first lookup is kept."""
    register_search("rl", run_policy, description="a trained policy (the shipped one unless --policy says otherwise)",
                    requires=("xrl.rl.rl_search",), replace=False)
    for name, preset, what in ABLATIONS:
        register_search(name, _rl_with(**preset), description=what, requires=("xrl.rl.rl_search",), replace=False)
