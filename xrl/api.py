"""The Python API that the CLI wraps: load, cost, optimise, verify, write.

`optimize` is the deployment path: Graph -> search -> best Graph -> verify against the original under
onnxruntime -> ONNX out. Nothing is written unless verification passes, and the
file appears atomically.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from xrl.deploy.candidates import guard_candidates, roofline_label
from xrl.deploy.clock import StageClock

# GUARD_ENV and measure_model: re-exported for the API's users (scripts import measure_model from here)
from xrl.deploy.deployment import GUARD_ENV, deployment, measure_model  # noqa: F401
from xrl.deploy.guard import Written, guard_stage, measured_of
from xrl.deploy.search import SEARCH_WITHOUT_PREPASSES, search_stage  # noqa: F401 - the guard's label
from xrl.deploy.starts import starts
from xrl.errors import ConfigError, OutputPathError, XrlError
from xrl.frontends.loader import LoadedModel, load_model
from xrl.ir import Graph
from xrl.rewrite.rules import with_rule_set
from xrl.search.registry import get_search, register_search, run_search

if TYPE_CHECKING:
    from xrl.cost.guard import GuardResult, OriginalMeasurement
    from xrl.cost.speedup import MeasuredSpeedup
    from xrl.frontends.prepass import PassReport

# register_search and run_search are re-exported for the API's users (docs/architecture.md); they and the
# table of searches live in xrl.search.registry
__all__ = ["OptimizeResult", "as_loaded", "check_output_path", "check_search_options", "measure_model", "optimize",
           "register_search", "run_search"]

# --measure: alternating rounds are added up to this many while the speed-up's interval is wider than +-1.5%
MEASURE_MAX_ROUNDS = 20


@dataclass
class OptimizeResult:
    input: str
    search: str
    cost_model: str
    original_cost: float
    optimized_cost: float
    speedup: float
    rewrites: int
    time_s: float
    verified: bool
    max_abs_err: float
    output: str | None
    original_nodes: int = 0  # nodes of the model as given (the user's file)
    optimized_nodes: int = 0  # nodes of the file written (or that would be written)
    target: str = ""
    threads: int | None = 1  # the onnxruntime intra-op threads it was optimised and measured for (None: all)
    estimate: bool = True  # the costs are estimates (an analytic model), not timings
    prepasses: list[PassReport] = field(default_factory=list)  # each pre-pass's report, and the deployment's notes
    steps: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    # The written file against the original, measured (by the guard or --measure); None: unmeasured
    measured: MeasuredSpeedup | OriginalMeasurement | None = None
    # The measured guard (`xrl.cost.guard`): what it timed, what it chose and why; None when it did not run
    guard: GuardResult | None = None
    cost_report: dict[str, Any] | None = None  # the measured kernel cost's cache hits and measuring time
    # Target paper only: the estimate of the searched graph, whose fused kernels the written file cannot
    # express (the figure TASO, Tensat and X-RLflow report); `speedup` is the file's
    searched_speedup: float | None = None
    # wall seconds of each stage of `optimize` (deployment, starts, search, candidates, guard, measure, write)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # What was or would be written: a full model, or a head and its weights (`to_onnx(..., external=...)`),
    # made into the full model on first access of `model`: a run that only writes its file (the CLI)
    # never holds the whole optimised model in memory
    written_model: Any = field(default=None, repr=False, compare=False)

    @property
    def model(self) -> onnx.ModelProto | None:
        """The optimised model itself (what was or would be written), for callers that keep it in memory."""
        if isinstance(self.written_model, tuple):
            from xrl.frontends.onnx_weights import materialize

            self.written_model = materialize(*self.written_model)
        return self.written_model

    @property
    def measured_speedup(self) -> float | None:
        return self.measured.speedup if self.measured is not None else None

    @property
    def measured_interval(self) -> list[float] | None:
        return list(self.measured.interval) if self.measured is not None else None

    @property
    def verdict(self) -> str | None:
        """faster | slower | within noise | too noisy to tell; None: unmeasured."""
        return self.measured.verdict if self.measured is not None else None

    def to_json(self) -> dict[str, Any]:
        """The one flat form (--json): the typed reports as their own `to_json()`s."""
        typed = {"prepasses": [p.to_json() for p in self.prepasses],
                 "measured": self.measured.to_json() if self.measured is not None else None,
                 "guard": self.guard.to_json() if self.guard is not None else None,
                 "measured_speedup": self.measured_speedup, "measured_interval": self.measured_interval,
                 "verdict": self.verdict}
        # field by field: asdict would deep-copy the model, weights and all, only to drop it
        plain = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)
                 if f.name != "written_model" and f.name not in typed}
        return {**plain, **typed}


def check_output_path(output: str | Path, source: Path | None, *, force: bool) -> Path:
    """Refuse an output path that would overwrite the input or (without force) any existing file."""
    out = Path(output)
    if out.suffix.lower() != ".onnx":
        raise OutputPathError(f"output {out} must end in .onnx")
    if source is not None and out.exists() and out.resolve() == source.resolve():
        raise OutputPathError(f"output {out} is the input model; choose another path (xrl never overwrites its input)")
    if out.exists() and not force:
        raise OutputPathError(f"output {out} exists; pass --force to replace it, or choose another path")
    if out.exists() and out.is_dir():
        raise OutputPathError(f"output {out} is a directory")
    if not out.parent.exists():
        raise OutputPathError(f"output directory {out.parent} does not exist")
    return out


def check_threads(threads: int | None) -> None:
    """`threads` is a count of at least one, or None (one per core)."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads must be a whole number of at least 1, or None for one per core; not {threads!r}")


