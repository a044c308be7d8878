"""The research benchmark (issue 32, item 2): graphs whose best rewrite sequence needs foresight under the
elementary rules, split by family, each with its reference optimum.

    from xrl.search import suite
    graphs = suite.suite_graphs("train")           # SuiteGraph: name, family, split, source
    g = graphs[0].build()                          # an xrl.ir.Graph (generated or built-in)
    refs = suite.load_references()                 # name -> Reference (graphs/research_suite.json)
    cost, engine = suite.cost_model(), suite.engine()   # paper's analytic cost, the elementary rules
    suite.gain_share(refs[g.name], some_cost)      # the share of the reference's cost reduction reached

The setting is fixed, so that every result on the suite is comparable: the research target `paper` (TASO's
and X-RLflow's per-op analytic estimate of an H100; deterministic and fast, so searches spend their budget
searching rather than timing), the `elementary` rule set (`xrl.rewrite.rules`: no composite does a sequence's
work in one step), float32 graphs at batch 1. Families never straddle splits: a policy is validated and tested
on kinds of graph it never trained on.

The graphs: small and full-size family members (`xrl.graphs.families`), the NAS cells of TASO's suite, the
hand-built LoRA graphs of the headroom suite, and seeded generated conflict graphs (`xrl.graphs.conflicts`).
References are recomputed by `experiments/research_suite_refs.py` and stored with each graph's content hash:
a graph whose builder changed no longer matches its reference (`Reference.matches`), and `xrl bench` says so.
`run_bench` runs a search (or `--search rl` with a policy) on a split at a fixed budget and verifies every result
with the IR's reference executor.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xrl.errors import ConfigError
from xrl.ir import Graph
from xrl.search.budget import CallBudget

COST = "target"
TARGET = "paper"
RULES = "elementary"
SPLITS = ("train", "validation", "held-out")
REFERENCE_FILE = "research_suite.json"

# family -> (split, graph sources). A source is a built-in graph name (`xrl graphs list`) or `gen:<kind>:<seed>`.
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    # train: LoRA merges that greedy closes off, parallel sums, ACNet/MobileOne branches, a NAS cell
    "gen_lora_trap": ("train", tuple(f"gen:gen_lora_trap:{s}" for s in range(6))),
    "gen_sum_trap": ("train", tuple(f"gen:gen_sum_trap:{s}" for s in range(6))),
    "lora_encoder": ("train", ("fam_lora_encoder_ts", "fam_lora_encoder_dynamo", "fam_lora_encoder_full_ts")),
    "lora_decoder": ("train", ("fam_lora_decoder_ts", "fam_lora_decoder_dynamo")),
    "acnet": ("train", ("fam_acnet_ts", "fam_acnet_dynamo", "fam_acnet_full_ts")),
    "mobileone": ("train", ("fam_mobileone_ts", "fam_mobileone_dynamo")),
    "lora_headroom": ("train", ("lora_tiny", "lora_mlp", "lora_ffn", "lora_qkv", "multi_lora")),
    "nasnet": ("train", ("nasnet_a",)),
    # validation
    "gen_mixed": ("validation", tuple(f"gen:gen_mixed:{s}" for s in range(4))),
    "dbb": ("validation", ("fam_dbb_ts", "fam_dbb_dynamo")),
    "nasrnn": ("validation", ("nasrnn",)),
    # held-out
    "gen_branch_trap": ("held-out", tuple(f"gen:gen_branch_trap:{s}" for s in range(6))),
    "repvgg": ("held-out", ("fam_repvgg_ts", "fam_repvgg_dynamo", "fam_repvgg_full_ts", "fam_repvgg_xl_ts")),
    "lora_vit": ("held-out", ("fam_lora_vit_ts", "fam_lora_vit_dynamo", "fam_lora_vit_full_ts")),
}


@dataclass(frozen=True)
class SuiteGraph:
    """One benchmark graph: its name (the source, with `gen:` dropped), family, split and source."""

    name: str
    family: str
    split: str
    source: str

    def build(self) -> Graph:
        """The graph (float32, batch 1, seed 0 for built-in graphs), named `name`."""
        if self.source.startswith("gen:"):
            from xrl.frontends.onnx_io import from_onnx
            from xrl.graphs.conflicts import conflict_graph

            _, kind, seed = self.source.split(":")
            return from_onnx(conflict_graph(kind, int(seed)), name=self.name)
        from xrl.frontends.loader import load_model

        return load_model(self.source, seed=0).graph


def _entries() -> list[SuiteGraph]:
    out = []
    for family, (split, sources) in FAMILIES.items():
        for src in sources:
            name = "_".join(src.split(":")[1:]) if src.startswith("gen:") else src
            out.append(SuiteGraph(name, family, split, src))
    return out


def check_split(split: str | None) -> str | None:
    if split is not None and split not in (*SPLITS, "all"):
        raise ConfigError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}, all")
    return None if split == "all" else split


def suite_graphs(split: str | None = "held-out", names: Iterable[str] | None = None) -> list[SuiteGraph]:
    """The suite's graphs in `split` ("train", "validation", "held-out"; None or "all": every one), in family
    order; `names` keeps only those (ConfigError for a name not in the suite)."""
    split = check_split(split)
    entries = [e for e in _entries() if split is None or e.split == split]
    if names is not None:
        wanted = list(names)
        known = {e.name for e in _entries()}
        bad = [n for n in wanted if n not in known]
        if bad:
            raise ConfigError(f"{bad[0]!r} is not a graph of the research suite; see `xrl bench --list`")
        entries = [e for e in entries if e.name in set(wanted)]
    return entries


def cost_model() -> Any:
    """The benchmark's cost model: the research target's analytic estimate (`--target paper`)."""
    from xrl.cost import get_cost_model

    return get_cost_model(COST, device="auto", target=TARGET)


def engine(**options: Any) -> Any:
    """A rewrite engine over the benchmark's rules (the verified elementary set)."""
    from xrl.rewrite import RewriteEngine, load_rules

    return RewriteEngine(load_rules(rule_set=RULES), **options)


