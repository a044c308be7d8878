"""Weight memory of ONNX models: what keeps a model's weights in one copy while xrl exports, re-imports,
costs and writes it.

- `shared_weight`: the interning pool; an imported weight equal to one an earlier import still holds is
  that array (a model exported and read back holds no second copy of the weights it did not change).
- Heads (`to_onnx(..., external=...)` in `xrl.frontends.onnx_io`): a model whose big weights point at
  MEMORY_LOCATION, their arrays kept apart; `split_model` turns a full model into one, `materialize` back,
  `with_placeholders` readies one for the import, `in_memory` tells its kept-apart tensors.
- `tensor_bytes`, `initializer_bytes`: a tensor's and a model's weight bytes, without serialising.
- `trim_heap`: glibc's malloc_trim through ctypes, so freed transient buffers go back to the system.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from functools import cache

import numpy as np
import onnx
from onnx import TensorProto, helper


def tensor_bytes(t: TensorProto) -> int:
    """A tensor's data bytes from its shape and type: protobuf's ByteSize() walks the message (about 30 ms
    for one VGG weight) and reading raw_data copies it."""
    if t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return t.ByteSize()
    itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    return int(np.prod(t.dims, dtype=np.int64)) * itemsize


def initializer_bytes(model: onnx.ModelProto) -> int:
    return sum(tensor_bytes(t) for t in model.graph.initializer)


EXTERNAL_MIN_TENSOR = 1024  # bytes: smaller tensors stay inline, as onnx itself does


# Weights of this size and up are shared between imports (smaller ones cost less than the lookup).
_SHARE_MIN_BYTES = 1 << 16
# (dtype, shape, a sample of its bytes) -> weights live in some imported graph; dropped with the last graph
_shared_weights: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def shared_weight(arr: np.ndarray) -> np.ndarray:
    """`arr`, or an equal read-only weight an earlier import made that is still alive. A model exported and
    imported again (the file a search writes, re-read to cost and time it) then holds no second copy of
    the weights it did not change; the IR never writes into a weight, so sharing is safe."""
    if arr.nbytes < _SHARE_MIN_BYTES or not arr.flags.c_contiguous:
        return arr
    raw = arr.reshape(-1).view(np.uint8)  # bytes, not values: -0.0 is not 0.0, and a NaN equals itself
    key = (arr.dtype.str, arr.shape, raw[:64].tobytes(), raw[-64:].tobytes())
    old = _shared_weights.get(key)
    if old is not None and np.array_equal(old.reshape(-1).view(np.uint8), raw):
        return old
    if arr.flags.writeable:  # what Graph would do; done here so the pooled array is the one graphs hold
        arr = arr.view()
        arr.flags.writeable = False
    _shared_weights[key] = arr
    return arr


def trim_heap() -> None:
    """Give freed heap memory back to the system (glibc's malloc_trim): the arenas keep the space of the
    big transient buffers of an export or a session (serialised models, tensors' bytes) otherwise, and
    the process stays that large for the rest of the run. Elsewhere a no-op."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@cache
def _libc():  # noqa: ANN202 - a ctypes CDLL, or None
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):  # musl and other libcs have no malloc_trim
        return None


# Where the weights of a head (`to_onnx(..., external=...)`) are: in the caller's arrays, not in a file
MEMORY_LOCATION = "xrl:in-memory"


def kept_apart(arr: np.ndarray) -> bool:
    """Whether a weight goes to `external`: big enough to matter, of a dtype onnxruntime can wrap."""
    return arr.nbytes >= EXTERNAL_MIN_TENSOR and arr.dtype.kind in "fiub" and arr.dtype.isnative


def mark_external(t: TensorProto) -> None:
    t.data_location = TensorProto.EXTERNAL
    entry = t.external_data.add()
    entry.key, entry.value = "location", MEMORY_LOCATION


def in_memory(t: TensorProto) -> bool:
    """Whether `t` is a head's tensor whose bytes are kept apart (`to_onnx(..., external=...)`)."""
    return t.data_location == TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == MEMORY_LOCATION for e in t.external_data)


