"""Clean-up passes of well-kept libraries, run on the ONNX model before xrl's own search.

What a practitioner would run instead of xrl, xrl runs first, so its search starts from the best
the peers give and its output is never behind them (docs/architecture.md: prefer a well-kept library to code
written again):

    onnxslim          constant folding, dead-code and shape-chain removal, Pad folded into Conv, ...
    ort-transformers  onnxruntime's transformers optimizer: attention, SkipLayerNorm, (Bias)Gelu and
                      embedding fusions into the contrib ops the CPU and CUDA providers execute.
                      It needs a model type; xrl tries bert and gpt2 and keeps the one that fuses most.
    onnxscript        onnxscript's `optimize_for_ort` (the `bench` extra): RMSNorm, SkipRMSNorm, rotary
                      embedding, attention and GQA fusions into onnxruntime's contrib ops. Not in any
                      target's chain (`--prepass onnxslim,onnxscript` asks for it), but the guard times its
                      result alone (`guard_peer` in PASSES). Its output is
                      run against its input in onnxruntime before it is kept: on some models it writes a
                      node onnxruntime rejects (a MultiHeadAttention it cannot load), and such a result
                      is a dropped pass, not an error.

PASSES, after the runners below, is the one table of them: a pass's name, its runner and whether the guard
times its result alone (`xrl.deploy.starts.GUARD_PEER_PASSES` reads it); adding a pass is one row there.

Each pass is checked on its own: its output must import into the IR (`check`), or it is skipped
and the report says why; a pass that changes nothing is reported as such. What they compute is
checked once, on the final model against the user's original (`xrl.api.optimize`, which searches
again from the original when that check fails): a session per pass would double the time on
large models.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np
import onnx

CONTRIB_DOMAIN = "com.microsoft"
# the ops whose presence makes a model worth the transformers optimizer's time
_TRANSFORMER_HINTS = {"Softmax", "LayerNormalization", "ReduceMean", "Erf"}

log = logging.getLogger(__name__)


@dataclass
class PassReport:
    name: str
    applied: bool
    nodes_before: int
    nodes_after: int
    detail: str = ""
    # stopped (or never started) because the pre-passes' time limit ran out: on a quieter or faster machine
    # the pass could finish, and the result differ
    timed_out: bool = False
    seconds: float = 0.0  # its wall time, the child's start and its result's import and check included

    def to_json(self) -> dict:
        return asdict(self)


def histogram(model: onnx.ModelProto) -> Counter:
    return Counter(f"{n.domain}:{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                   for n in model.graph.node)


@contextlib.contextmanager
def _quiet():
    """The libraries print banners and log at INFO/WARNING; xrl's stdout must stay one JSON document."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


# True in a pre-pass's own process (a fork): the model there is the child's copy-on-write view of the
# parent's, which a pass may change without copying it first (the parent never sees the change)
_OWNED = False


def _onnxslim(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """onnxslim on `model` with its weights stripped (`weight_stripped`) and restored by name afterwards: its
    graph-surgeon import materialises every constant for folding and again for export, on each of its up to ten
    rounds (bert: the child's peak 7.1x the weights with them on disk). Its eliminations and shape-chain folds
    read shapes and small constants, which stay; what would read a big weight's values (a Transpose of a
    weight folded, MatMul+Add as Gemm with the weight transposed) is left to xrl's own rules and folding."""
    import onnxslim

    lite = weight_stripped(model)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in lite.graph.initializer):
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(lite, os.getcwd())  # the few small ones a child put on disk beside big ones
    with _quiet():  # the stripped copy is the pass's own: no deepcopy of it
        out = onnxslim.slim(lite)
    _restore_weights(out, model)
    return out, ""


# The name of a weight a pass left untouched: its bytes are the input's (`_restore_weights`), not a copy
RESTORED_WEIGHTS_FILE = "input.data"


