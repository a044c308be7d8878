"""Numerical verification under onnxruntime: does a rewritten model compute what the original does?

`compare_models` runs both models on the same random inputs and checks every output, by position,
against |candidate - reference| <= atol + rtol * max|reference| (per output). Scaling by the output's
largest magnitude lets float32 reassociation after a rewrite pass while a wrong result fails; integer
and boolean outputs must match exactly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import helper

from xrl.errors import ConfigError, DynamicShapeError, VerificationError
from xrl.frontends.onnx_fold import DTYPE_TO_ONNX, dims_of
from xrl.frontends.onnx_io import brief_error, to_onnx
from xrl.frontends.onnx_weights import in_memory, split_model, trim_heap
from xrl.ir import Graph
from xrl.quiet import quiet_onnxruntime

# Integer inputs not read as Gather indices draw from [0, 2): valid as an index into any non-empty
# axis of size >= 2, and as a 0/1 mask.
_DEFAULT_INDEX_BOUND = 2


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    max_abs_err: float
    max_rel_err: float  # max |diff| / max |reference|, over outputs
    trials: int  # trials run (fewer than asked when one failed)
    detail: str


@dataclass(frozen=True)
class InputSpec:
    """What a random feed for one input must look like (None: a dim the model leaves open)."""

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype
    index_bound: int = _DEFAULT_INDEX_BOUND  # integer inputs draw from [0, index_bound)


# ----- inputs ----------------------------------------------------------------------------------
def input_specs(model_or_graph: onnx.ModelProto | Graph) -> list[InputSpec]:
    """The activation inputs of a model or graph, in order (weights listed as inputs excluded)."""
    if isinstance(model_or_graph, Graph):
        return _graph_specs(model_or_graph)
    return _model_specs(model_or_graph)


def _graph_specs(graph: Graph) -> list[InputSpec]:
    specs = []
    for v in graph.inputs:
        t = graph.type_of(v)
        bounds = [graph.type_of(n.inputs[0]).shape[n.attr("axis", 0)] for n in graph.consumers.get(v, ())
                  if n.op in ("Gather", "GatherElements") and n.domain == "" and len(n.inputs) > 1
                  and n.inputs[1] == v]
        specs.append(InputSpec(v, t.shape, helper.tensor_dtype_to_np_dtype(DTYPE_TO_ONNX[t.dtype]),
                               _index_bound(bounds)))
    return specs


def _model_specs(model: onnx.ModelProto) -> list[InputSpec]:
    g = model.graph
    weights = {t.name for t in g.initializer}
    shapes: dict[str, list] = {t.name: list(t.dims) for t in g.initializer}
    for v in (*g.input, *g.value_info, *g.output):
        dims = dims_of(v.type)
        if dims is not None:
            shapes.setdefault(v.name, dims)
    specs = []
    for v in g.input:
        if v.name in weights:
            continue
        if v.type.WhichOneof("value") != "tensor_type":
            raise VerificationError(f"input {v.name!r} is not a tensor; only tensor inputs can be fed")
        dims = dims_of(v.type) or []
        bounds = []
        for n in g.node:
            if n.op_type in ("Gather", "GatherElements") and len(n.input) > 1 and n.input[1] == v.name:
                axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
                data = shapes.get(n.input[0])
                if data and -len(data) <= axis < len(data) and isinstance(data[axis], int):
                    bounds.append(data[axis])
        specs.append(InputSpec(v.name, tuple(d if isinstance(d, int) else None for d in dims),
                               helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type), _index_bound(bounds)))
    return specs


def _index_bound(bounds: Sequence[int]) -> int:
    return max(1, min(bounds)) if bounds else _DEFAULT_INDEX_BOUND


def make_feeds(specs: Sequence[InputSpec], seed: int) -> dict[str, np.ndarray]:
    """Random values for `specs`: floats ~ N(0, 1), integers in [0, index_bound), bools 50/50."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for s in specs:
        if any(d is None for d in s.shape):
            dims = ", ".join("?" if d is None else str(d) for d in s.shape)
            raise DynamicShapeError(f"input {s.name!r} has dynamic shape ({dims}); random inputs need static "
                                    f"shapes (import with --input-shape {s.name}=...)")
        shape = tuple(int(d) for d in s.shape)  # type: ignore[arg-type]
        if s.dtype == np.bool_:
            value = rng.random(shape) < 0.5
        elif s.dtype.kind in "iu":
            value = rng.integers(0, s.index_bound, size=shape).astype(s.dtype)
        elif s.dtype.kind in "fV":  # "V": ml_dtypes' bfloat16
            value = rng.standard_normal(shape).astype(s.dtype)
        else:
            raise VerificationError(f"input {s.name!r} has dtype {s.dtype}, which random inputs do not cover")
        feeds[s.name] = np.asarray(value)  # a 0-d comparison gives a numpy scalar, which onnxruntime refuses
    return feeds


