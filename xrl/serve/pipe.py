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

import errno
import json
import math
import os
import select
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from xrl.errors import ConfigError, XrlError

DTYPES = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32, "int8": np.int8,
          "uint8": np.uint8, "bool": np.bool_}
MAX_LINE = 1 << 20  # a header or observation line longer than this is malformed
MAX_FEATURES = 64  # as clients/c/xrl_client.c
MAX_RANK = 8
MAX_DEPTH = 32  # JSON nesting of a header, as clients/c/xrl_client.c
CHUNK = 1 << 16  # bytes read or written per system call


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
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.elements * self.dtype.itemsize

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "type": self.type}

    @staticmethod
    def parse(d: Any) -> TensorSpec:
        """A spec from the header; its size is checked against XRL_MAX_ELEMENTS here, before anything is
        allocated for it (a declared size is a claim of the other side, not a fact)."""
        from xrl.limits import MAX_ELEMENTS_ENV, max_elements

        if not isinstance(d, dict) or set(d) - {"name", "shape", "type"}:
            raise PipeProtocolError(f"malformed tensor spec {_brief(d)}: expected {{\"name\", \"shape\", \"type\"}}")
        name, shape, kind = d.get("name"), d.get("shape"), d.get("type")
        if not isinstance(name, str) or not name or len(name) > 256:
            raise PipeProtocolError(f"malformed tensor spec {_brief(d)}: its name must be a string of 1-256 chars")
        if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise PipeProtocolError(f"malformed tensor spec {_brief(d)}: its shape must be a list of at most "
                                    f"{MAX_RANK} non-negative integers")
        if kind not in DTYPES:
            raise PipeProtocolError(f"tensor spec {_brief(d)}: type must be one of {', '.join(DTYPES)}")
        spec = TensorSpec(name, tuple(shape), kind)
        limit = max_elements()
        if spec.elements > limit:
            raise PipeProtocolError(f"tensor {name!r} declares {spec.elements:,} elements, over xrl's limit of "
                                    f"{limit:,} per tensor (raise it with {MAX_ELEMENTS_ENV}=N)")
        return spec


def _brief(d: Any) -> str:
    text = repr(d)
    return text if len(text) <= 120 else text[:117] + "..."


def specs_of(observation: Mapping[str, Any]) -> list[TensorSpec]:
    """Tensor specs of a gymnasium Dict observation (every value as an array)."""
    out = []
    for name, value in observation.items():
        arr = np.asarray(value)
        out.append(TensorSpec(name, tuple(arr.shape), np.dtype(arr.dtype).name))
    return out


# ----- opening the pipes: both ends with a deadline --------------------------------------------------
def check_fifos(*paths: str) -> None:
    """Each path must be a named pipe (never a file a user keeps: opening one for writing would have
    truncated it), and no two the same pipe. ConfigError otherwise."""
    seen: dict[tuple[int, int], str] = {}
    for p in paths:
        try:
            st = os.stat(p)
        except OSError as e:
            raise ConfigError(f"{p}: {e.strerror or e}; the host creates both pipes (mkfifo) before it starts "
                              "the server") from None
        if not stat.S_ISFIFO(st.st_mode):
            raise ConfigError(f"{p} is not a named pipe (mkfifo); xrl serve reads and writes only pipes, never files")
        key = (st.st_dev, st.st_ino)
        if key in seen:
            raise ConfigError(f"--in and --out are the same pipe ({seen[key]} and {p}); the host creates two")
        seen[key] = p