def check_search_options(search: str, prepass: str | Sequence[str] | None = None, target: str | None = None,
                         cost: str | None = None) -> None:
    """Reject an unknown search, pre-pass, target or cost name before any model is loaded."""
    from xrl.cost import COST_MODELS, TARGETS
    from xrl.frontends.prepass import PREPASSES

    get_search(search)  # ConfigError naming every registered search
    names = prepass.split(",") if isinstance(prepass, str) else list(prepass or ())
    unknown = [p for p in names if p and p != "none" and p not in PREPASSES]
    if unknown:
        raise ConfigError(f"unknown pre-pass {unknown[0]!r}; choose from: {', '.join(PREPASSES)} (or none)")
    if target not in (None, "auto") and target not in TARGETS:
        raise ConfigError(f"unknown target {target!r}; choose one of: {', '.join(TARGETS)}")
    if cost is not None and cost not in COST_MODELS:
        raise ConfigError(f"unknown cost model {cost!r}; choose one of: {', '.join(COST_MODELS)}")


def as_loaded(model: str | LoadedModel | onnx.ModelProto | Graph, *, input_shapes=None,  # noqa: ANN001
              seed: int = 0) -> LoadedModel:
    """What `optimize` takes: a path or built-in name, an `onnx.ModelProto` in memory, or an xrl Graph."""
    from xrl.frontends.onnx_io import from_onnx, to_onnx

    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, onnx.ModelProto):
        return LoadedModel(from_onnx(model, input_shapes, name=model.graph.name or "model"), model,
                           f"<ModelProto {model.graph.name or 'model'}>", "onnx")
    if isinstance(model, Graph):
        return LoadedModel(model, None, f"<Graph {model.name}>", "graph", reload=lambda: to_onnx(model))
    if isinstance(model, (str, Path)):
        return load_model(str(model), input_shapes=input_shapes, seed=seed)
    raise XrlError(f"optimize takes a path, a built-in graph name, an onnx.ModelProto or an xrl Graph, "
                   f"not {type(model).__name__}")