def random_feeds(model_or_graph: onnx.ModelProto | Graph, seed: int) -> dict[str, np.ndarray]:
    """Reproducible random inputs for a model or graph (see `make_feeds`); integer inputs that feed
    a Gather as indices stay inside the gathered axis."""
    return make_feeds(input_specs(model_or_graph), seed)


# ----- running ---------------------------------------------------------------------------------
def _session(model: onnx.ModelProto | Graph, providers: Sequence[str] | None, role: str = "model",
             external: Mapping[str, np.ndarray] | None = None):
    """An onnxruntime session for verification: a few runs on random inputs. `model` is a full model, a
    head with its weights in `external` (`to_onnx(..., external=...)`), or an IR graph."""
    import onnxruntime as ort

    quiet_onnxruntime()
    so = ort.SessionOptions()
    so.intra_op_num_threads = os.cpu_count() or 1
    so.log_severity_level = 4  # fatal only: a kernel that fails reaches us as the exception, not a log line
    # a few runs on random inputs: packing the weights ahead of them would hold a second copy of every
    # MatMul's and Conv's weights for the session's life, for no gain
    so.add_session_config_entry("session.disable_prepacking", "1")
    providers = list(providers) if providers else ["CPUExecutionProvider"]
    if isinstance(model, Graph):
        external = {}
        model = to_onnx(model, external=external)
    try:
        return open_session(model, so, providers, external)
    except Exception as e:
        foreign = _foreign_nodes(model)
        if foreign:  # say which op it is, not just onnxruntime's "not a registered function/op"
            names = ", ".join(f"node {n.name!r} is op {n.op_type!r} of domain {n.domain!r}" for n in foreign[:3])
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            raise VerificationError(f"onnxruntime cannot run the {role} {model.graph.name!r}: {names}{more}, which "
                                    f"onnxruntime does not implement, so xrl cannot verify it "
                                    f"({brief_error(e)})") from e
        raise VerificationError(f"onnxruntime cannot load the {role} {model.graph.name!r} ({brief_error(e)})") from e


def open_session(model: onnx.ModelProto, so, providers: Sequence[str],  # noqa: ANN001 - SessionOptions
                 external: Mapping[str, np.ndarray] | None = None, like: Mapping[str, np.ndarray] | None = None):
    """An onnxruntime session of `model` that costs one copy of its weights, the session's own: the
    model goes to onnxruntime as a head without its big weights, and the weights as arrays onnxruntime
    copies once (`SessionOptions.add_external_initializers`). A full model is split first, each weight
    read from it (or, where its bytes equal the array `like` holds under its name, that array); a head
    comes with its `external` arrays. Serialising the whole model instead held its bytes three times
    while onnxruntime parsed them (the bytes, onnxruntime's copy of the protobuf, its tensors), and past
    protobuf's 2 GiB needed a temporary file."""
    import onnxruntime as ort

    if external is None and not any(in_memory(t) for t in model.graph.initializer):
        model, external = split_model(model, like)
    names = [t.name for t in model.graph.initializer if in_memory(t)]
    missing = [k for k in names if k not in (external or {})]
    if missing:
        raise VerificationError(f"weight {missing[0]!r} of {model.graph.name!r} is kept apart and was not given")
    if names:
        # onnxruntime wraps each array (no copy, read-only ones too) and copies it into the session once
        so.add_external_initializers(names, [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(external[k]))
                                             for k in names])
    data = model.SerializeToString()  # the head: no big weights
    session = ort.InferenceSession(data, so, providers=list(providers))
    del data, model, external
    trim_heap()
    return session