def _restore_weights(out: onnx.ModelProto, model: onnx.ModelProto) -> None:
    """Put back into `out` (a pass's result on `weight_stripped(model)`) the weights stripped from `model`: each
    graph input of `out` named as a stripped weight becomes that initialiser again (an input `model` declared
    too stays declared). In a pre-pass child the bytes go from `model` to a file in the scratch folder one
    tensor at a time and `out` refers to them (the parent loads them with the result), so the child holds no
    copy of them; in process they are copied in."""
    from xrl.frontends.onnx_weights import copy_fields

    big = {t.name: t for t in model.graph.initializer if _elements(t) > _SHAPES_ONLY_ELEMENTS}
    declared = {v.name for v in model.graph.input}
    wanted = [v.name for v in out.graph.input if v.name in big]
    kept = [v for v in out.graph.input if v.name not in big or v.name in declared]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    if not wanted:
        return
    data = open(RESTORED_WEIGHTS_FILE, "wb") if _OWNED else None  # noqa: SIM115 - closed below
    try:
        for name in wanted:
            t = out.graph.initializer.add()
            src = big[name]
            if data is None or src.data_location == onnx.TensorProto.EXTERNAL or not src.HasField("raw_data"):
                t.CopyFrom(src)
                continue
            copy_fields(t, src, skip=("raw_data", "data_location", "external_data"))
            offset = data.tell()
            raw = src.raw_data  # one tensor's bytes at a time
            data.write(raw)
            _refer(t, RESTORED_WEIGHTS_FILE, offset, len(raw))
            del raw
    finally:
        if data is not None:
            data.close()


