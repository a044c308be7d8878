"""Keeping libraries' own chatter off xrl's output.

Native libraries write to file descriptor 1 directly (HiGHS prints a banner when a solver is made),
past anything Python's sys.stdout does, and onnxruntime's default logger prints coloured warning
lines on stderr. `--json` promises exactly one JSON document on stdout and a user error promises
one line on stderr, so both are silenced here.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import TextIO


@contextlib.contextmanager
def native_stdout_silenced(keep: bool = False) -> Iterator[None]:
    """Send what native code writes to fd 1 to /dev/null for the duration (a no-op when `keep`)."""
    if keep:
        yield
        return
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no fd 1 at all (a daemon): nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def stdout_reserved(enabled: bool = True) -> Iterator[TextIO]:
    """While a command runs, everything that would reach stdout (print, native writes) goes to stderr;
    the stream yielded is the real stdout, for the one document the command prints."""
    if not enabled:
        yield sys.stdout
        return
    real = sys.stdout
    with contextlib.suppress(Exception):
        real.flush()
    try:
        fd = real.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        fd = -1
    if fd != 1:  # stdout is not the process's fd 1 (captured in a test): only Python-level output moves
        sys.stdout = sys.stderr
        try:
            yield real
        finally:
            sys.stdout = real
        return
    saved = os.dup(1)
    out = os.fdopen(saved, "w", encoding=getattr(real, "encoding", None) or "utf-8", closefd=False)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        yield out
    finally:
        with contextlib.suppress(Exception):
            out.flush()
        sys.stdout = real
        os.dup2(saved, 1)
        os.close(saved)


_ORT_QUIET = False


def quiet_onnxruntime() -> None:
    """onnxruntime's process-wide logger at errors only (its per-session option misses the warnings
    printed while the environment is created); once per process."""
    global _ORT_QUIET
    if _ORT_QUIET:
        return
    import onnxruntime as ort

    with contextlib.suppress(Exception):
        ort.set_default_logger_severity(3)
    _ORT_QUIET = True