# Domains onnxruntime's CPU build implements; a node of any other (xla, a custom one) cannot run.
_ORT_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc"})


def _foreign_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain not in _ORT_DOMAINS]


def _run(session, feeds: Mapping[str, np.ndarray], role: str) -> list[np.ndarray]:
    names = [i.name for i in session.get_inputs()]
    missing = [n for n in names if n not in feeds]
    if missing:
        raise VerificationError(f"no value given for input(s) {', '.join(missing)} of the {role}")
    try:
        return [np.asarray(o) for o in session.run(None, {n: feeds[n] for n in names})]
    except Exception as e:
        raise VerificationError(f"onnxruntime failed running the {role} ({brief_error(e)})") from e


def run_onnx(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *,
             providers: Sequence[str] | None = None) -> list[np.ndarray]:
    """Run `model` under onnxruntime (CPU unless `providers` says otherwise); outputs in graph order.
    Feeds the model does not take are ignored."""
    return _run(_session(model, providers), feeds, "model")


# ----- comparing -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReferenceRun:
    """The original's outputs on the verification inputs, taken once (`reference_run`): every candidate
    is compared with these, so the original's model need not be kept (nor a session of it made again)."""

    specs: tuple[InputSpec, ...]  # the inputs, shapes fixed
    outputs: tuple[tuple[np.ndarray, ...], ...]  # per trial, the reference's outputs in order
    names: tuple[str, ...]  # the reference's output names
    seed: int

    @property
    def trials(self) -> int:
        return len(self.outputs)


def reference_run(reference: onnx.ModelProto, *, like: onnx.ModelProto | Graph | None = None, seed: int = 0,
                  trials: int = 2, external: Mapping[str, np.ndarray] | None = None,
                  weights: Mapping[str, np.ndarray] | None = None) -> ReferenceRun:
    """Run `reference` on `trials` random input sets (seeds seed, seed+1, ...) and keep its outputs. Dims the
    reference leaves dynamic take the sizes `like` gives them (the model as imported: every candidate
    has its inputs); integer inputs stay inside both models' gathered axes. `external`: the reference's
    weights if it is a head; `weights`: arrays equal to some of its weights (the IR's), used instead of a
    copy where their bytes are the same."""
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        # no trial would compare nothing, and comparing nothing must never read as a pass
        raise ConfigError(f"verification needs at least 1 trial (verify_trials), not {trials!r}")
    specs, problem = _joint_specs(reference, like if like is not None else reference)
    if problem:
        raise VerificationError(f"the model as imported does not take the original's inputs: {problem}")
    session = _session_of(reference, "reference", external, weights)
    outputs = tuple(tuple(_run(session, make_feeds(specs, seed + t), "reference")) for t in range(trials))
    names = tuple(o.name for o in reference.graph.output)
    del session
    trim_heap()
    return ReferenceRun(tuple(specs), outputs, names, seed)


def _session_of(model: onnx.ModelProto | Graph, role: str, external: Mapping[str, np.ndarray] | None = None,
                weights: Mapping[str, np.ndarray] | None = None):
    if weights is not None and external is None and isinstance(model, onnx.ModelProto) \
            and not any(in_memory(t) for t in model.graph.initializer):
        model, external = split_model(model, weights)
    return _session(model, None, role, external)