def _ort_transformers(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    ops = {n.op_type for n in model.graph.node}
    if not ops & _TRANSFORMER_HINTS:
        return model, "no attention or normalisation ops"
    if any(n.domain == CONTRIB_DOMAIN for n in model.graph.node):
        # a second run (ort targets run it before and after onnxslim) adds nothing to the first's fusions
        return model, "already fused by an earlier run"
    from onnxruntime.transformers.fusion_options import AttentionMaskFormat, FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    if _OWNED:  # the child's own model: its weights to a file, so that the optimizer's copies hold kilobytes
        _weights_to_disk(model)
    best, best_type, best_fused = model, "", 0
    # (0, 0) lets the optimizer find the head count itself; where it cannot, the heads a Reshape to
    # [batch, seq, heads, head size] names are what a user would pass it
    shapes = [(0, 0), *_head_shapes(model)]
    for model_type in ("bert", "gpt2"):
        for heads, hidden in shapes:
            if any(n.op_type == "Attention" for n in best.graph.node):
                break  # attention is fused: the other settings will not add to it
            # the mask as the model reads it: the optimizer's default (mask_index, the count of ones per row)
            # is exact only for right-padded masks, and xrl's verification feeds any 0/1 mask
            options = FusionOptions(model_type)
            options.attention_mask_format = AttentionMaskFormat.AttentionMask
            try:
                with _quiet():
                    out = optimize_model(copy.deepcopy(model), model_type=model_type, num_heads=heads,
                                         hidden_size=hidden, opt_level=0, use_gpu=False,
                                         optimization_options=options).model
            except Exception as e:  # the optimizer's fusions assert on shapes they do not expect
                log.info("ort-transformers (%s, %d heads) failed: %s", model_type, heads, e)
                continue
            fused = sum(1 for n in out.graph.node if n.domain == CONTRIB_DOMAIN)
            if fused > best_fused:
                best, best_type, best_fused = out, model_type, fused
    if not best_fused:
        return model, "no fusion applies"
    return _typed(best), f"model type {best_type}: {best_fused} fused ops"


def _refer(t: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Make `t` an external-data tensor whose bytes are at `offset` in the file `location` (relative to the
    model's folder)."""
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        entry = t.external_data.add()
        entry.key, entry.value = key, str(value)


# Initialisers of at least this many bytes go to the child's weight file (`_weights_to_disk`)
_TO_DISK_BYTES = 16 << 10
WEIGHTS_FILE = "weights.data"
RESULT_WEIGHTS_FILE = "result.data"  # the weights of a child's result, beside result.onnx


def _weights_to_disk(model: onnx.ModelProto, external: Mapping[str, np.ndarray] | None = None
                     ) -> dict[tuple[int, int], str]:
    """In a pre-pass child (its working folder is the parent's scratch folder for it): every initialiser of
    _TO_DISK_BYTES or more moves to WEIGHTS_FILE there, and `model` keeps external-data references to it.
    onnxruntime's transformers optimizer copies its input (a deepcopy per model type tried, its model wrapper)
    and reads only the weights a fusion concatenates (attention's q, k, v), loaded from the file when read; the
    result, written beside the file, loads whole in the parent. The child's memory then stays near its share
    of the parent's pages (fusions read shapes, not values; the file is removed with the scratch folder).
    With `external`, `model` is a head (`run_prepasses_on_head`): its kept-apart weights are written from these
    arrays (the parent's, which the fork shares), the small ones into the model; returns where each went,
    {(offset, length): name}: a result's tensor found there is that array, unchanged."""
    from onnx.external_data_helper import convert_model_to_external_data, write_external_data_tensors

    written: dict[tuple[int, int], str] = {}
    if external:
        from xrl.frontends.onnx_weights import in_memory

        with open(WEIGHTS_FILE, "ab") as data:
            for t in model.graph.initializer:
                if not (in_memory(t) and t.name in external):
                    continue
                arr = np.ascontiguousarray(external[t.name], dtype=external[t.name].dtype.newbyteorder("<"))
                del t.external_data[:]
                if arr.nbytes < _TO_DISK_BYTES:
                    t.ClearField("data_location")
                    t.raw_data = arr.tobytes()
                    continue
                written[(data.tell(), arr.nbytes)] = t.name
                _refer(t, WEIGHTS_FILE, data.tell(), arr.nbytes)
                data.write(memoryview(arr.reshape(-1).view(np.uint8)))  # the array's own bytes, no copy
    if not any(len(t.raw_data) >= _TO_DISK_BYTES for t in model.graph.initializer):
        return written
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location=WEIGHTS_FILE,
                                   size_threshold=_TO_DISK_BYTES, convert_attribute=False)
    write_external_data_tensors(model, os.getcwd())  # clears each tensor's raw_data once written
    return written


def _head_shapes(model: onnx.ModelProto, most: int = 1) -> list[tuple[int, int]]:
    """(heads, hidden size) read off constant Reshape targets [batch, seq, heads, head size], the most common
    first; one by default: each is a full run of the optimizer, inside the pre-passes' time budget."""
    from onnx import numpy_helper

    consts = {t.name: t for t in model.graph.initializer if len(t.dims) == 1 and t.dims[0] == 4}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR:
            t = n.attribute[0].t
            if len(t.dims) == 1 and t.dims[0] == 4:
                consts[n.output[0]] = t
    counts: Counter = Counter()
    for n in model.graph.node:
        if n.op_type == "Reshape" and len(n.input) > 1 and n.input[1] in consts:
            heads, size = (int(v) for v in numpy_helper.to_array(consts[n.input[1]])[2:])
            if heads > 1 and size > 1:
                counts[(heads, heads * size)] += 1
    return [pair for pair, _ in counts.most_common(most)]


def _typed(model: onnx.ModelProto) -> onnx.ModelProto:
    """Declare the contrib domain and record the shapes of contrib-op outputs (onnx's own shape
    inference does not know them; onnxruntime's symbolic inference does)."""
    if not any(o.domain == CONTRIB_DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(CONTRIB_DOMAIN, 1))
    # Optional outputs nothing reads (SkipLayerNormalization's mean and inv_std_var before the sum it
    # does return) are left unnamed by the fusions; xrl's IR types every output, so name them here,
    # where onnxruntime's shape inference can type them.
    for n in model.graph.node:
        if n.domain == CONTRIB_DOMAIN:
            for i, v in enumerate(n.output):
                if not v:
                    n.output[i] = f"{n.name or n.op_type}/xrl_unused_{i}"
    _infer_shapes_without_weights(model)
    # onnxruntime's inference gives a skip-layer-norm's statistics no shape: [..., 1] float per row
    typed = {v.name: v for v in (*model.graph.value_info, *model.graph.input, *model.graph.output)}
    stats = {}
    for n in model.graph.node:
        if n.domain == CONTRIB_DOMAIN and n.op_type.startswith("Skip") and n.output[0] in typed:
            dims = [d.dim_value for d in typed[n.output[0]].type.tensor_type.shape.dim]
            stats.update({v: dims[:-1] + [1] for v in n.output[1:3] if v})
    kept = [v for v in model.graph.value_info if v.name not in stats]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    model.graph.value_info.extend(onnx.helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT, dims)
                                  for v, dims in stats.items())
    return model


# Initialisers above this many elements are shapes only to shape inference: it reads the values of small
# shape-like tensors (Reshape targets, Slice bounds), never of a weight
_SHAPES_ONLY_ELEMENTS = 4096


def _elements(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= int(d)
    return n


def weight_stripped(model: onnx.ModelProto, limit: int = _SHAPES_ONLY_ELEMENTS) -> onnx.ModelProto:
    """A copy of `model` without its weights: every initialiser of more than `limit` elements becomes a graph
    input of the same name, type and shape, so that a pass that reads shapes, not values (shape inference),
    works on kilobytes instead of a model's worth of weights (onnxruntime's symbolic inference alone copies
    the model three to four times). The nodes, small initialisers and everything else are copied."""
    g = model.graph
    big = [t for t in g.initializer if _elements(t) > limit]
    declared = {v.name for v in g.input}
    lite_graph = onnx.helper.make_graph(
        list(g.node), g.name,
        [*g.input, *(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                     for t in big if t.name not in declared)],
        list(g.output), [t for t in g.initializer if _elements(t) <= limit], value_info=list(g.value_info))
    lite = onnx.helper.make_model(lite_graph, opset_imports=list(model.opset_import), ir_version=model.ir_version,
                                  functions=list(model.functions))
    return lite


def _infer_shapes_without_weights(model: onnx.ModelProto) -> None:
    """onnxruntime's symbolic shape inference on `model`'s weight-stripped copy; its value_info and output types
    are copied back into `model` (whose weights stay where they are: nothing to restore)."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    with _quiet():
        inferred = SymbolicShapeInference.infer_shapes(weight_stripped(model), auto_merge=True)
    weights = {t.name for t in model.graph.initializer}
    del model.graph.value_info[:]
    model.graph.value_info.extend(v for v in inferred.graph.value_info if v.name not in weights)
    outputs = {v.name: v for v in inferred.graph.output}
    for v in model.graph.output:
        if v.name in outputs:
            v.CopyFrom(outputs[v.name])


def _onnxscript(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    try:  # the `bench` extra: optional, so a missing install is a skipped pass with its reason
        import onnxscript.ir as ir
        from onnxscript.rewriter.ort_fusions import optimize_for_ort
    except ImportError:
        return model, "skipped: onnxscript is not installed (pip install 'xrl[bench]')"
    from xrl.errors import VerificationError
    from xrl.frontends.verify import compare_models

    on_disk = _OWNED and any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    with _quiet():
        if on_disk:  # a head's weights in the child's file: the IR maps them from there, and writes its result's
            # weights to a file of its own, so that neither side holds them in a model (bert: the child 5.4x -> 2.4x)
            onnx.save(model, "input.onnx")  # the model's head: external references to the file beside it
            optimized, stats = optimize_for_ort(ir.load("input.onnx"))
            ir.save(optimized, "onnxscript.onnx", external_data="onnxscript.data", size_threshold_bytes=_TO_DISK_BYTES)
            del optimized
            out = onnx.load("onnxscript.onnx", load_external_data=False)
        else:
            # the IR wraps the proto's tensors without copying them and never writes the proto: in the child
            # (which owns its copy-on-write model) no deepcopy is needed
            optimized, stats = optimize_for_ort(ir.from_proto(model if _OWNED else copy.deepcopy(model)))
            out = ir.to_proto(optimized)
    fused = {k: v for k, v in stats.items() if v}
    if not fused and histogram(out) == histogram(model):
        return model, "no fusion applies"
    # onnxruntime must load and run what it wrote, and compute what its input computes: a pass that
    # fails here is dropped with this reason (raised), the model stays as it was
    with _quiet():
        check = compare_models(model, out, trials=1)
    if not check.ok:
        raise VerificationError(f"its output fails verification: {check.detail}")
    if any(n.domain == CONTRIB_DOMAIN for n in out.graph.node):
        out = _typed(out)
    return out, "fused: " + ", ".join(f"{k} {v}" for k, v in sorted(fused.items()))


@dataclass(frozen=True)
class Prepass:
    """One row of PASSES: how to run the pass (model -> (model, note)), and whether the guard times its result
    alone, beside the target's chain (xrl.deploy.starts.GUARD_PEER_PASSES)."""

    run: Callable[[onnx.ModelProto], tuple[onnx.ModelProto, str]]
    guard_peer: bool = False
    # where the guard times its result alone: the models it can change (None: every model); why not, else
    peer_skip: Callable[[onnx.ModelProto], str] | None = None


def transformer_ops_missing(model: onnx.ModelProto) -> str:
    """Why a transformer-only pass is not run alone for the guard on `model` ("" where it has the ops)."""
    if {n.op_type for n in model.graph.node} & _TRANSFORMER_HINTS:
        return ""
    return "not run alone for the guard: no attention or normalisation ops, which its fusions are for"


# The one table of pre-passes, by name, in the order a chain lists them. The guard times each of these three alone:
# onnxscript, which no target's chain includes, and each of the chain's own (the chain can measure slower than one
# of its passes alone).
PASSES: dict[str, Prepass] = {
    "onnxslim": Prepass(_onnxslim, guard_peer=True),
    "ort-transformers": Prepass(_ort_transformers, guard_peer=True),
    # its fusions are onnxruntime's transformer fusions: on a full-size DBB export (18,483 nodes, no attention or
    # normalisation) it ran 413 s of a 600 s run, fusing nothing, for a candidate measured 0.987x
    "onnxscript": Prepass(_onnxscript, guard_peer=True, peer_skip=transformer_ops_missing),
}
PREPASSES = PASSES.keys()  # the names: a live view of the table


def guard_peer_passes() -> tuple[str, ...]:
    """The passes the guard times alone, in table order."""
    return tuple(name for name, p in PASSES.items() if p.guard_peer)


def _die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this child when its parent dies, however it dies (SIGKILL included): an orphaned
    pre-pass holds gigabytes for minutes. Elsewhere a no-op; the parent's `finally` still kills it."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the CLI's handler: a SIGTERM ends the child outright
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent ends the child
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


@contextlib.contextmanager
def _scratch_cwd():
    """Run a pass in a temporary working directory, removed afterwards: onnxruntime's symbolic shape
    inference writes its temporaries (`sym_shape_infer_temp.onnx`, external `.data` files) into the
    current directory, which is the user's."""
    import shutil
    import tempfile

    here = os.getcwd()
    scratch = tempfile.mkdtemp(prefix="xrl-prepass-")
    try:
        os.chdir(scratch)
        yield
    finally:
        os.chdir(here)
        shutil.rmtree(scratch, ignore_errors=True)


def _in_child(name: str, model: onnx.ModelProto, scratch: str, conn, parent: int,  # noqa: ANN001
              external: Mapping[str, np.ndarray] | None = None) -> None:
    # `model` is the parent's own object, inherited by the fork (nothing serialised on the way in); the
    # pass's output goes to the file result.onnx in `scratch`, the folder the PARENT made and removes (a child
    # ended by the time limit or a signal runs no cleanup of its own), which is also the child's working and
    # temporary folder; the pipe carries only (written?, detail, error)
    global _OWNED
    import tempfile

    _die_with_parent(parent)
    _OWNED = True
    work = os.path.join(scratch, "work")
    os.mkdir(work)
    os.chdir(scratch)  # where a pass's own files go: a weight file (`_weights_to_disk`) beside result.onnx
    os.environ["TMPDIR"] = work  # what the libraries put in the temporary folder goes here too
    tempfile.tempdir = work
    result = os.path.join(scratch, "result.onnx")
    try:
        written = {}
        if external is not None:  # a head: its weights from the parent's arrays to this child's file
            written = _weights_to_disk(model, external)
        out, detail = PASSES[name].run(model)
        changed = out is not None and out is not model
        if changed:  # the weights to a file one tensor at a time: no serialised copy of them beside the model
            from onnx.external_data_helper import convert_model_to_external_data, write_external_data_tensors

            convert_model_to_external_data(out, all_tensors_to_one_file=True, location=RESULT_WEIGHTS_FILE,
                                           size_threshold=_TO_DISK_BYTES, convert_attribute=False)
            write_external_data_tensors(out, scratch)
            with open(result, "wb") as f:
                f.write(out.SerializeToString())
        conn.send((changed, detail, None, written))
    except Exception as e:  # reported by the parent as a dropped pass
        from xrl.frontends.onnx_io import brief_error

        conn.send((False, "", brief_error(e), {}))
    finally:
        conn.close()


class PassTimeout(TimeoutError):
    """A pre-pass stopped by its time limit: its result depends on the machine's speed and load."""


def _end_child(proc) -> None:  # noqa: ANN001 - a multiprocessing Process
    """SIGTERM, a short join, then SIGKILL; the Process object is closed (it keeps its arguments, the model)."""
    if proc.is_alive():
        proc.terminate()
        proc.join(2.0)
    if proc.is_alive():
        proc.kill()
    proc.join()
    proc.close()


def _run_bounded(name: str, model: onnx.ModelProto, timeout: float | None) -> tuple[onnx.ModelProto, str]:
    """Run a pass in a child process that is killed after `timeout` seconds: the libraries have no time
    limit of their own, and some of their passes are quadratic in the node count. The child is a fork: it
    reads the model where the parent holds it and writes its result to a file, so neither side keeps a
    serialised copy of the model while the pass runs."""
    if timeout is None or timeout == float("inf"):
        with _scratch_cwd():
            return PASSES[name].run(model)
    return _in_fork(name, model, None, timeout, lambda path, _: onnx.load(path))


def _run_bounded_head(name: str, head: onnx.ModelProto, external: Mapping[str, np.ndarray], timeout: float | None
                      ) -> tuple[onnx.ModelProto, dict[str, np.ndarray], str]:
    """`_run_bounded` on a head and its kept-apart weights (`xrl.frontends.onnx_weights`): the child writes them
    to its scratch file from the arrays the fork shares, and the result comes back as a head whose weights
    are read from the child's files one at a time, each one equal to an array alive already (the IR's) being
    that array (`shared_weight`): the parent holds only the weights the pass changed, once."""
    from xrl.frontends.onnx_weights import materialize, split_model

    if timeout is None or timeout == float("inf"):
        full = materialize(head, external)
        with _scratch_cwd():
            out, detail = PASSES[name].run(full)
        if out is full:
            return head, dict(external), detail
        out_head, arrays = split_model(out)
        return out_head, _interned(arrays), detail
    out = _in_fork(name, head, external, timeout, lambda path, written: _read_head(path, written, external))
    return (head, dict(external), out[1]) if out[0] is head else (*out[0], out[1])


def _interned(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    from xrl.frontends.onnx_weights import shared_weight

    return {k: shared_weight(a) for k, a in arrays.items()}


def _read_head(path: str, written: Mapping[tuple[int, int], str], external: Mapping[str, np.ndarray]
               ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A child's result file as a head and its weights. A tensor where the child wrote one of `external`'s arrays
    (`written`: {(offset, length): name} in WEIGHTS_FILE), of its dtype, is that array (no byte read); any other
    is read from its file alone and interned (`shared_weight`), a small one put back into the model."""
    from xrl.frontends.onnx_weights import kept_apart, mark_external, shared_weight, split_model

    head = onnx.load(path, load_external_data=False)
    folder = os.path.dirname(path)
    if _external_below(head.graph):
        full = onnx.load(path)  # external tensors in subgraphs or attributes: read whole (no pass writes them)
        out, arrays = split_model(full)
        return out, _interned(arrays)
    arrays: dict[str, np.ndarray] = {}
    for t in head.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")
        count = int(np.prod(t.dims, dtype=np.int64))
        known = written.get((int(info.get("offset", -1)), int(info.get("length", -1)))) \
            if info.get("location") == WEIGHTS_FILE else None
        if known is not None and external[known].dtype == dtype and external[known].size == count:
            del t.external_data[:]
            t.ClearField("data_location")
            mark_external(t)
            same = external[known]
            arrays[t.name] = same if same.shape == tuple(t.dims) else same.reshape(tuple(t.dims))  # its bytes
            continue
        location = os.path.join(folder, info["location"])
        arr = np.fromfile(location, dtype=dtype, count=count, offset=int(info.get("offset", 0)))
        arr = arr.astype(dtype.newbyteorder("="), copy=False).reshape(tuple(t.dims))
        del t.external_data[:]
        t.ClearField("data_location")
        if kept_apart(arr):
            mark_external(t)
            arrays[t.name] = shared_weight(arr)  # one tensor's bytes at a time: equal to a live one, that one
        else:
            t.raw_data = np.ascontiguousarray(arr, dtype=dtype).tobytes()
    return head, arrays


def _external_below(graph: onnx.GraphProto) -> bool:
    """Whether a tensor in a node's attribute or a subgraph (not the graph's own initialisers) has external data."""
    ext = onnx.TensorProto.EXTERNAL
    for n in graph.node:
        for a in n.attribute:
            if a.t.data_location == ext or any(t.data_location == ext for t in a.tensors):
                return True
            for g in (a.g, *a.graphs) if a.HasField("g") or a.graphs else ():
                if any(t.data_location == ext for t in g.initializer) or _external_below(g):
                    return True
    return False


def _in_fork(name: str, model: onnx.ModelProto, external: Mapping[str, np.ndarray] | None, timeout: float,
             load: Callable[[str, dict], object]) -> tuple[object, str]:
    """The pass `name` on `model` in a forked child within `timeout` seconds: (load(result file, where the child
    wrote `external`'s arrays), detail), or (model, detail) where the pass changed nothing."""
    import multiprocessing as mp
    import tempfile

    ctx = mp.get_context("fork")  # not spawn/forkserver: those would pickle the model to the child
    # the parent owns the child's scratch folder (its working and temporary folder, and its result's): removed
    # here after the child has ended, however it ended (time limit, SIGTERM/SIGINT to xrl, an error)
    with tempfile.TemporaryDirectory(prefix="xrl-prepass-") as scratch:
        result = os.path.join(scratch, "result.onnx")
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_in_child, args=(name, model, scratch, child, os.getpid(), external), daemon=True)
        proc.start()
        child.close()
        try:
            if not parent.poll(timeout):
                raise PassTimeout(f"took longer than {timeout:.0f} s")
            changed, detail, error, written = parent.recv()
        except EOFError:
            raise RuntimeError(f"the pass's process ended without a result (exit code {proc.exitcode})") from None
        finally:
            _end_child(proc)
            parent.close()
        if error:
            raise RuntimeError(error)
        return (load(result, written) if changed else model), detail


def _over_protobuf_limit(model: onnx.ModelProto) -> bool:
    """Whether the model is past what one protobuf can hold (2 GiB, less a margin): the libraries serialise
    it whole. Past the limit protobuf cannot even count its size (ByteSize raises)."""
    from google.protobuf.message import EncodeError

    from xrl.frontends.onnx_weights import initializer_bytes

    limit = 2 ** 31 - 2 ** 20
    weights = initializer_bytes(model)  # cheap; ByteSize walks the whole message
    if weights > limit or weights < limit // 2:
        return weights > limit
    try:
        return model.ByteSize() > limit
    except EncodeError:
        return True


QUIETER = "the result could differ on a quieter or faster machine"
# the pre-passes' time limit grows with the model: seconds per node and per GiB of weights on top of the
# share of the search's limit they are given (onnxruntime's transformers optimizer and its symbolic shape
# inference walk every node, and copy every weight, several times)
PREPASS_S_PER_NODE = 0.05
PREPASS_S_PER_GIB = 120.0


def scaled_time_limit(model: onnx.ModelProto, time_limit: float) -> float:
    """`time_limit`, raised to PREPASS_S_PER_NODE per node plus PREPASS_S_PER_GIB per GiB of weights where that
    is more (bert-base, 1,000 nodes and 0.4 GiB: 98 s; a 1e9-parameter decoder: about 520 s)."""
    from xrl.frontends.onnx_weights import initializer_bytes

    need = PREPASS_S_PER_NODE * len(model.graph.node) + PREPASS_S_PER_GIB * initializer_bytes(model) / 2 ** 30
    return max(time_limit, need)


def run_prepasses(model: onnx.ModelProto, names: Sequence[str], *,
                  check: Callable[[onnx.ModelProto], None] | None = None,
                  time_limit: float | None = None) -> tuple[onnx.ModelProto, list[PassReport]]:
    """Run the named passes in order, within `time_limit` seconds in all (None: no limit; a pass that
    would run past it is stopped and skipped, its report `timed_out`). The limit is raised to what the
    model's size needs (`scaled_time_limit`): a fixed share of the search's time would drop the passes on
    large models, and with them the exact fusions they enable. Each result must pass `check` (import into
    the IR, say: it raises on failure), else it is dropped."""
    model, _, reports = _chain(model, None, names, None if check is None else lambda m, _: check(m), time_limit)
    return model, reports


def run_prepasses_on_head(head: onnx.ModelProto, external: Mapping[str, np.ndarray], names: Sequence[str], *,
                          check: Callable[[onnx.ModelProto, dict[str, np.ndarray]], None] | None = None,
                          time_limit: float | None = None
                          ) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[PassReport]]:
    """`run_prepasses` on a head and its kept-apart weights (`to_onnx(..., external=...)`, `split_model`): no
    model holding the weights is built in this process. Each child writes the weights to its own file from these
    arrays, and its result comes back as a head whose unchanged weights are the arrays already held (the IR's,
    through `shared_weight`). Returns the result's head, its weights and the reports; `check` gets a head and
    its weights (`from_onnx(head, external=weights)`)."""
    return _chain(head, dict(external), names, check, time_limit)


def _chain(model: onnx.ModelProto, external: dict[str, np.ndarray] | None, names: Sequence[str],
           check: Callable[[onnx.ModelProto, dict[str, np.ndarray] | None], None] | None,
           time_limit: float | None) -> tuple[onnx.ModelProto, dict[str, np.ndarray] | None, list[PassReport]]:
    """The loop of `run_prepasses` (`external` None: full models) and `run_prepasses_on_head` (heads)."""
    import time

    t0 = time.perf_counter()
    if time_limit is not None:
        time_limit = scaled_time_limit(model, time_limit)

    reports = []
    for name in names:
        if name not in PASSES:
            from xrl.errors import ConfigError

            raise ConfigError(f"unknown pre-pass {name!r}; choose from: {', '.join(PREPASSES)}")
        before = len(model.graph.node)
        # a head's weights go to the child's file, not into a protobuf: only a full model can be over the limit
        # (a 1e9-parameter decoder's head is 4 MB; every pass was skipped on it before)
        if (external is None and _over_protobuf_limit(model)) or os.environ.get("XRL_NO_PREPASS"):
            reports.append(PassReport(name, False, before, before, "skipped (model over 2 GB, or XRL_NO_PREPASS)"))
            continue
        started = time.perf_counter()
        report, out, out_external = _one_pass(name, model, external, check, time_limit, started - t0)
        reports.append(replace(report, seconds=time.perf_counter() - started))
        if report.applied:
            model, external = out, out_external
    return model, external, reports


def _one_pass(name: str, model: onnx.ModelProto, external: dict[str, np.ndarray] | None,
              check: Callable[[onnx.ModelProto, dict[str, np.ndarray] | None], None] | None,
              time_limit: float | None, spent: float) -> tuple[PassReport, onnx.ModelProto | None, dict | None]:
    """One pass of `_chain` (`spent`: the chain's seconds so far of its `time_limit`): its report, and its
    result's model and weights where it applied."""
    from xrl.frontends.onnx_io import brief_error

    before = len(model.graph.node)
    left = None if time_limit is None else time_limit - spent
    if left is not None and left <= 0:
        return PassReport(name, False, before, before, f"skipped: the pre-pass time limit was spent ({time_limit:.0f} "
                          f"s); {QUIETER}", timed_out=True), None, None
    try:
        if external is None:
            (out, detail), out_external = _run_bounded(name, model, left), None
        else:
            out, out_external, detail = _run_bounded_head(name, model, external, left)
        if out is model or histogram(out) == histogram(model) and len(out.graph.initializer) == len(
                model.graph.initializer):
            return PassReport(name, False, before, before, detail or "no change"), None, None
        if check is not None:
            check(out, out_external)
    except PassTimeout as e:
        return PassReport(name, False, before, before, f"dropped: {e} (its time limit); {QUIETER}",
                          timed_out=True), None, None
    except Exception as e:  # a peer library failing on a model must not stop xrl: skip it, say why
        return PassReport(name, False, before, before, f"dropped: {brief_error(e)}"), None, None
    return PassReport(name, True, before, len(out.graph.node), detail), out, out_external
