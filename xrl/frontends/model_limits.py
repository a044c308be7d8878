"""Every tensor an ONNX file declares, checked against `XRL_MAX_ELEMENTS` before anything is read (and
control flow, which xrl does not support, refused by name rather than by the shapes it leaves unknown).

`onnx.load` reads every weight, external data included, before xrl sees a shape: a weight that declares
805M float32 elements in a 3 GiB external file (sparse: it costs nothing to make) would be read and
copied several times over before any check. `check_declared_sizes` reads the file's protobuf structure
only (the wire format, through a memory map: the bytes of inline weights are skipped, never touched) and
refuses, with the one-line error every input shape gets (`xrl.limits.check_shape`):

- an initialiser (or sparse initialiser, or a tensor attribute such as a Constant's value, in the graph or
  a subgraph) whose dims hold more elements than the limit;
- external data whose declared length (or, without one, the rest of its file, by `stat`: the file is not
  opened) holds more elements of its type than the limit.

A file whose structure it cannot follow is left to `onnx.load`, which reports it.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from xrl.errors import ModelLoadError
from xrl.limits import check_elements, check_shape

CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})  # ops that hold subgraphs: xrl's IR has no control flow

# Bytes per element of each TensorProto.DataType (sub-byte types count as one; strings as a pointer)
_ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 8: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16,
             16: 2, 17: 1, 18: 1, 19: 1, 20: 1, 21: 1, 22: 1, 23: 1}
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
_MAX_DEPTH = 32  # subgraphs nested deeper are left to onnx.load


class _Malformed(Exception):
    """The bytes are not the protobuf structure expected: stop checking, onnx.load will say what is wrong."""


@dataclass
class DeclaredTensor:
    name: str = ""
    dims: list[int] = field(default_factory=list)
    data_type: int = 1
    external: dict[str, str] = field(default_factory=dict)
    location: int = 0
    sparse: bool = False

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE.get(self.data_type, 4)


def _varint(buf: mmap.mmap | bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Malformed
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _fields(buf: mmap.mmap | bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value or start, end) of each field of the message in buf[start:end]; a
    length-delimited field's payload is buf[value:end_of_it], never read here."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, wire, value, pos
        elif wire == 1:
            pos += 8
            yield number, wire, 0, pos
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise _Malformed
            yield number, wire, pos, pos + length
            pos += length
        elif wire == 5:
            pos += 4
            yield number, wire, 0, pos
        else:  # groups (deprecated) and anything else
            raise _Malformed
    if pos != end:
        raise _Malformed


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _text(buf: mmap.mmap | bytes, start: int, end: int) -> str:
    return bytes(buf[start:min(end, start + 4096)]).decode("utf-8", errors="replace")


def _tensor(buf: mmap.mmap | bytes, start: int, end: int) -> DeclaredTensor:
    t = DeclaredTensor()
    for number, wire, a, b in _fields(buf, start, end):
        if number == 1 and wire == 0:
            t.dims.append(_signed(a))
        elif number == 1 and wire == 2:  # packed dims
            pos = a
            while pos < b:
                v, pos = _varint(buf, pos, b)
                t.dims.append(_signed(v))
        elif number == 2 and wire == 0:
            t.data_type = a
        elif number == 8 and wire == 2:
            t.name = _text(buf, a, b)
        elif number == 13 and wire == 2:  # StringStringEntryProto
            key = value = ""
            for n2, w2, a2, b2 in _fields(buf, a, b):
                if n2 == 1 and w2 == 2:
                    key = _text(buf, a2, b2)
                elif n2 == 2 and w2 == 2:
                    value = _text(buf, a2, b2)
            t.external[key] = value
        elif number == 14 and wire == 0:
            t.location = a
    return t


def _sparse(buf: mmap.mmap | bytes, start: int, end: int) -> Iterator[DeclaredTensor]:
    """A SparseTensorProto: its dense dims (what densifying it allocates), its values and indices."""
    dense = DeclaredTensor(sparse=True)
    for number, wire, a, b in _fields(buf, start, end):
        if number in (1, 2) and wire == 2:
            part = _tensor(buf, a, b)
            if number == 1:
                dense.name, dense.data_type = part.name, part.data_type
            yield part
        elif number == 3 and wire == 0:
            dense.dims.append(_signed(a))
        elif number == 3 and wire == 2:
            pos = a
            while pos < b:
                v, pos = _varint(buf, pos, b)
                dense.dims.append(_signed(v))
    yield dense


def _graph(buf: mmap.mmap | bytes, start: int, end: int, depth: int,
           control: list[tuple[str, str]] | None = None) -> Iterator[DeclaredTensor]:
    """The graph's declared tensors; its control-flow nodes (name, op) go to `control` where given."""
    if depth > _MAX_DEPTH:
        return
    for number, wire, a, b in _fields(buf, start, end):
        if wire != 2:
            continue
        if number == 5:  # initializer
            yield _tensor(buf, a, b)
        elif number == 15:  # sparse_initializer
            yield from _sparse(buf, a, b)
        elif number == 1:  # node: its attributes' tensors and subgraphs
            name = op = domain = ""
            for n2, w2, a2, b2 in _fields(buf, a, b):
                if n2 == 5 and w2 == 2:
                    yield from _attribute(buf, a2, b2, depth)
                elif n2 == 3 and w2 == 2:
                    name = _text(buf, a2, b2)
                elif n2 == 4 and w2 == 2:
                    op = _text(buf, a2, b2)
                elif n2 == 7 and w2 == 2:
                    domain = _text(buf, a2, b2)
            if control is not None and op in CONTROL_FLOW and domain in ("", "ai.onnx"):
                control.append((name, op))