def compare_to(ref: ReferenceRun, candidate: onnx.ModelProto | Graph, *, external: Mapping[str, np.ndarray] | None
               = None, rtol: float = 1e-3, atol: float = 1e-4, trials: int | None = None) -> VerifyResult:
    """Compare `candidate` (a model, a head with its `external` weights, or an IR graph) with the
    reference's stored outputs, on the same inputs; `trials` (None: all stored) limits how many."""
    inf = float("inf")
    cand_specs = {s.name: s for s in input_specs(candidate)}
    for s in ref.specs:
        c = cand_specs.pop(s.name, None)
        if c is None:
            return VerifyResult(False, inf, inf, 0, f"inputs differ: candidate lacks {s.name!r}")
        if c.dtype != s.dtype:
            return VerifyResult(False, inf, inf, 0,
                                f"input {s.name!r} is {c.dtype} in the candidate but {s.dtype} in the reference")
        if len(c.shape) != len(s.shape) or any(a is not None and a != b for a, b in zip(c.shape, s.shape)):
            return VerifyResult(False, inf, inf, 0,
                                f"input {s.name!r} has shape {c.shape} in the candidate but {s.shape} in the reference")
        if c.index_bound < s.index_bound:
            return VerifyResult(False, inf, inf, 0, f"input {s.name!r} indexes an axis of {c.index_bound} in the "
                                f"candidate, {s.index_bound} in the reference")
    if cand_specs:
        return VerifyResult(False, inf, inf, 0, f"inputs differ: candidate has extra {sorted(cand_specs)}")
    try:
        cand_session = _session_of(candidate, "candidate", external)
    except VerificationError as e:
        return VerifyResult(False, inf, inf, 0, str(e))
    n = ref.trials if trials is None else min(trials, ref.trials)
    if n < 1 or not ref.names:  # comparing nothing is a failure, never a pass
        what = "no output" if not ref.names else f"{n} trials"
        return VerifyResult(False, inf, inf, 0, f"nothing was compared ({what}): verification needs at least one "
                                                f"output and one trial")
    max_abs = max_rel = 0.0
    for t, ref_out in enumerate(ref.outputs[:n]):
        feeds = make_feeds(ref.specs, ref.seed + t)
        try:
            cand_out = _run(cand_session, feeds, "candidate")
        except VerificationError as e:
            return VerifyResult(False, inf, inf, t + 1, str(e))
        if len(cand_out) != len(ref_out):
            return VerifyResult(False, inf, inf, t + 1,
                                f"candidate has {len(cand_out)} outputs, reference {len(ref_out)}")
        for i, (r, c) in enumerate(zip(ref_out, cand_out)):
            why, abs_err, rel_err = compare_arrays(r, c, rtol=rtol, atol=atol)
            max_abs, max_rel = max(max_abs, abs_err), max(max_rel, rel_err)
            if why:
                return VerifyResult(False, max_abs, max_rel, t + 1,
                                    f"output {i} ({ref.names[i]!r}), trial {t}: {why}")
    return VerifyResult(True, max_abs, max_rel, n,
                        f"{len(ref.names)} output(s) agree over {n} trial(s): max |diff| {max_abs:.3g}, "
                        f"max relative {max_rel:.3g} (rtol {rtol:g}, atol {atol:g})")