# ----- references ------------------------------------------------------------------------------------
@dataclass
class Reference:
    """A graph's reference optimum and how it was found. Costs are the benchmark cost model's, in seconds.

    `steps` reach `cost` from the graph under the elementary rules (`rule@node,...`, replayable with
    `replay`); `method` names the search that found it (exhaustive when `exhaustive`: then it is the optimum of
    the space); `raising`, `neutral` and `non_greedy` count the steps of `steps` that raise the cost, leave it
    unchanged, or lower it but are not the best single step at their state (greedy would take another).
    `greedy_cost` is greedy search's result. `hash` is the graph's canonical hash when the reference was made."""

    name: str
    family: str
    split: str
    ops: int
    hash: str
    original_cost: float
    cost: float
    method: str
    exhaustive: bool
    steps: list[str]
    greedy_cost: float
    greedy_steps: int
    raising: int = 0
    neutral: int = 0
    non_greedy: int = 0
    candidates: dict[str, float] = field(default_factory=dict)  # method -> the cost it reached

    def matches(self, graph: Graph) -> bool:
        """Whether `graph` is the graph this reference was made for (else the builder changed: recompute it)."""
        return graph.canonical_hash == self.hash

    @property
    def gain(self) -> float:
        """The reference's speed-up over the original."""
        return self.original_cost / self.cost if self.cost > 0 else math.inf

    @property
    def greedy_share(self) -> float:
        return gain_share(self, self.greedy_cost)

    @property
    def needs_foresight(self) -> bool:
        """Greedy falls short of the reference, whose sequence has a cost-raising, neutral or non-greedy step."""
        return self.greedy_share < 0.999 and (self.raising + self.neutral + self.non_greedy) > 0