def split_model(model: onnx.ModelProto, like: Mapping[str, np.ndarray] | None = None
                ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A full model as a head and its big weights apart (see `to_onnx`), leaving `model` unchanged. A
    weight whose bytes equal the array `like` holds under its name (the IR imported from this model) is
    that array; any other is read from the model (one tensor's bytes at a time while comparing)."""
    head = onnx.ModelProto()
    copy_fields(head, model, skip="graph")
    copy_fields(head.graph, model.graph, skip="initializer")
    external: dict[str, np.ndarray] = {}
    for t in model.graph.initializer:
        out = head.graph.initializer.add()
        if not t.HasField("raw_data") or t.data_location == TensorProto.EXTERNAL \
                or t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED) or tensor_bytes(t) < EXTERNAL_MIN_TENSOR:
            out.CopyFrom(t)
            continue
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")
        if dtype.kind not in "fiub" or not dtype.isnative:
            out.CopyFrom(t)
            continue
        raw = t.raw_data
        arr = np.frombuffer(raw, dtype=dtype).reshape(tuple(t.dims))
        known = like.get(t.name) if like is not None else None
        if known is not None and known.dtype == arr.dtype and known.shape == arr.shape and known.flags.c_contiguous \
                and np.array_equal(known.reshape(-1).view(np.uint8), arr.reshape(-1).view(np.uint8)):
            arr = known
        del raw
        copy_fields(out, t, skip=("raw_data", "data_location", "external_data"))
        mark_external(out)
        external[t.name] = arr
    return head, external


def materialize(head: onnx.ModelProto, external: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """The full model of a head and its weights (a copy of every weight's bytes)."""
    model = onnx.ModelProto()
    model.CopyFrom(head)
    for t in model.graph.initializer:
        if in_memory(t):
            arr = external[t.name]
            t.ClearField("external_data")
            t.ClearField("data_location")
            t.raw_data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
    return model


def with_placeholders(head: onnx.ModelProto, external: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of a head (small: no weights) whose kept-apart tensors are empty placeholders the import reads
    without copying anything; `_import` puts the arrays in their place."""
    model = onnx.ModelProto()
    model.CopyFrom(head)
    for t in model.graph.initializer:
        if t.name in external and in_memory(t):
            t.ClearField("external_data")
            t.ClearField("data_location")
            del t.dims[:]
            t.dims.append(0)
    return model


def copy_fields(dst, src, skip: str | Sequence[str] = ()) -> None:  # noqa: ANN001 - protobuf messages
    """Copy every field of `src` that is set into `dst`, except those named in `skip`."""
    skip = (skip,) if isinstance(skip, str) else tuple(skip)
    for field, value in src.ListFields():
        if field.name in skip:
            continue
        if field.is_repeated:
            getattr(dst, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


# ----- reading an .onnx file as a head, one weight at a time -----------------------------------------------------
# The wire format's field numbers: ModelProto.graph, GraphProto.initializer, TensorProto.raw_data
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9
# element types whose raw bytes are a plain little-endian array of the numpy dtype onnx maps them to
_PLAIN_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT8,
                          TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8,
                          TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64, TensorProto.BOOL})


class _Wire:
    """A protobuf message's bytes in a file, read field by field (only what `read_head` needs)."""

    def __init__(self, f) -> None:  # noqa: ANN001 - a binary file
        self.f = f

    def varint(self) -> int:
        shift = value = 0
        while True:
            b = self.f.read(1)
            if not b:
                raise ValueError("truncated protobuf")
            value |= (b[0] & 0x7F) << shift
            if b[0] < 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError("bad varint")

    def field(self) -> tuple[int, int, int, int]:
        """(field number, wire type, where its value starts, where the field ends)."""
        tag = self.varint()
        wire = tag & 7
        if wire == 0:
            start = self.f.tell()
            self.varint()
            return tag >> 3, wire, start, self.f.tell()
        if wire == 2:
            length = self.varint()
            start = self.f.tell()
            return tag >> 3, wire, start, start + length
        if wire in (1, 5):
            start = self.f.tell()
            return tag >> 3, wire, start, start + (8 if wire == 1 else 4)
        raise ValueError(f"unsupported protobuf wire type {wire}")


def _key(field: int, wire: int) -> bytes:
    return _varint_bytes(field << 3 | wire)


def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _copy_span(f, begin: int, end: int) -> bytes:  # noqa: ANN001
    f.seek(begin)
    data = f.read(end - begin)
    if len(data) != end - begin:
        raise ValueError("truncated protobuf")
    return data


def read_head(path: str, like: Mapping[str, np.ndarray] | None = None, *, whole: bool = False
              ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """An .onnx file as a head (`split_model`'s form) and its big weights, without the file's bytes or a model
    holding every weight in memory at once: the protobuf is walked in the file, each top-level initialiser's
    raw_data is skipped, then read alone into its array (where `like` holds an array of the same name, dtype,
    shape and bytes, that array instead: no second copy). With `whole`, each weight goes back into the model
    instead (a full ModelProto, built one weight at a time: no copy of the file's bytes beside it). Raises
    ValueError where the file is not a protobuf this reader walks (the caller falls back to onnx.load)."""
    import os

    size = os.path.getsize(path)
    with open(path, "rb") as f:
        wire = _Wire(f)
        model_parts: list[bytes] = []
        spans: list[tuple[int, int] | None] = []  # each initialiser's raw_data in the file, in order
        while f.tell() < size:
            begin = f.tell()
            field, kind, start, end = wire.field()
            if field != _MODEL_GRAPH or kind != 2:
                model_parts.append(_copy_span(f, begin, end))
                continue
            graph_parts: list[bytes] = []
            f.seek(start)
            while f.tell() < end:
                g_begin = f.tell()
                g_field, g_kind, g_start, g_end = wire.field()
                if g_field != _GRAPH_INITIALIZER or g_kind != 2:
                    graph_parts.append(_copy_span(f, g_begin, g_end))
                    continue
                tensor_parts: list[bytes] = []
                span = None
                f.seek(g_start)
                while f.tell() < g_end:
                    t_begin = f.tell()
                    t_field, t_kind, t_start, t_end = wire.field()
                    if t_field == _TENSOR_RAW_DATA and t_kind == 2:
                        span = (t_start, t_end - t_start)
                        f.seek(t_end)
                    else:
                        tensor_parts.append(_copy_span(f, t_begin, t_end))
                tensor = b"".join(tensor_parts)
                graph_parts.append(_key(_GRAPH_INITIALIZER, 2) + _varint_bytes(len(tensor)) + tensor)
                spans.append(span)
                f.seek(g_end)
            graph = b"".join(graph_parts)
            model_parts.append(_key(_MODEL_GRAPH, 2) + _varint_bytes(len(graph)) + graph)
            f.seek(end)
        head = onnx.ModelProto.FromString(b"".join(model_parts))
        del model_parts
        if len(head.graph.initializer) != len(spans):
            raise ValueError("initialisers out of step with the file")
        external: dict[str, np.ndarray] = {}
        for t, span in zip(head.graph.initializer, spans):
            if span is None:
                continue
            offset, length = span
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<") \
                if t.data_type in _PLAIN_TYPES else None
            count = int(np.prod(t.dims, dtype=np.int64))
            if whole or dtype is None or count * dtype.itemsize != length:
                t.raw_data = _copy_span(f, offset, offset + length)  # as the file has it
                continue
            f.seek(offset)
            arr = np.fromfile(f, dtype=dtype, count=count).reshape(tuple(t.dims))
            if not kept_apart(arr):
                t.raw_data = arr.tobytes()
                continue
            known = like.get(t.name) if like is not None else None
            if known is not None and known.dtype == arr.dtype and known.shape == arr.shape \
                    and known.flags.c_contiguous \
                    and np.array_equal(known.reshape(-1).view(np.uint8), arr.reshape(-1).view(np.uint8)):
                arr = known
            mark_external(t)
            external[t.name] = arr
    return head, external