def compare_models(reference: onnx.ModelProto | ReferenceRun, candidate: onnx.ModelProto | Graph, *, seed: int = 0,
                   trials: int | None = None, rtol: float = 1e-3, atol: float = 1e-4,
                   external: Mapping[str, np.ndarray] | None = None) -> VerifyResult:
    """Run both models on `trials` (None: 2) random input sets (seeds seed, seed+1, ...) and compare outputs
    by position. Dims the reference leaves dynamic take the candidate's sizes.

    `reference` may be the original's outputs taken once (`reference_run`: its inputs, seed and trials;
    `trials` then limits how many of them are compared), and `candidate` a head with its weights in
    `external`, or an IR graph (see `compare_to`)."""
    if isinstance(reference, ReferenceRun):
        return compare_to(reference, candidate, external=external, rtol=rtol, atol=atol, trials=trials)
    trials = 2 if trials is None else trials
    inf = float("inf")
    if trials < 1 or not reference.graph.output:  # comparing nothing is a failure, never a pass
        return VerifyResult(False, inf, inf, 0, f"nothing was compared ({trials} trials, "
                                                f"{len(reference.graph.output)} outputs)")
    specs, problem = _joint_specs(reference, candidate)  # a head's tensors keep their dims: its inputs read alike
    if problem:
        return VerifyResult(False, inf, inf, 0, problem)
    # One session at a time: each holds a copy of its model's weights, so the reference's outputs for every
    # trial are taken, and its session dropped, before the candidate's session is made. Outputs are small;
    # weights are what a session costs.
    ref_session = _session(reference, None, "reference")
    ref = ReferenceRun(tuple(specs), tuple(tuple(_run(ref_session, make_feeds(specs, seed + t), "reference"))
                                           for t in range(trials)),
                       tuple(o.name for o in reference.graph.output), seed)
    del ref_session
    trim_heap()
    return compare_to(ref, candidate, external=external, rtol=rtol, atol=atol)


def _joint_specs(reference: onnx.ModelProto, candidate: onnx.ModelProto) -> tuple[list[InputSpec], str]:
    ref, cand = input_specs(reference), {s.name: s for s in input_specs(candidate)}
    missing = [s.name for s in ref if s.name not in cand]
    extra = sorted(set(cand) - {s.name for s in ref})
    if missing or extra:
        return [], (f"inputs differ: candidate lacks {missing or 'none'}, has extra {extra or 'none'}")
    specs = []
    for s in ref:
        c = cand[s.name]
        if c.dtype != s.dtype:
            return [], f"input {s.name!r} is {c.dtype} in the candidate but {s.dtype} in the reference"
        if len(c.shape) != len(s.shape) or any(a is not None and b is not None and a != b
                                               for a, b in zip(s.shape, c.shape)):
            return [], f"input {s.name!r} has shape {c.shape} in the candidate but {s.shape} in the reference"
        shape = tuple(a if a is not None else b for a, b in zip(s.shape, c.shape))
        specs.append(replace(s, shape=shape, index_bound=min(s.index_bound, c.index_bound)))
    return specs, ""


def compare_arrays(ref: np.ndarray, cand: np.ndarray, *, rtol: float, atol: float) -> tuple[str, float, float]:
    """(problem or "", max |diff|, max |diff| / max |ref|) for one output."""
    inf = float("inf")
    if ref.shape != cand.shape:
        return f"shape {cand.shape} differs from the reference's {ref.shape}", inf, inf
    if ref.dtype != cand.dtype:
        return f"dtype {cand.dtype} differs from the reference's {ref.dtype}", inf, inf
    r, c = ref.astype(np.float64), cand.astype(np.float64)
    nan_r = np.isnan(r)
    if (nan_r != np.isnan(c)).any():
        return "NaN where the reference has none, or the reverse", inf, inf
    with np.errstate(invalid="ignore"):
        diff = np.where((r == c) | nan_r, 0.0, np.abs(r - c))  # equal infinities and NaNs agree
    err = float(diff.max()) if diff.size else 0.0
    finite = np.abs(r[np.isfinite(r)])
    scale = float(finite.max()) if finite.size else 0.0
    rel = err / scale if scale > 0 else (0.0 if err == 0 else inf)
    exact = ref.dtype.kind in "biu"
    tol = 0.0 if exact else atol + rtol * scale
    if err > tol:
        bound = "exact match needed" if exact else f"atol {atol:g} + rtol {rtol:g} x max|ref| {scale:.3g}"
        return f"max |diff| {err:.3g} > tolerance {tol:.3g} ({bound})", err, rel
    return "", err, rel