def open_fifo(path: str, mode: str, timeout: float | None) -> int:
    """A non-blocking fd on the named pipe `path`, for reading ("r") or writing ("w"). Opening for
    writing waits (at most `timeout` seconds) for a reader; opening for reading returns at once, and
    the first read waits (at most `timeout`) for a writer and its data. Nothing blocks in open()."""
    if mode == "r":
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    else:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.005
        while True:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # never O_TRUNC
                break
            except OSError as e:
                if e.errno != errno.ENXIO:  # ENXIO: no reader yet
                    raise PipeProtocolError(f"cannot open {path}: {e.strerror}") from None
            if deadline is not None and time.monotonic() >= deadline:
                raise PipeProtocolError(f"the other side did not open {path} for reading within {timeout:g} s")
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):  # replaced by a file since it was checked
        os.close(fd)
        raise ConfigError(f"{path} is not a named pipe")
    return fd


def _poll(fd: int, event: int, timeout: float | None) -> bool:
    p = select.poll()
    p.register(fd, event)
    return bool(p.poll(None if timeout is None else max(0, int(timeout * 1000))))


# ----- reading ------------------------------------------------------------------------------------
class _Reader:
    """Reads from a stream (an fd when it has one), each wait at most `timeout` seconds."""

    def __init__(self, stream: BinaryIO | int, timeout: float | None) -> None:
        self.timeout = timeout
        self.stream = None if isinstance(stream, int) else stream
        if isinstance(stream, int):
            self.fd: int | None = stream
        else:
            try:
                self.fd = stream.fileno()
            except (AttributeError, OSError, ValueError):
                self.fd = None
        self.buf = bytearray()  # read past the last line: the start of what follows

    def _chunk(self, n: int, what: str) -> bytes:
        """Up to n bytes (at least one; b"" at end of file), waiting at most the timeout for them."""
        if self.fd is None:
            return self.stream.read(n)
        while True:
            if self.timeout is not None and not _poll(self.fd, select.POLLIN | select.POLLHUP, self.timeout):
                raise PipeProtocolError(f"no data for {self.timeout:g} s while reading {what}")
            try:
                return os.read(self.fd, n)
            except BlockingIOError:  # a non-blocking fd with no writer yet: wait again
                if self.timeout is None:
                    _poll(self.fd, select.POLLIN | select.POLLHUP, 0.05)
                continue

    def exact_into(self, out: memoryview, what: str) -> None:
        """Fill `out` (bytes) exactly."""
        n, got = len(out), 0
        take = min(len(self.buf), n)
        out[:take] = self.buf[:take]
        del self.buf[:take]
        got = take
        while got < n:
            chunk = self._chunk(min(CHUNK, n - got), what)
            if not chunk:
                raise PipeProtocolError(f"truncated {what}: {got} of {n} bytes before the pipe closed")
            out[got:got + len(chunk)] = chunk
            got += len(chunk)

    def exact(self, n: int, what: str) -> bytes:
        out = bytearray(n)
        self.exact_into(memoryview(out), what)
        return bytes(out)

    def line(self, what: str, eof_ok: bool = False) -> bytes | None:
        start = 0
        while True:
            i = self.buf.find(b"\n", start)
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 1]
                return line
            if len(self.buf) > MAX_LINE:
                raise PipeProtocolError(f"malformed {what}: no newline in {MAX_LINE} bytes")
            start = len(self.buf)
            chunk = self._chunk(4096, what)  # a line is short: read little past it
            if not chunk:
                if eof_ok and not self.buf:
                    return None
                raise PipeProtocolError(f"truncated {what}: the pipe closed mid-line")
            self.buf += chunk


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):  # JSON leaves it open; the C client refuses, and so does the server
        raise ValueError(f"a key appears twice in one object ({', '.join(sorted(keys))})")
    return dict(pairs)


def _json(line: bytes, what: str) -> Any:
    try:
        return json.loads(line, object_pairs_hook=_no_duplicates)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError, as is a 5000-digit number
        raise PipeProtocolError(f"malformed {what}: not a JSON line ({str(e)[:120]})") from None
    except RecursionError:
        raise PipeProtocolError(f"malformed {what}: JSON nested too deeply") from None