def gain_share(ref: Reference, cost: float) -> float:
    """The share of the reference's cost reduction that `cost` reaches: (c0 - cost) / (c0 - c_ref); 1 where the
    reference found nothing (a graph that cannot be improved)."""
    span = ref.original_cost - ref.cost
    if span <= ref.original_cost * 1e-9:
        return 1.0
    return (ref.original_cost - cost) / span


def reference_path() -> Path:
    from xrl import graphs

    return Path(graphs.__file__).resolve().parent / REFERENCE_FILE


def load_references(path: str | Path | None = None) -> dict[str, Reference]:
    """name -> Reference from the committed data file (ConfigError if it is missing or made in another setting)."""
    p = Path(path) if path is not None else reference_path()
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise ConfigError(f"no research-suite references at {p} ({e.strerror}); run "
                          "experiments/research_suite_refs.py") from None
    setting = (data.get("cost"), data.get("target"), data.get("rules"))
    if setting != (COST, TARGET, RULES):
        raise ConfigError(f"{p} holds references for cost {setting[0]}, target {setting[1]}, rules {setting[2]}; "
                          f"the suite is {COST}/{TARGET}/{RULES}: recompute them")
    names = {f.name for f in Reference.__dataclass_fields__.values()}
    return {r["name"]: Reference(**{k: v for k, v in r.items() if k in names}) for r in data["graphs"]}


def write_references(refs: Sequence[Reference], path: str | Path | None = None, **meta: Any) -> Path:
    from xrl.atomic import write_atomic

    p = Path(path) if path is not None else reference_path()
    data = {"cost": COST, "target": TARGET, "rules": RULES, **meta,
            "graphs": [asdict(r) for r in refs]}
    write_atomic(p, json.dumps(data, indent=1) + "\n")
    return p


# ----- replaying and analysing a sequence ----------------------------------------------------------------
def replay(graph: Graph, steps: Sequence[str], eng: Any) -> Graph:
    """`graph` after `steps` (`rule@node,...`, as search results record them); ValueError if one does not apply."""
    for s in steps:
        match = next((c for c in eng.candidates(graph) if c.step == s), None)
        if match is None:
            raise ValueError(f"step {s} does not apply")
        graph = match.graph
    return graph


def analyse(graph: Graph, steps: Sequence[str], cost: Any, eng: Any, rel: float = 1e-9) -> dict[str, int]:
    """How many of `steps` raise the cost, leave it unchanged, or lower it without being the best single step
    at their state (an ordering choice greedy would not make)."""
    out = {"raising": 0, "neutral": 0, "non_greedy": 0}
    c = cost.cost(graph)
    for s in steps:
        cands = eng.candidates(graph)
        costs = {x.step: x.delta_cost(cost, c) for x in cands}
        chosen = next(x for x in cands if x.step == s)
        new = costs[s]
        if new > c * (1 + rel):
            out["raising"] += 1
        elif new >= c * (1 - rel):
            out["neutral"] += 1
        elif new > min(costs.values()) * (1 + rel):
            out["non_greedy"] += 1
        graph, c = chosen.graph, new
    return out


def minimise(graph: Graph, steps: Sequence[str], cost: Any, eng: Any, rel: float = 1e-9) -> list[str]:
    """`steps` without the non-improving steps that the rest does not need (dropping one, the others still
    apply and reach no worse a cost), so that a needless detour is not counted as foresight. Each trial replays
    from the state before the dropped step, not from the start."""
    steps = list(steps)
    states = [graph]
    for st in steps:
        states.append(replay(states[-1], [st], eng))
    costs = [cost.cost(g) for g in states]
    target = costs[-1]
    i = 0
    while i < len(steps):
        if costs[i + 1] < costs[i] * (1 - rel):  # an improving step stays
            i += 1
            continue
        try:
            tail = [states[i]]
            for st in steps[i + 1:]:
                tail.append(replay(tail[-1], [st], eng))
            ok = cost.cost(tail[-1]) <= target * (1 + rel)
        except ValueError:
            ok = False
        if ok:
            steps = steps[:i] + steps[i + 1:]
            states = states[:i] + tail
            costs = costs[:i] + [cost.cost(g) for g in tail]
        else:
            i += 1
    return steps


