"""The ONNX file writer: `save_onnx` writes a model, or a head and its weights kept apart (`xrl.frontends.
onnx_weights`), atomically, streaming the protobuf by hand so no serialised copy of the model is held in
memory; models past EXTERNAL_DATA_THRESHOLD get their weights in a content-named data file beside them."""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from xrl.atomic import atomic_write, remove_stale_temporaries, write_atomic
from xrl.errors import OutputPathError, XrlError
from xrl.frontends.onnx_io import brief_error
from xrl.frontends.onnx_weights import EXTERNAL_MIN_TENSOR, copy_fields, in_memory, initializer_bytes, tensor_bytes

# Models whose weights pass this are written with external data: protobuf cannot serialise 2 GiB.
EXTERNAL_DATA_THRESHOLD = int(1.8e9)


def save_onnx(model: onnx.ModelProto, path: str | os.PathLike,
              external: Mapping[str, np.ndarray] | None = None) -> Path:
    """Write `model` atomically (a temporary file in the same folder, then a rename): a failed or
    interrupted write never leaves a partial file. Weights past ~1.8 GB go to `<name>.<hash>.data`
    beside it, a name of their own per content, so the model and its weights change together: the
    model's rename is the one commit point. Temporary files a killed xrl left behind, and weight files
    no model at `path` refers to any more, are removed.

    `model` may be a head with its weights in `external` (`to_onnx(..., external=...)`): the file is the
    same model, written from the arrays as they are (no serialised copy of the model in memory)."""
    missing = [t.name for t in model.graph.initializer if in_memory(t) and t.name not in (external or {})]
    if missing:
        raise XrlError(f"cannot write the model: weight {missing[0]!r} is kept apart and was not given")
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"{path} is a directory; give a file path such as {path / 'model.onnx'}")
    folder = path.parent
    if not folder.is_dir():
        raise OutputPathError(f"cannot write {path}: folder {folder} does not exist; create it first")
    remove_stale_temporaries(path)
    try:
        weight_bytes = initializer_bytes(model)
        if weight_bytes > EXTERNAL_DATA_THRESHOLD:
            data_name = _save_external(model, path, external)
        else:
            write_atomic(path, _serialized(model, external))
            data_name = None
    except OSError as e:
        raise OutputPathError(f"cannot write {path} ({e.strerror or brief_error(e)}); check the folder is writable "
                              f"and has space") from e
    _remove_old_data(path, keep=data_name)
    return path


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _length_field(number: int, length: int) -> bytes:
    """The key and length of a length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(length)


_GRAPH_FIELD = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_INITIALIZER_FIELD = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
_RAW_DATA_FIELD = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number


def _serialized(model: onnx.ModelProto, external: Mapping[str, np.ndarray] | None) -> Iterator[bytes | memoryview]:
    """The model's protobuf bytes, in chunks: a head's kept-apart weights are written from their arrays.
    Protobuf merges a message given in parts (repeated fields append), so the model without initializers,
    then each initializer as a model holding only it, reads back as the model itself."""
    if not any(in_memory(t) for t in model.graph.initializer):
        yield model.SerializeToString()
        return
    head = onnx.ModelProto()
    copy_fields(head, model, skip="graph")
    copy_fields(head.graph, model.graph, skip="initializer")
    yield head.SerializeToString()
    del head
    for t in model.graph.initializer:
        if not in_memory(t):
            part = onnx.ModelProto()
            part.graph.initializer.add().CopyFrom(t)
            yield part.SerializeToString()
            continue
        arr = np.ascontiguousarray(external[t.name], dtype=external[t.name].dtype.newbyteorder("<"))
        raw = memoryview(arr.reshape(-1).view(np.uint8))
        fields = onnx.TensorProto()
        copy_fields(fields, t, skip=("raw_data", "data_location", "external_data"))
        tensor = fields.SerializeToString() + _length_field(_RAW_DATA_FIELD, raw.nbytes)
        size = len(tensor) + raw.nbytes
        entry = _length_field(_INITIALIZER_FIELD, size)
        yield _length_field(_GRAPH_FIELD, len(entry) + size) + entry + tensor
        yield raw


def _remove_old_data(path: Path, keep: str | None) -> None:
    """Weight files of earlier writes to `path` (`<name>.data`, `<name>.<hash>.data`) that the model
    just written does not use: the model that used them has been replaced."""
    import re

    pattern = re.compile(re.escape(path.name) + r"(\.[0-9a-f]{12})?\.data")
    for p in path.parent.glob(f"{glob.escape(path.name)}*.data"):
        if p.name != keep and pattern.fullmatch(p.name):
            with contextlib.suppress(OSError):
                p.unlink()


def _save_external(model: onnx.ModelProto, path: Path, external: Mapping[str, np.ndarray] | None = None) -> str:
    """Big tensors' bytes to `<path>.<hash>.data`, the rest to `path`; returns the data file's name.
    The data file gets its final name before the model is replaced, and that name is new whenever the
    weights are, so a crash at any point leaves the old model with its own weights or the new model
    with its own. The model written is a new head (every field but the big tensors' bytes, which point
    at the data file); the caller's model is neither changed nor copied: protobuf cannot free a field it
    clears, so moving the bytes out and back would grow the caller's model by its weights on every save."""
    import hashlib

    digest = hashlib.blake2b(digest_size=6)
    head = onnx.ModelProto()
    copy_fields(head, model, skip="graph")
    copy_fields(head.graph, model.graph, skip="initializer")
    written: list[TensorProto] = []
    # the weights' temporary gets its final name (from their digest) when the block ends
    with atomic_write(path, suffix=".data.tmp") as pending:
        with pending.open("wb") as f:
            offset = 0
            for t in model.graph.initializer:
                out = head.graph.initializer.add()
                kept_apart = in_memory(t)
                if not kept_apart and (not t.HasField("raw_data") or t.data_location == TensorProto.EXTERNAL
                                       or tensor_bytes(t) < EXTERNAL_MIN_TENSOR):
                    out.CopyFrom(t)
                    continue
                if kept_apart:  # the array's own bytes, little-endian as ONNX stores them
                    arr = external[t.name]
                    raw = memoryview(np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).reshape(-1)
                                     .view(np.uint8))
                else:
                    raw = t.raw_data  # one tensor's bytes at a time
                f.write(raw)
                digest.update(raw)
                copy_fields(out, t, skip=("raw_data", "data_location", "external_data"))
                out.data_location = TensorProto.EXTERNAL
                for k, v in (("location", ""), ("offset", str(offset)), ("length", str(len(raw)))):
                    entry = out.external_data.add()
                    entry.key, entry.value = k, v
                written.append(out)
                offset += len(raw)  # a memoryview of bytes: its length is its bytes
                del raw
        data_name = f"{path.name}.{digest.hexdigest()}.data"
        for t in written:
            t.external_data[0].value = data_name
        try:
            head = head.SerializeToString()
        except Exception as e:  # still over protobuf's 2 GiB without the big weights
            raise OutputPathError(f"cannot write {path}: the model is too large to serialise even with its "
                                  f"weights outside ({brief_error(e)})") from e
        existed = (path.parent / data_name).exists()  # the same weights written before: the old model uses it
        pending.destination = path.parent / data_name  # data first: the model never points at missing bytes
    try:
        write_atomic(path, head)
    except BaseException:
        if not existed:  # no model refers to it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.parent / data_name)
        raise
    return data_name
