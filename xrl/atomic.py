"""Atomic file writes: every file xrl writes for others to read (models, checkpoints, state files, the
calibration, exported policies, sweep summaries) appears whole or not at all.

A write goes to a temporary of this writer's own beside the destination, `.{name}.{pid}.{random}{suffix}`
(unique, so two writers of one file never share one; the pid lets a later run tell a dead writer's
leftovers from a live one's: `remove_stale_temporaries`), is flushed to disk, given the permissions a plain
`open` would give, and renamed over the destination in one step. If the block raises (an error, Ctrl-C,
or SIGTERM, which the CLI raises as an exception in the main thread) the temporary is removed and the
destination is left as it was.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

TEMP_SUFFIX = ".tmp"
LEGACY_TEMP_AGE_S = 3600  # temporaries without a pid in the name (older xrl): removed once this old


class PendingFile:
    """The temporary an `atomic_write` block fills: write to `temp` by name or through `open()`.
    `destination` may be changed before the block ends (a name that depends on the contents)."""

    def __init__(self, temp: Path, destination: Path) -> None:
        self.temp = temp
        self.destination = destination

    def open(self, mode: str = "wb", **kwargs: object) -> IO:
        if not mode.startswith("w"):
            raise ValueError(f"a pending file is opened for writing, not {mode!r}")
        return open(self.temp, mode, **kwargs)  # noqa: SIM115 - the caller's `with` closes it


def temp_prefix(path: Path) -> str:
    """The name every temporary of a write to `path` by this process starts with."""
    return f".{path.name}.{os.getpid()}."


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, *, suffix: str = TEMP_SUFFIX, mkdir: bool = False,
                 permissions: int | None = None) -> Iterator[PendingFile]:
    """Fill the yielded PendingFile; on a normal exit it replaces `path` (see the module docstring).
    `mkdir` creates the destination's folder; `permissions` default to 0o666 less the umask."""
    path = Path(path)
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=temp_prefix(path), suffix=suffix, dir=path.parent)
    os.close(fd)
    pending = PendingFile(Path(name), path)
    try:
        yield pending
        with open(pending.temp, "rb+") as f:  # what the block wrote by name is on disk before the rename
            os.fsync(f.fileno())
        os.chmod(pending.temp, permissions if permissions is not None else 0o666 & ~_umask())  # mkstemp: 0600
        os.replace(pending.temp, pending.destination)
    except BaseException:
        with contextlib.suppress(OSError):
            pending.temp.unlink()
        raise


def write_atomic(path: str | os.PathLike, data: bytes | str | Iterable[bytes], *, mkdir: bool = False,
                 permissions: int | None = None) -> Path:
    """Write `data` (bytes, text as UTF-8, or chunks of bytes) to `path` atomically; returns the path."""
    with atomic_write(path, mkdir=mkdir, permissions=permissions) as pending, pending.open("wb") as f:
        if isinstance(data, str):
            f.write(data.encode("utf-8"))
        elif isinstance(data, bytes | bytearray | memoryview):
            f.write(data)
        else:
            for chunk in data:
                f.write(chunk)
    return Path(path)


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporaries of writes to `path` whose writer is gone (killed mid-write); returns them."""
    import glob

    removed = []
    prefix = f".{path.name}."
    for p in path.parent.glob(f"{glob.escape(prefix)}*{TEMP_SUFFIX}"):
        pid = p.name[len(prefix):].split(".", 1)[0]
        stale = False
        if pid.isdigit():
            stale = not _pid_alive(int(pid))
        else:
            with contextlib.suppress(OSError):
                stale = time.time() - p.stat().st_mtime > LEGACY_TEMP_AGE_S
        if stale:
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p)
    return removed


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, under another user
        return True
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
