"""A policy server over two named pipes (after MLGO's InteractiveModelRunner).

An external optimiser (the host) asks the policy for each decision. The host creates both pipes and
removes them; the server opens IN for reading, then OUT for writing, so the host opens IN for
writing first, then OUT for reading. Messages, host -> server on IN:

    header       one JSON line: {"features": [{"name": "node_x", "shape": [130, 80], "type": "float32"}, ...],
                 "advice": {"name": "action", "shape": [1], "type": "int64"}}
    observation  one JSON line {"observation": k} (k = 0, 1, ...), then each feature's raw little-endian
                 buffer (C order) in header order, then "\\n" (MLGO's training-log framing)
    end          the host closes IN

server -> host on OUT: for each observation, the advice: the chosen action as raw little-endian int64.

A malformed or truncated message ends the exchange: the server closes OUT without advice (so the
host reads end-of-file, never waits) and raises PipeProtocolError. A message that stalls half-way
fails after `timeout` seconds rather than hang.
"""

from __future__ import annotations

import json
import math
import os
import select
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from xrl.errors import XrlError

DTYPES = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32, "int8": np.int8,
          "uint8": np.uint8, "bool": np.bool_}
MAX_LINE = 1 << 20  # a header or observation line longer than this is malformed


class PipeProtocolError(XrlError):
    """The other side broke the protocol: malformed, truncated or stalled message, or a closed pipe."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    type: str

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(DTYPES[self.type]).newbyteorder("<")

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "type": self.type}

    @staticmethod
    def parse(d: Any) -> TensorSpec:
        try:
            spec = TensorSpec(str(d["name"]), tuple(int(s) for s in d["shape"]), str(d["type"]))
        except (KeyError, TypeError, ValueError) as e:
            raise PipeProtocolError(f"malformed tensor spec {d!r}: {type(e).__name__}: {e}") from None
        if spec.type not in DTYPES or any(s < 0 for s in spec.shape):
            raise PipeProtocolError(f"tensor spec {d!r}: type must be one of {', '.join(DTYPES)}, dims non-negative")
        return spec


def specs_of(observation: Mapping[str, Any]) -> list[TensorSpec]:
    """Tensor specs of a gymnasium Dict observation (every value as an array)."""
    out = []
    for name, value in observation.items():
        arr = np.asarray(value)
        out.append(TensorSpec(name, tuple(arr.shape), np.dtype(arr.dtype).name))
    return out


# ----- reading ------------------------------------------------------------------------------------
class _Reader:
    def __init__(self, stream: BinaryIO, timeout: float | None) -> None:
        self.stream, self.timeout = stream, timeout
        self.fd = stream.fileno() if hasattr(stream, "fileno") else None

    def _wait(self, what: str) -> None:
        if self.timeout is None or self.fd is None:
            return
        ready, _, _ = select.select([self.fd], [], [], self.timeout)
        if not ready:
            raise PipeProtocolError(f"no data for {self.timeout:g} s while reading {what}")

    def exact(self, n: int, what: str) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            self._wait(what)
            chunk = os.read(self.fd, n - len(buf)) if self.fd is not None else self.stream.read(n - len(buf))
            if not chunk:
                raise PipeProtocolError(f"truncated {what}: {len(buf)} of {n} bytes before the pipe closed")
            buf += chunk
        return bytes(buf)

    def line(self, what: str, eof_ok: bool = False) -> bytes | None:
        buf = bytearray()
        while True:
            self._wait(what)
            b = os.read(self.fd, 1) if self.fd is not None else self.stream.read(1)
            if not b:
                if eof_ok and not buf:
                    return None
                raise PipeProtocolError(f"truncated {what}: the pipe closed mid-line")
            if b == b"\n":
                return bytes(buf)
            buf += b
            if len(buf) > MAX_LINE:
                raise PipeProtocolError(f"malformed {what}: no newline in {MAX_LINE} bytes")


def _json(line: bytes, what: str) -> Any:
    try:
        return json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PipeProtocolError(f"malformed {what}: not a JSON line ({e})") from None


def read_header(reader: _Reader) -> tuple[list[TensorSpec], TensorSpec]:
    head = _json(reader.line("header"), "header")
    if not isinstance(head, dict) or not isinstance(head.get("features"), list) or "advice" not in head:
        raise PipeProtocolError("malformed header: expected {\"features\": [...], \"advice\": {...}}")
    return [TensorSpec.parse(f) for f in head["features"]], TensorSpec.parse(head["advice"])


def read_message(reader: _Reader, features: list[TensorSpec], expect: int) -> dict[str, np.ndarray] | None:
    """One observation (None at a clean end of the exchange)."""
    line = reader.line(f"observation {expect} line", eof_ok=True)
    if line is None:
        return None
    msg = _json(line, f"observation {expect} line")
    if not isinstance(msg, dict) or msg.get("observation") != expect:
        raise PipeProtocolError(f"malformed observation line {line[:80]!r}: expected {{\"observation\": {expect}}}")
    out = {}
    for f in features:
        raw = reader.exact(f.nbytes, f"feature {f.name!r} of observation {expect}")
        out[f.name] = np.frombuffer(raw, dtype=f.dtype).reshape(f.shape)
    if reader.exact(1, f"the newline ending observation {expect}") != b"\n":
        raise PipeProtocolError(f"malformed observation {expect}: its buffers are longer than the header says")
    return out


# ----- writing (the host's side, and the tests') --------------------------------------------------
def write_header(out: BinaryIO, features: list[TensorSpec], advice: TensorSpec) -> None:
    out.write(json.dumps({"features": [f.to_dict() for f in features], "advice": advice.to_dict()}).encode() + b"\n")
    out.flush()


def write_observation(out: BinaryIO, features: list[TensorSpec], obs: Mapping[str, Any], index: int) -> None:
    out.write(json.dumps({"observation": index}).encode() + b"\n")
    for f in features:
        out.write(np.ascontiguousarray(np.asarray(obs[f.name]), dtype=f.dtype).tobytes())
    out.write(b"\n")
    out.flush()


def read_advice(stream: BinaryIO, advice: TensorSpec, timeout: float | None = 60.0) -> np.ndarray:
    raw = _Reader(stream, timeout).exact(advice.nbytes, "advice")
    return np.frombuffer(raw, dtype=advice.dtype).reshape(advice.shape)


# ----- the server ---------------------------------------------------------------------------------
Policy = Callable[[Mapping[str, np.ndarray]], int]


def hint_policy(obs: Mapping[str, np.ndarray]) -> int:
    """The valid candidate with the lowest estimated cost change while it lowers the cost, else the no-op.
    Needs `cand_hints` and `action_mask` (xrl.env.observation); a baseline needing no trained weights."""
    hints = np.asarray(obs["cand_hints"])[:, 0].astype(np.float64)
    hints[np.asarray(obs["action_mask"]) == 0] = np.inf
    hints[0] = np.inf
    best = int(np.argmin(hints))
    return best if hints[best] < 0 else 0


class PolicyServer:
    """Answers each observation read from `inp` with the policy's action written to `out`."""

    def __init__(self, policy: Policy = hint_policy, *, timeout: float | None = 60.0) -> None:
        self.policy, self.timeout = policy, timeout
        self.decisions = 0

    def serve(self, inp: BinaryIO, out: BinaryIO) -> int:
        """Run one exchange to its end; the number of decisions. Closes `out` however it ends."""
        try:
            reader = _Reader(inp, self.timeout)
            features, advice = read_header(reader)
            if math.prod(advice.shape) != 1 or advice.type not in ("int64", "int32"):
                raise PipeProtocolError(f"advice must be one integer, not {advice.to_dict()}")
            while (obs := read_message(reader, features, self.decisions)) is not None:
                action = np.full(advice.shape, int(self.policy(obs)), dtype=advice.dtype)
                try:
                    out.write(action.tobytes())
                    out.flush()
                except BrokenPipeError:
                    raise PipeProtocolError("the host closed its end of the advice pipe") from None
                self.decisions += 1
            return self.decisions
        finally:
            try:
                out.close()
            except BrokenPipeError:
                pass


def serve_pipes(in_path: str, out_path: str, policy: Policy = hint_policy, timeout: float | None = 60.0) -> int:
    """Open the host's pipes (IN first, then OUT) and serve one exchange."""
    inp = open(in_path, "rb", buffering=0)  # noqa: SIM115  (closed below; serve closes out)
    try:
        out = open(out_path, "wb", buffering=0)  # noqa: SIM115
        return PolicyServer(policy, timeout=timeout).serve(inp, out)
    finally:
        inp.close()