def composite_guided(graph: Graph, cost: Any, eng: Any, *, time_limit: float = 60.0) -> tuple[Graph, list[str]]:
    """Greedy over all rules (the default optimisation's), each composite step replaced by its elementary route
    (`xrl.rewrite.decompose`): an elementary sequence to what the composites reach. A composite with no route
    found is skipped (the next best step is taken)."""
    from xrl.rewrite import RewriteEngine, load_rules
    from xrl.rewrite.decompose import elementary_route

    full = RewriteEngine(load_rules(rule_set="all"))
    kinds = {r.name: r.kind for r in full.rules}
    steps: list[str] = []
    c = cost.cost(graph)
    t0 = time.perf_counter()
    skip: set[str] = set()
    while time.perf_counter() - t0 < time_limit:
        ranked = sorted(((x.delta_cost(cost, c), i, x) for i, x in enumerate(full.candidates(graph))
                         if x.step not in skip), key=lambda t: t[:2])
        if not ranked or ranked[0][0] >= c * (1 - 1e-9):
            break
        new, _, best = ranked[0]
        if kinds[best.rule] == "composite":
            route = elementary_route(graph, best, eng)
            if route is None:
                skip.add(best.step)
                continue
            graph, path = route.graph, route.steps
        else:
            graph, path = best.graph, [best.step]
        steps.extend(path)
        c = cost.cost(graph)
        skip.clear()
    return graph, steps


# ----- running a method on the suite ----------------------------------------------------------------------
def outputs(graph: Graph, seed: int = 0) -> list[np.ndarray]:
    """The graph's outputs under the IR's float64 reference executor on seeded random inputs."""
    from xrl.ir.execute import execute

    rng = np.random.default_rng(seed)
    feeds = {}
    for v in graph.inputs:
        t = graph.types[v]
        feeds[v] = (rng.standard_normal(t.shape) if t.dtype.startswith("float") else np.zeros(t.shape)).astype(t.dtype)
    return execute(graph, feeds)


def verify(original: Graph, result: Graph, seed: int = 0) -> float:
    """The largest error of `result`'s outputs against `original`'s, relative to each output's largest value:
    under the IR's float64 reference executor, or, for a graph holding an op it cannot run (ViT's Gather),
    under onnxruntime (both graphs exported); inf if the outputs differ in shape or onnxruntime rejects one."""
    from xrl.ir.execute import ExecutionError

    try:
        pairs = list(zip(outputs(original, seed), outputs(result, seed), strict=True))
    except ExecutionError:
        from xrl.frontends.onnx_io import to_onnx
        from xrl.frontends.verify import compare_models

        check = compare_models(to_onnx(original), to_onnx(result), seed=seed)
        return check.max_rel_err if check.ok else math.inf
    worst = 0.0
    for a, b in pairs:
        if a.shape != b.shape:
            return math.inf
        scale = max(1.0, float(np.abs(a).max(initial=0.0)))
        worst = max(worst, float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max(initial=0.0)) / scale)
    return worst


VERIFY_TOLERANCE = 1e-4


