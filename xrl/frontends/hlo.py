"""XLA HLO text import: `parse_hlo`, `load_hlo`, `looks_like_hlo`.

Reads the text of `jax.jit(f).lower(*args).as_text(dialect="hlo")` and XLA's dumps
(`module_*.before_optimizations.txt`, and fused after-optimisation dumps, whose fusions are inlined).
Parsing (`hlo_parse`) and lowering to the IR (`hlo_lower`) are separate steps; this module is the
public face and turns every failure into a ModelLoadError naming the source and line.
"""

from __future__ import annotations

import re
import warnings
from os import PathLike
from pathlib import Path

from xrl.errors import InvalidGraphError, ModelLoadError, XrlWarning
from xrl.frontends.hlo_lower import XLA_DOMAIN, lower_module
from xrl.frontends.hlo_parse import (
    CALL_ATTRS,
    MAX_NESTING,
    ArrayShape,
    HloSyntaxError,
    Module,
    attr_computations,
    parse_module,
)
from xrl.ir import Graph
from xrl.limits import check_shape

__all__ = ["XLA_DOMAIN", "load_hlo", "looks_like_hlo", "parse_hlo"]

_HEADER = re.compile(r"\A\ufeff?(?:\s|//[^\n]*\n|/\*.*?\*/)*HloModule\b", re.S)


def looks_like_hlo(text_head: str) -> bool:
    """Whether the first bytes of a file (decoded) are HLO text: a `HloModule` header, after any
    whitespace or comments. An ONNX protobuf never starts that way."""
    return _HEADER.match(text_head) is not None


def parse_hlo(text: str, *, name: str | None = None) -> Graph:
    """HLO module text -> a validated Graph named `name` (default: the module's name).

    ENTRY parameters become the graph inputs in parameter order (jax passes weights as parameters
    too), constants become initializers, and the ROOT's tuple elements the outputs in order.
    """
    return _parse(text, name=name, source="HLO text")


