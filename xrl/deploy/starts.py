"""The starts stage of the deployment path: where the searches start, and the guard's peer candidates.

Exact merges (LoRA adapters into their layers' weights), then the target's chain of pre-passes, each peer
pass alone (for the guard), the estimate's and the machine's checks of the pre-passes' result, and the
original's outputs every candidate is verified against; one typed `Starts` value comes back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import onnx

from xrl.cost.base import CostModel
from xrl.deploy.deployment import Deployment
from xrl.frontends.loader import LoadedModel
from xrl.frontends.prepass import PASSES, PassReport, guard_peer_passes
from xrl.ir import Graph

# The pre-passes' result is dropped when its estimate is this much above the original's
PREPASS_TOLERANCE = 0.01
PREPASS_SHARE = 0.25  # of the time limit (or the default one), for the pre-passes
# pre-passes run alone, beside the target's chain, for the guard to time: onnxscript, which the chain leaves
# out, and each of the chain's own (the chain can measure slower than one of its passes alone, as on
# nn.MultiheadAttention's causal export on one thread: onnxslim alone 1.02x, the chain 0.97x)
GUARD_PEER_PASSES = guard_peer_passes()  # the rows of xrl.frontends.prepass.PASSES marked guard_peer
# ... on models up to this many bytes of weights: each result held until the guard is another copy of them
GUARD_PEER_MAX_BYTES = 1 << 30


@dataclass
class Starts:
    base: Graph  # the original, with its adapters merged where there were any
    merged: list[Any]  # those exact merges' rewrites
    start: Graph  # where the search starts: `base` after the pre-passes, or `base` where they were dropped
    prepassed: Graph  # the pre-passes' result, kept for the guard even where the estimate dropped it
    original_nodes: int  # nodes of the model as given
    # the original as a head and its weights (the IR's arrays), None where it must be read again to be written
    original_head: onnx.ModelProto | None
    original_weights: dict[str, Any] | None
    ref: Any  # the original's outputs on the verification inputs
    pre_slower: float | None  # the pre-passes' result's measured speed-up where it measured slower
    reports: list[PassReport] = field(default_factory=list)  # each pass's, and the deployment's notes
    peers: list[tuple[str, Graph]] = field(default_factory=list)  # (label, graph) of each peer pass alone


def starts(loaded: LoadedModel, dep: Deployment, chain: Sequence[str], *, peers_wanted: bool,
           input_shapes: Mapping[str, Sequence[int]] | None, time_limit: float | None, seed: int,
           verify_trials: int) -> Starts:
    """The starts stage: `chain` (the target's pre-passes, or the user's) on `loaded`'s original; with
    `peers_wanted` (the target's own chain) and the guard on, each peer pass alone too."""
    from xrl.frontends.onnx_weights import initializer_bytes
    from xrl.frontends.verify import reference_run
    from xrl.search.progress import DEFAULT_TIME_LIMIT_S

    # Memory: the original's model would be a second copy of every weight beside the IR: it is taken as a head on
    # the IR's arrays, for its outputs on the verification inputs (every candidate is compared with these) and
    # for the pre-passes. Each weight whose bytes equal the IR's is the IR's array (a file is read one weight at a
    # time: no model holding every weight is built beside the IR)
    original_head, original_weights = loaded.reference_head()
    original_nodes = len(original_head.graph.node)
    # the pre-passes share the time limit: a quarter of it, the rest is the search's
    budget = (time_limit if time_limit is not None else DEFAULT_TIME_LIMIT_S) * PREPASS_SHARE
    peers_wanted = peers_wanted and dep.guarded and initializer_bytes(original_head) <= GUARD_PEER_MAX_BYTES
    base, merged, start, reports, peers = _starts_of(loaded.graph, (original_head, original_weights), chain,
                                                     peers_wanted, input_shapes, budget)
    # the original's outputs, from its own weights (the IR's arrays only where byte for byte the same), with
    # no second copy of them held while its session runs
    ref = reference_run(original_head, like=loaded.graph, seed=seed, trials=verify_trials, external=original_weights)
    # kept (a small head) where its weights are the IR's arrays, so the guard can write the original without
    # reading or building it again (building a model holds its weights several times over); weights the
    # import changed are copies, and past a tenth of the weights the original is read again instead
    copied = sum(a.nbytes for k, a in original_weights.items() if a is not loaded.graph.initializers.get(k))
    if copied > 0.1 * sum(a.nbytes for a in original_weights.values()):
        original_head = original_weights = None
    # The guard times the pre-passes' result even where the estimate drops it: the estimate proposes, the
    # measurement decides (the transformers optimizer's Attention, priced by its kernel alone, can read slower)
    prepassed = start
    # within the estimate's resolution (a bias read as a Gemm input or an Add's) the peers' form is kept
    if start is not base and dep.cost_model.cost(start) > dep.cost_model.cost(base) * (1 + PREPASS_TOLERANCE):
        reports.append(PassReport("(all)", False, len(start), len(start),
                                  "dropped: estimated slower than what they were given"))
        start = base
    # The estimate proposes the pre-passes' result as the start; the machine decides. Where it measures slower
    # than what they were given (lora_vit: onnxruntime's transformers optimizer, 0.90x on one thread), the
    # search runs without them too, and the guard times both results.
    pre_slower = (measured_slower(start, base, dep.provider_timer(**PRE_CHECK_TIMING), PRE_CHECK_ROUNDS)
                  if dep.guarded and start is not base else None)
    return Starts(base, merged, start, prepassed, original_nodes, original_head, original_weights, ref, pre_slower,
                  reports, peers)


def _starts_of(original_graph: Graph, original: onnx.ModelProto | tuple, chain: Sequence[str], peers_wanted: bool,
               input_shapes: Mapping[str, Sequence[int]] | None, budget: float) -> tuple:
    """Where the searches start, and the guard's peer candidates: (base, merged, start, reports, peers).

    Exact merges that only remove work (LoRA adapters into their layers' weights) come before the pre-passes,
    whose fusions match the merged model's plain MatMul+Add form (`xrl.deploy.exact_merges`): `base` is the
    original with its adapters merged (`merged`: those rewrites), or the original. `start` is `base` after the
    target's chain of pre-passes. With `peers_wanted`, the peers' passes each run alone too (onnxscript's,
    which the chain leaves out, and each of the chain's): `peers` are their results, (label, graph), which the
    guard times beside the others, so what is written is never behind a peer the measurement prefers
    (onnxscript's fused attention pays on all threads and not on one)."""
    from xrl.frontends.onnx_io import to_onnx
    from xrl.frontends.onnx_weights import split_model

    # the original as a head and its weights (`split_model`), or a full model
    source = original if isinstance(original, tuple) else split_model(original, like=original_graph.initializers)
    base, merged = original_graph, []
    reports: list[PassReport] = []
    if chain:
        from xrl.deploy.exact_merges import merge_first

        first = merge_first(original_graph)
        if first.steps:
            base, merged = first.graph.validate(), list(first.steps)
            weights: dict = {}
            source = (to_onnx(base, external=weights), weights)
            reports.append(PassReport("exact merges", True, len(original_graph), len(base),
                                      f"{len(merged)} low-rank adapters merged into their layers' weights before "
                                      f"the pre-passes"))
    start, chain_reports, steps = _prepassed_steps(base, source, chain, input_shapes, budget)
    reports += chain_reports
    peers: list[tuple[str, Graph]] = []
    # where a pass was the only one of the chain to change anything, the chain's result is its result alone
    changed = {r.name for r in chain_reports if r.applied}
    known = _alone_in_chain(chain_reports, steps, base)
    for name in (p for p in GUARD_PEER_PASSES if not (changed <= {p} and p in chain)) if peers_wanted else ():
        skip = PASSES[name].peer_skip(source[0]) if name in PASSES and PASSES[name].peer_skip else ""
        if skip:  # a pass that cannot change this model: no child, no candidate
            reports.append(PassReport(name, False, len(base), len(base), skip))
            continue
        if name in known:  # the chain ran it on `base` itself: its result alone is known, not run again
            peer, peer_reports = known[name]
        else:
            peer, peer_reports = _prepassed(base, source, (name,), input_shapes, budget)  # a budget of its own
        reports += [replace(r, detail="; ".join(d for d in (r.detail, "a candidate the guard times (not searched "
                                                                  "from)") if d)) for r in peer_reports]
        if peer is not base:
            peers.append((f"pre-pass {name}", peer))
    return base, merged, start, reports, peers


def _alone_in_chain(chain_reports: Sequence[PassReport], steps: Sequence[Graph],
                    base: Graph) -> dict[str, tuple[Graph, list[PassReport]]]:
    """The chain's passes that ran on `base` itself (every pass before them changed nothing) and so gave what
    each gives alone: name -> (its result, its report). The chain's first pass had the whole budget, as a
    pass alone has; a later one that ran out of the chain's budget is not known (alone it has its own).
    `steps`: the result of each pass that changed the model, in order. A pass is deterministic on its input:
    on bert-base's export this saved one child (onnxruntime's transformers optimizer alone, ~60 s)."""
    known: dict[str, tuple[Graph, list[PassReport]]] = {}
    for i, r in enumerate(chain_reports):
        if r.name in known:
            break
        if r.timed_out and i > 0:
            break
        known[r.name] = (steps[0] if r.applied else base, [replace(r, detail="; ".join(
            d for d in (r.detail, "the chain's own run of it on the same input") if d))])
        if r.applied:
            break  # later passes ran on its result
    return known


# The check of the pre-passes' result before the search is coarse, so it is cheap: it looks for a slowdown
# well beyond the noise (lora_vit's 0.90x), where the guard resolves 1.5%. With the guard's own timing it took
# 39 s of a 171 s run on bert (150 ms a run); one timed run a session (runs within one vary by 1-2%, sessions
# by up to 5%: the rounds carry it): on a 1e9-parameter decoder each run takes seconds, and its starts stage
# took 341 s at 1+3 runs, 34 s of it the passes
PRE_CHECK_TIMING = {"repeats": 1, "warmup": 1}
PRE_CHECK_ROUNDS = 3  # the guard's fewest (`MIN_ROUNDS`): the slowdown it looks for is far beyond the noise


def measured_slower(graph: Graph, original: Graph, timer: CostModel, rounds: int) -> float | None:
    """`graph`'s measured speed-up over `original` where it measures slower (beyond the A/A noise), else None."""
    from xrl.cost.guard import GuardCandidate, measure_guard

    g = measure_guard(timer, original, [GuardCandidate("it", graph)], rounds=rounds, max_rounds=rounds)
    m = g.measured.get("it")  # absent where the graph is the original's computation (nothing to time)
    return m.speedup if m is not None and m.verdict == "slower" else None


def _prepassed(base: Graph, model: tuple, names: Sequence[str],
               input_shapes: Mapping[str, Sequence[int]] | None, time_limit: float | None
               ) -> tuple[Graph, list[PassReport]]:
    """The IR graph the search starts from: `model` (whose IR graph is `base`) after the pre-passes
    (`xrl.frontends.prepass`), or `base` itself when none applies."""
    out, reports, _ = _prepassed_steps(base, model, names, input_shapes, time_limit)
    return out, reports


def _prepassed_steps(base: Graph, model: tuple, names: Sequence[str],
                     input_shapes: Mapping[str, Sequence[int]] | None, time_limit: float | None
                     ) -> tuple[Graph, list[PassReport], list[Graph]]:
    """`_prepassed` (`model`: a head and its weights), and the IR graph of each accepted pass's result in order
    (the first is what that pass gives alone where the passes before it changed nothing: `_alone_in_chain`)."""
    if not names:
        return base, [], []
    from xrl.frontends.onnx_io import from_onnx
    from xrl.frontends.prepass import run_prepasses_on_head

    imported: dict[int, Graph] = {}  # each accepted pass's model is imported once, by the check
    steps: list[Graph] = []

    def importable(m, weights) -> None:  # noqa: ANN001 - a head and its weights
        imported[id(m)] = from_onnx(m, input_shapes, name=base.name, external=weights).validate()
        steps.append(imported[id(m)])

    head, weights = model
    out, _, reports = run_prepasses_on_head(head, weights, names, check=importable, time_limit=time_limit)
    if not any(r.applied for r in reports):
        return base, reports, []
    # a checked model is not applied only where it failed the check: its import raised, so `steps` lacks it
    return imported[id(out)], reports, steps[:1]
