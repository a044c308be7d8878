"""Where xrl keeps what it learned about this machine and this code between runs: `$XRL_CACHE_DIR`, else
~/.cache/xrl (op and kernel timings, the CPU calibration, rule verification outcomes)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "XRL_CACHE_DIR"


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path.home() / ".cache" / "xrl"