def load_hlo(path: str | PathLike[str], *, name: str | None = None) -> Graph:
    """Read and import an HLO text file; the graph is named after the file unless `name` is given."""
    p = Path(path)
    if not p.is_file():
        raise ModelLoadError(f"{p}: no such file" if not p.exists() else f"{p} is not a file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ModelLoadError(f"{p}: not HLO text (the file is binary; an .onnx model is loaded with load_onnx)") \
            from None
    except OSError as e:
        raise ModelLoadError(f"{p}: cannot be read ({e.strerror})") from None
    if not looks_like_hlo(text[:4096]):
        raise ModelLoadError(f"{p}: not HLO text (expected it to start with 'HloModule'; dump one with "
                             f"jax.jit(f).lower(*args).as_text(dialect='hlo'))")
    return _parse(text, name=name or p.stem, source=str(p))


def _parse(text: str, *, name: str | None, source: str) -> Graph:
    try:
        module = parse_module(text)
    except HloSyntaxError as e:
        raise ModelLoadError(f"{source}: {e}") from None
    _check_sizes(module, source)
    _check_calls(module, source)
    _warn_unknown_ops(module, source)
    try:
        return lower_module(module, name or module.name or "hlo")
    except ModelLoadError as e:
        raise ModelLoadError(f"{source}: {e}") from None
    except InvalidGraphError as e:
        raise ModelLoadError(f"{source}: the module lowers to an inconsistent graph ({e}); "
                             f"please report it with the HLO file") from None


def _check_sizes(module: Module, source: str) -> None:
    """Every array an instruction declares is within xrl's element limit, checked before lowering
    allocates anything (a parameter or broadcast of 10^9 elements is a user error, not a MemoryError)."""
    for comp in module.computations.values():
        for ins in comp.instructions:
            stack = [ins.shape]
            while stack:  # tuples nest: walk them without recursion
                shape = stack.pop()
                if isinstance(shape, ArrayShape):
                    what = "parameter" if ins.opcode == "parameter" else "instruction"
                    check_shape(shape.dims, f"{source}: line {ins.line}: {what} {ins.name!r} of computation "
                                            f"{comp.name!r}", itemsize=_itemsize(shape.dtype))
                else:
                    stack.extend(shape.elements)


def _itemsize(hlo_dtype: str) -> int:
    digits = "".join(c for c in hlo_dtype if c.isdigit())
    return max(int(digits) // 8, 1) if digits else 1


def _check_calls(module: Module, source: str) -> None:
    """HLO has no recursion: a computation that calls itself, directly or not, is refused, and call
    chains are bounded, before lowering inlines them (recursively)."""
    calls: dict[str, list[tuple[str, int]]] = {}
    for comp in module.computations.values():
        calls[comp.name] = [(c, ins.line) for ins in comp.instructions for key in CALL_ATTRS
                            if key in ins.attrs for c in attr_computations(ins.attrs[key])
                            if c in module.computations]
    depth: dict[str, int] = {}  # longest call chain below each finished computation
    for root in calls:
        if root in depth:
            continue
        path, on_path = [root], {root}
        stack = [iter(calls[root])]
        while stack:  # an iterative depth-first walk: the check itself must not recurse
            nxt = next(stack[-1], None)
            if nxt is None:
                done = path.pop()
                on_path.discard(done)
                stack.pop()
                depth[done] = 1 + max((depth[c] for c, _ in calls[done]), default=0)
                continue
            callee, line = nxt
            if callee in on_path:
                cycle = " -> ".join([*path[path.index(callee):], callee])
                raise ModelLoadError(f"{source}: line {line}: computation {path[-1]!r} calls {callee!r}, which is "
                                     f"already being called ({cycle}); HLO computations cannot be recursive")
            if callee not in depth:
                path.append(callee)
                on_path.add(callee)
                stack.append(iter(calls[callee]))
        if depth[root] > MAX_NESTING:
            raise ModelLoadError(f"{source}: computation {root!r} starts a chain of {depth[root]} nested calls; "
                                 f"xrl inlines at most {MAX_NESTING}")


# Every opcode XLA's HLO printer writes (xla/hlo/ir/hlo_opcode.h); anything else is a typo or a
# foreign extension, which xrl can only keep as an opaque node.
XLA_OPCODES = frozenset("""
abs add add-dependency after-all all-gather all-gather-done all-gather-start all-reduce all-reduce-done
all-reduce-start all-to-all and async-done async-start async-update atan2 batch-norm-grad batch-norm-inference
batch-norm-training bitcast bitcast-convert broadcast call cbrt ceil cholesky clamp clz collective-broadcast
collective-permute collective-permute-done collective-permute-start compare complex concatenate conditional constant
convert convolution copy copy-done copy-start cosine custom-call divide domain dot dynamic-reshape dynamic-slice
dynamic-update-slice erf exponential exponential-minus-one fft floor fusion gather get-dimension-size
get-tuple-element imag infeed iota is-finite log log-plus-one logistic map maximum minimum multiply negate not
opt-barrier optimization-barrier or outfeed pad parameter partition-id popcnt power ragged-all-to-all real recv
recv-done reduce reduce-precision reduce-scatter reduce-window remainder replica-id reshape reverse rng
rng-bit-generator rng-get-and-update-state round-nearest-afz round-nearest-even rsqrt scatter select
select-and-scatter send send-done set-dimension-size shift-left shift-right-arithmetic shift-right-logical sign
sine slice sort sqrt stochastic-convert subtract tan tanh topk transpose triangular-solve tuple while xor
""".split())


def _warn_unknown_ops(module: Module, source: str) -> None:
    """One warning naming every opcode XLA does not have (with its first line): such a node is
    costed as a guess, never rewritten, and onnxruntime cannot run it, so verification will fail."""
    first: dict[str, tuple[int, str]] = {}
    count: dict[str, int] = {}
    for comp in module.computations.values():
        for ins in comp.instructions:
            if ins.opcode not in XLA_OPCODES:
                first.setdefault(ins.opcode, (ins.line, ins.name))
                count[ins.opcode] = count.get(ins.opcode, 0) + 1
    if not first:
        return
    ops = ", ".join(f"{op!r} (line {line}, %{name}{f', {count[op]} uses' if count[op] > 1 else ''})"
                    for op, (line, name) in sorted(first.items(), key=lambda kv: kv[1]))
    warnings.warn(f"{source}: unknown HLO op{'s' if len(first) > 1 else ''} {ops}: kept as opaque, its cost is a "
                  f"guess, and onnxruntime cannot run it, so `xrl optimize` cannot verify this model",
                  XrlWarning, stacklevel=3)