def _attribute(buf: mmap.mmap | bytes, start: int, end: int, depth: int) -> Iterator[DeclaredTensor]:
    for number, wire, a, b in _fields(buf, start, end):
        if wire != 2:
            continue
        if number in (5, 11):  # t, tensors
            yield _tensor(buf, a, b)
        elif number in (6, 10):  # g, graphs
            yield from _graph(buf, a, b, depth + 1)
        elif number in (22, 23):  # sparse_tensor, sparse_tensors
            yield from _sparse(buf, a, b)


def declared_tensors(buf: mmap.mmap | bytes, control: list[tuple[str, str]] | None = None
                     ) -> Iterator[DeclaredTensor]:
    """Every tensor a serialised ModelProto declares (graph initialisers, sparse ones, tensor attributes,
    in subgraphs too), from its structure alone; the main graph's control-flow nodes go to `control`."""
    for number, wire, a, b in _fields(buf, 0, len(buf)):
        if number == 7 and wire == 2:  # ModelProto.graph
            yield from _graph(buf, a, b, 0, control)


def check_declared_sizes(path: str | os.PathLike) -> None:
    """Refuse an ONNX file before any of it is read (one line each): a tensor that declares more elements
    than XRL_MAX_ELEMENTS, by dims or by the length of its external data (TensorTooLargeError); a graph
    with control flow (If, Loop, Scan), which xrl does not support (ModelLoadError)."""
    p = Path(path)
    size = p.stat().st_size
    if size == 0:
        return
    control: list[tuple[str, str]] = []
    with p.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            for t in declared_tensors(buf, control):
                _check(t, p)
        except _Malformed:
            return
    if control:
        (name, op), more = control[0], len(control) - 1
        others = f" (and {more} more control-flow node{'s' if more > 1 else ''})" if more else ""
        raise ModelLoadError(f"{p}: node {name!r} is a {op}{others}: control flow (If, Loop, Scan) is not supported; "
                             f"export the model without it (unroll the loop, or trace one branch with fixed shapes)")


def _check(t: DeclaredTensor, model: Path) -> None:
    what = f"{model}: {'sparse ' if t.sparse else ''}weight {t.name!r}"
    check_shape([max(d, 0) for d in t.dims], what, itemsize=t.itemsize)
    if t.location != _EXTERNAL and not t.external:
        return
    location = t.external.get("location", "")
    try:
        offset = int(t.external.get("offset", "0") or 0)
        length = int(t.external["length"]) if t.external.get("length") else None
    except ValueError:
        return  # onnx.load refuses it
    if length is None:
        try:
            length = max((model.parent / location).stat().st_size - offset, 0)  # stat only: nothing is read
        except (OSError, ValueError):
            return  # missing, or a path onnx.load refuses
    check_elements(length // t.itemsize, f"{what} (external data {location!r}, {length:,} bytes)",
                   itemsize=t.itemsize)