def _depth(value: Any) -> int:
    """How deeply a parsed JSON value nests (iteratively: no recursion limit to hit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def read_header(reader: _Reader) -> tuple[list[TensorSpec], TensorSpec]:
    from xrl.limits import MAX_ELEMENTS_ENV, max_elements

    head = _json(reader.line("header"), "header")
    if _depth(head) > MAX_DEPTH:
        raise PipeProtocolError(f"malformed header: JSON nested deeper than {MAX_DEPTH}")
    if not isinstance(head, dict) or not isinstance(head.get("features"), list) or "advice" not in head:
        raise PipeProtocolError("malformed header: expected {\"features\": [...], \"advice\": {...}}")
    if len(head["features"]) > MAX_FEATURES:
        raise PipeProtocolError(f"malformed header: {len(head['features'])} features, at most {MAX_FEATURES}")
    features = [TensorSpec.parse(f) for f in head["features"]]
    names = [f.name for f in features]
    if len(set(names)) != len(names):
        raise PipeProtocolError(f"malformed header: a feature name appears twice ({', '.join(names)})")
    total, limit = sum(f.nbytes for f in features), max_elements() * 4
    if total > limit:  # all the buffers of one observation together: as much as one float32 tensor at the limit
        raise PipeProtocolError(f"the header's features take {total:,} bytes per observation, over xrl's limit of "
                                f"{limit:,} (4 x {MAX_ELEMENTS_ENV})")
    return features, TensorSpec.parse(head["advice"])


def read_message(reader: _Reader, features: list[TensorSpec], expect: int) -> dict[str, np.ndarray] | None:
    """One observation (None at a clean end of the exchange)."""
    line = reader.line(f"observation {expect} line", eof_ok=True)
    if line is None:
        return None
    msg = _json(line, f"observation {expect} line")
    if not isinstance(msg, dict) or msg.get("observation") != expect or isinstance(msg.get("observation"), bool):
        raise PipeProtocolError(f"malformed observation line {line[:80]!r}: expected {{\"observation\": {expect}}}")
    out = {}
    for f in features:
        # filled in place as the bytes arrive: memory grows with what the host sends, once, not twice
        arr = np.empty(f.shape, dtype=f.dtype)
        reader.exact_into(memoryview(arr).cast("B") if arr.nbytes else memoryview(bytearray()),
                          f"feature {f.name!r} of observation {expect}")
        out[f.name] = arr
    if reader.exact(1, f"the newline ending observation {expect}") != b"\n":
        raise PipeProtocolError(f"malformed observation {expect}: its buffers are longer than the header says")
    return out


# ----- writing (the host's side, the server's advice, and the tests') -------------------------------
class FifoWriter:
    """Writes to a non-blocking pipe fd, each wait for room at most `timeout` seconds (a reader that
    stops reading fills the pipe: the writer then fails instead of blocking for good)."""

    def __init__(self, fd: int, timeout: float | None, what: str = "the pipe") -> None:
        self.fd, self.timeout, self.what = fd, timeout, what

    def write(self, data: bytes) -> int:
        view = memoryview(data).cast("B")
        while view:
            if not _poll(self.fd, select.POLLOUT, self.timeout):
                raise PipeProtocolError(f"the other side read nothing from {self.what} for {self.timeout:g} s")
            try:
                k = os.write(self.fd, view[:CHUNK])
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise PipeProtocolError(f"the other side closed {self.what}") from None
            view = view[k:]
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> FifoWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_header(out: BinaryIO, features: list[TensorSpec], advice: TensorSpec) -> None:
    out.write(json.dumps({"features": [f.to_json() for f in features], "advice": advice.to_json()}).encode() + b"\n")
    out.flush()


def write_observation(out: BinaryIO, features: list[TensorSpec], obs: Mapping[str, Any], index: int) -> None:
    out.write(json.dumps({"observation": index}).encode() + b"\n")
    for f in features:
        out.write(np.ascontiguousarray(np.asarray(obs[f.name]), dtype=f.dtype).tobytes())
    out.write(b"\n")
    out.flush()


def read_advice(stream: BinaryIO | int, advice: TensorSpec, timeout: float | None = 60.0) -> np.ndarray:
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


# The features a policy reads, by name: their rank (checked against the header before any observation).
hint_policy.requires = {"cand_hints": 2, "action_mask": 1}  # type: ignore[attr-defined]


def check_features(policy: Policy, features: list[TensorSpec]) -> None:
    """PipeProtocolError unless the header declares every feature the policy reads, with its rank."""
    declared = {f.name: f for f in features}
    for name, rank in (getattr(policy, "requires", None) or {}).items():
        if name not in declared:
            raise PipeProtocolError(f"the header declares no feature {name!r}, which this policy reads "
                                    f"(declared: {', '.join(declared) or 'none'})")
        if len(declared[name].shape) != rank:
            raise PipeProtocolError(f"feature {name!r} has shape {list(declared[name].shape)}; this policy reads "
                                    f"a tensor of rank {rank}")
    if policy is hint_policy:
        hints, mask = declared["cand_hints"].shape, declared["action_mask"].shape
        if hints[0] != mask[0] or hints[1] < 1:
            raise PipeProtocolError(f"cand_hints {list(hints)} and action_mask {list(mask)} must have one row per "
                                    "action and at least one hint")


class PolicyServer:
    """Answers each observation read from `inp` with the policy's action written to `out`."""

    def __init__(self, policy: Policy = hint_policy, *, timeout: float | None = 60.0) -> None:
        self.policy, self.timeout = policy, timeout
        self.decisions = 0

    def _choose(self, obs: Mapping[str, np.ndarray], advice: TensorSpec) -> np.ndarray:
        try:
            action = self.policy(obs)
        except (KeyError, IndexError, ValueError, TypeError) as e:  # the observation is not what the policy reads
            raise PipeProtocolError(f"the policy cannot read observation {self.decisions} "
                                    f"({type(e).__name__}: {str(e)[:120]})") from None
        info = np.iinfo(advice.dtype)
        if not isinstance(action, int | np.integer) or not 0 <= int(action) <= info.max:
            raise PipeProtocolError(f"the policy answered {action!r}, not an action index")
        return np.full(advice.shape, int(action), dtype=advice.dtype)

    def serve(self, inp: BinaryIO | int, out: BinaryIO | FifoWriter) -> int:
        """Run one exchange to its end; the number of decisions. Closes `out` however it ends."""
        try:
            reader = _Reader(inp, self.timeout)
            features, advice = read_header(reader)
            if math.prod(advice.shape) != 1 or advice.type not in ("int64", "int32"):
                raise PipeProtocolError(f"advice must be one integer, not {advice.to_json()}")
            check_features(self.policy, features)
            while (obs := read_message(reader, features, self.decisions)) is not None:
                action = self._choose(obs, advice)
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


def check_timeout(timeout: float | None) -> float | None:
    """--timeout: positive seconds, or inf for none (None)."""
    if timeout is None or timeout == math.inf:
        return None
    if not timeout > 0 or math.isnan(timeout):
        raise ConfigError(f"--timeout must be a positive number of seconds (or inf), not {timeout}")
    return float(timeout)


def serve_pipes(in_path: str, out_path: str, policy: Policy = hint_policy, timeout: float | None = 60.0) -> int:
    """Open the host's pipes (IN first, then OUT) and serve one exchange. Both must be named pipes, and
    distinct; every wait (the host opening OUT, each message, room for each answer) ends after `timeout`."""
    timeout = check_timeout(timeout)
    check_fifos(in_path, out_path)
    inp = open_fifo(in_path, "r", timeout)
    try:
        out = FifoWriter(open_fifo(out_path, "w", timeout), timeout, f"the advice pipe {out_path}")
        return PolicyServer(policy, timeout=timeout).serve(inp, out)
    finally:
        os.close(inp)
