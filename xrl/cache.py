"""Where xrl keeps what it learned about this machine and this code between runs: `$XRL_CACHE_DIR`, else
~/.cache/xrl (op and kernel timings, the CPU calibration, rule verification outcomes, parsed rules), and the
per-install secret that keys what is read back from there (`cache_secret`): a file planted or edited in the
cache folder is refused, not trusted."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "XRL_CACHE_DIR"


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path.home() / ".cache" / "xrl"


# The per-install secret that keys every row's checksum, beside the cache files (mode 0600)
SECRET_FILE = "cache.key"
_SECRET_BYTES = 32


def cache_secret(directory: Path) -> bytes:
    """The install's secret in `directory/cache.key`: 32 random bytes, readable by the user alone (0600).
    Made atomically where missing or damaged: written in full under a temporary name (created 0600), then
    linked into place, so a concurrent process either finds the whole file or makes its own and takes the
    one that got there first. A damaged key is replaced: every row is then refused and measured again."""
    import secrets

    path = directory / SECRET_FILE
    for _ in range(5):
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                data = f.read(_SECRET_BYTES + 1)
            if st.st_mode & 0o077 and st.st_uid == os.getuid():
                os.chmod(path, 0o600)  # private to the user: another user who reads it could forge rows
            if len(data) == _SECRET_BYTES:
                return data
        except FileNotFoundError:
            data = None
        tmp = directory / f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_bytes(_SECRET_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            if data is None:
                os.link(tmp, path)  # fails if another process made it meanwhile: theirs is read next time round
            else:
                os.replace(tmp, path)  # damaged (a short file): replaced whole
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    raise OSError(f"cannot make the cache's key {path}")