@with_rule_set  # `rules` names the rule set every search and exact merge of the call loads (xrl.rewrite.rules)
def optimize(model: str | LoadedModel | onnx.ModelProto | Graph, *, output: str | Path | None = None,
             search: str = "greedy",
             cost: str = "target", device: str | None = None, target: str | None = None,
             prepass: Sequence[str] | None = None, seed: int = 0, steps: int | None = None,
             time_limit: float | None = None, input_shapes: Mapping[str, Sequence[int]] | None = None,
             force: bool = False, verify_trials: int = 2, search_options: Mapping[str, Any] | None = None,
             cost_options: Mapping[str, Any] | None = None, measure: str | None = None,
             measure_options: Mapping[str, Any] | None = None, measure_rounds: int = 6,
             guard: bool | None = None, guard_options: Mapping[str, Any] | None = None,
             threads: int | None = 1, rules: str = "all") -> OptimizeResult:
    """Optimise a model for `target` (None: this machine's default) and (with `output`) write the
    verified result as ONNX.

    The pipeline: the target's pre-passes (`prepass`, None: the target's own; () for none) run on
    the model, xrl's search runs from their result under `cost` ("target": the estimate of the
    kernels the target's runtime runs), and the written file is what is reported: its node count,
    and its cost as re-imported from the exported ONNX. If the pre-passes' result is estimated more
    than `xrl.deploy.starts.PREPASS_TOLERANCE` slower than the original, or fails verification, the
    search starts from the original instead.

    With `measure` (an e2e engine: "auto", "ort" or "torch"), the original and the optimised graph
    are also timed end to end on this machine, in alternating rounds (`xrl.cost.speedup`), and the
    measured speed-up with its verdict is returned in `measured`. `measure_options` go to
    `measure_model` (repeats, warmup, threads).

    `guard` (None: on for onnxruntime targets whose runtime is on this machine, unless $XRL_GUARD is 0):
    before writing, the original, the pre-passes' result and the search's best are timed end to end
    in alternating rounds with an A/A control (`xrl.cost.guard`), and the fastest that does not measure
    slower than the original is written; the original itself when every candidate measures slower.
    Its measurement of the written file is `measured` (no second timing is taken for `measure`).

    `threads`: the onnxruntime intra-op threads the model will run with (1, the default; None: one per
    core, a plain InferenceSession's default). The measured kernel costs, the guard and `measure` time at
    it: which rewrite pays depends on it (a fused attention kernel that loses on one thread can win on
    all of them), so a model optimised for one thread count is measured at that count.

    `rules`: the rule set searched ("all", the default; "elementary", "composite", a rule file's stem, or
    several joined with "+"; `xrl.rewrite.rules`)."""
    from xrl.options import check_optimize_options

    prepass = check_optimize_options(locals())  # every option, one ConfigError line, before any model is loaded
    from xrl.frontends.onnx_write import save_onnx

    check_search_options(search, prepass, target, cost)
    check_threads(threads)
    clock = StageClock()
    done = clock.done
    loaded = as_loaded(model, input_shapes=input_shapes, seed=seed)
    out_path = check_output_path(output, loaded.path, force=force) if output is not None else None
    dep = deployment(cost, device=device, target=target, threads=threads, cost_options=cost_options, guard=guard,
                     measure_options=measure_options)
    tgt, cost_model, guarded = dep.target, dep.cost_model, dep.guarded
    original_cost = cost_model.cost(loaded.graph)
    done("deployment")
    t0 = time.perf_counter()
    st = starts(loaded, dep, tgt.prepasses if prepass is None else tuple(prepass), peers_wanted=prepass is None,
                input_shapes=input_shapes, time_limit=time_limit, seed=seed, verify_trials=verify_trials)
    done("starts")
    sr = search_stage(search, st, dep, seed=seed, steps=steps, time_limit=time_limit, options=search_options,
                      began=t0, name=loaded.graph.name)
    elapsed = time.perf_counter() - t0
    done("search")
    # The research target's fused kernels exist only in the IR (export lowers them back to plain ops):
    # its estimate of the searched graph is reported beside the file's, as `searched_speedup`.
    optimized_cost = cost_model.cost(sr.result.written)
    searched_cost = cost_model.cost(sr.result.graph) if tgt.runtime != "onnxruntime" else None
    w = Written.of(sr.result, sr.max_abs_err)
    if guarded:
        candidates = guard_candidates(search, st, sr, dep, seed=seed, steps=steps)
        done("candidates")
        opts = {"rounds": measure_rounds, "max_rounds": max(measure_rounds, MEASURE_MAX_ROUNDS),
                **dict(guard_options or {})}
        w = guard_stage(loaded, st, candidates, dep, options=opts, original_cost=original_cost,
                        max_abs_err=sr.max_abs_err)
        if w.note is not None:
            st.reports.append(w.note)
        optimized_cost = cost_model.cost(w.written)
        del candidates
        done("guard")
    measured = measured_of(w, loaded, dep, measure, rounds=measure_rounds,
                           max_rounds=max(measure_rounds, MEASURE_MAX_ROUNDS))
    if measure is not None and w.guard is None:
        done("measure")
    if out_path is not None:
        save_onnx(w.head, out_path, w.weights)  # written from the arrays: no serialised copy in memory
    report = cost_model.report()
    done("write")
    return OptimizeResult(
        input=loaded.source, search=search, cost_model=f"{cost_model.describe()}", original_cost=original_cost,
        optimized_cost=optimized_cost, speedup=original_cost / optimized_cost if optimized_cost > 0 else float("nan"),
        rewrites=len(w.steps), time_s=elapsed, verified=True, max_abs_err=w.max_abs_err,
        output=str(out_path) if out_path else None, original_nodes=st.original_nodes,
        optimized_nodes=len(w.head.graph.node), steps=w.steps, details=sr.details, measured=measured,
        target=tgt.name, threads=threads, estimate=not cost_model.measured, prepasses=st.reports, guard=w.guard,
        cost_report=report, stage_seconds=clock.seconds,
        written_model=(w.head, w.weights) if w.weights else w.head,
        searched_speedup=original_cost / searched_cost if searched_cost else None)


ROOFLINE_LABEL = roofline_label("greedy")  # the default search's