class CallCounter(CallBudget):
    """Counts the calls made to a cost model (whole-graph costs, per-op deltas, greedy's local re-costs): a run's
    budget in cost-model calls, reported beside its seconds. The same counter as a budget's
    (`xrl.search.budget.CallBudget`) with no limit: `model` is the counting copy, `calls` the count."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner, None)


@dataclass
class BenchRow:
    graph: str
    family: str
    seed: int
    speedup: float
    share: float  # of the reference's cost reduction
    reference_gain: float
    time_s: float
    rewrites: int
    verified: bool
    max_rel_err: float
    cost_calls: int = 0
    stale: bool = False
    error: str = ""


def run_bench(method: str, *, split: str | None = "held-out", names: Iterable[str] | None = None,
              time_limit: float = 10.0, seeds: Sequence[int] = (0,), options: dict[str, Any] | None = None,
              progress: Callable[[BenchRow, int, int], None] | None = None) -> list[BenchRow]:
    """`method` (a registered search: greedy, beam, taso, rl with options {"policy": path}, ...) on every graph
    of `split` and seed, under the benchmark's cost and rules, at `time_limit` seconds each; every result verified.
    One run's failure is a row with its error, not an exception."""
    from xrl.rewrite.rules import use_rules
    from xrl.search.registry import run_search

    entries = suite_graphs(split, names)
    refs = load_references()
    cost = cost_model()
    rows: list[BenchRow] = []
    total = len(entries) * len(seeds)
    with use_rules(RULES):
        for e in entries:
            graph = e.build()
            ref = refs.get(e.name)
            stale = ref is None or not ref.matches(graph)
            c0 = cost.cost(graph)
            for seed in seeds:
                t0 = time.perf_counter()
                row = BenchRow(e.name, e.family, seed, math.nan, math.nan, ref.gain if ref else math.nan, 0.0, 0,
                               False, math.nan, stale=stale)
                counted = CallCounter(cost)
                try:
                    res = run_search(method, graph, counted.model, seed=seed, steps=None, time_limit=time_limit,
                                     options=dict(options or {}))
                    row.time_s, row.cost_calls = time.perf_counter() - t0, counted.calls
                    best = res.graph.validate()
                    c = cost.cost(best)
                    row.speedup, row.rewrites = c0 / c, len(res.steps)
                    row.share = gain_share(ref, c) if ref is not None else math.nan
                    row.max_rel_err = verify(graph, best, seed)
                    row.verified = row.max_rel_err <= VERIFY_TOLERANCE
                except Exception as ex:  # noqa: BLE001 - one run's failure must not stop the benchmark
                    row.time_s = time.perf_counter() - t0
                    row.error = f"{type(ex).__name__}: {ex}".splitlines()[0][:200]
                rows.append(row)
                if progress is not None:
                    progress(row, len(rows), total)
    return rows


def leaderboard(rows: Sequence[BenchRow], *, method: str, split: str | None, time_limit: float,
                policy: str | None = None, max_calls: int | None = None) -> dict[str, Any]:
    """One CompilerGym-style leaderboard row: what ran, on what, at what budget, and how far it got."""
    from xrl.stats import geomean

    ok = [r for r in rows if r.verified and not r.error]
    shares = [r.share for r in ok if not math.isnan(r.share)]
    return {
        "method": method, "policy": policy, "split": split or "all", "graphs": len({r.graph for r in rows}),
        "seeds": len({r.seed for r in rows}), "runs": len(rows), "budget_s": time_limit,
        "budget_calls": max_calls,
        "cost": f"{COST} ({TARGET})", "rules": RULES,
        "verified": f"{len(ok)}/{len(rows)}",
        "mean_share": float(np.mean(shares)) if shares else math.nan,
        "median_share": float(np.median(shares)) if shares else math.nan,
        "at_90pct": float(np.mean([s >= 0.9 for s in shares])) if shares else math.nan,
        "geomean_speedup": geomean([r.speedup for r in ok]) if ok else math.nan,
        "reference_geomean": geomean([r.reference_gain for r in rows if not math.isnan(r.reference_gain)])
        if rows else math.nan,
        "mean_time_s": float(np.mean([r.time_s for r in rows])) if rows else math.nan,
        "mean_cost_calls": float(np.mean([r.cost_calls for r in rows])) if rows else math.nan,
        "stale_references": sum(r.stale for r in rows),
    }
