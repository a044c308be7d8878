"""Exact merges that only remove work, taken before the pre-passes (`xrl.deploy.starts`).

A LoRA adapter left unmerged (rewrite_rules/lora.rules) sits between its base layer's MatMul and bias Add.
The peers' fusions (onnxruntime's transformers optimizer: Attention over three biased MatMuls, BiasGelu)
match the plain MatMul+Add form, so on the original they miss every adapted projection, and once they have
rewritten the rest, xrl's search merges the adapters into forms those fusions never see again. Merging
first gives the pre-passes the graph the user would have exported after PEFT's `merge_and_unload`.

Only rules that merge a low-rank branch into weights are taken here, those their header declares
`tags=exact_merge` (rewrite_rules/lora.rules and dora.rules; a rule is selected by that declaration, not its
name): each removes two products, a Mul and an Add for the same output, exactly (the rules are verified as every
other), so no cost model is asked. Where adapters are graph inputs (a multi-LoRA server) the rules do not match
and nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable

from xrl.ir import Graph
from xrl.rewrite.lang import Rule
from xrl.search.result import SearchResult

EXACT_MERGE_TAG = "exact_merge"


def exact_merge_rules(rules: Iterable[Rule]) -> list[Rule]:
    """The rules among `rules` declared `tags=exact_merge`, in their order."""
    return [r for r in rules if EXACT_MERGE_TAG in r.tags]


def exact_merge_engine():  # noqa: ANN201 - a RewriteEngine (imported here: the rules load on first use)
    """An engine over the verified rules (of the active rule set) declared `tags=exact_merge`."""
    from xrl.rewrite import RewriteEngine

    return RewriteEngine(exact_merge_rules(RewriteEngine.default().rules))


def merge_first(graph: Graph) -> SearchResult:
    """`graph` with every adapter the exact-merge rules match merged (the first candidate each step, in the
    engine's deterministic order); each step removes nodes, so at most len(graph) steps are taken."""
    engine = exact_merge_engine()
    steps: list[str] = []
    for _ in range(len(graph)):
        found = engine.candidates(graph)
        if not found:
            break
        graph = found[0].graph
        steps.append(found[0].step)
    return SearchResult(graph=graph, steps=steps, details={"exact_first": len(steps)})
