"""Exact merges that only remove work, taken before the pre-passes (`xrl.api.optimize`).

A LoRA adapter left unmerged (rewrite_rules/lora.rules) sits between its base layer's MatMul and bias Add.
The peers' fusions (onnxruntime's transformers optimizer: Attention over three biased MatMuls, BiasGelu)
match the plain MatMul+Add form, so on the original they miss every adapted projection, and once they have
rewritten the rest, xrl's search merges the adapters into forms those fusions never see again. Merging
first gives the pre-passes the graph the user would have exported after PEFT's `merge_and_unload`.

Only rules that merge a low-rank branch into weights are taken here: each removes two products, a Mul and an
Add for the same output, exactly (the rules are verified as every other), so no cost model is asked. Where
adapters are graph inputs (a multi-LoRA server) the rules do not match and nothing changes.
"""

from __future__ import annotations

from xrl.ir import Graph
from xrl.search.result import SearchResult

# the rules taken before the pre-passes: those of lora.rules and dora.rules that fold an adapter into its
# layer's weights
EXACT_FIRST_PREFIXES = ("merge_lowrank_", "merge_dora_")


def exact_first_engine():  # noqa: ANN201 - a RewriteEngine (imported here: the rules load on first use)
    """An engine over the verified rules named by EXACT_FIRST_PREFIXES."""
    from xrl.rewrite import RewriteEngine

    rules = [r for r in RewriteEngine.default().rules if r.name.startswith(EXACT_FIRST_PREFIXES)]
    return RewriteEngine(rules)


def merge_first(graph: Graph) -> SearchResult:
    """`graph` with every adapter the exact-first rules match merged (the first candidate each step, in the
    engine's deterministic order); each step removes nodes, so at most len(graph) steps are taken."""
    engine = exact_first_engine()
    steps: list[str] = []
    for _ in range(len(graph)):
        found = engine.candidates(graph)
        if not found:
            break
        graph = found[0].graph
        steps.append(found[0].step)
    return SearchResult(graph=graph, steps=steps, details={"exact_first": len(steps)})
