"""ctypes binding of the native GPU timing harness (C ABI in cuda/include/xrl_timing.h).

The library is `cuda/build/libxrl_timing.so` (built by `make -C cuda`; `build()` runs it when nvcc
is on PATH) or the file named by $XRL_TIMING_LIB. It links the CUDA runtime statically, so it loads
on any machine; without a GPU, `device_count()` is 0.

What it times, and why it is native: CUDA events recorded on the caller's stream around each
repetition, enqueued back to back with a single host wait at the end, and an optional L2 flush (a
write of twice the L2 size) before each repetition outside the timed interval. A captured CUDA graph
is timed by its `cudaGraphExec_t` (`torch.cuda.CUDAGraph.raw_cuda_graph_exec()`, torch >= 2.9), so
no Python runs between repetitions; eager work is timed through a host callback that enqueues it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from xrl.errors import XrlError

ABI_VERSION = 1
LIB_ENV = "XRL_TIMING_LIB"
CUDA_DIR = Path(__file__).resolve().parents[2] / "cuda"  # the source tree's cuda/ (editable install)
EXPORTS = ("xrl_timing_abi_version", "xrl_timing_runtime_version", "xrl_timing_device_count", "xrl_timing_l2_bytes",
           "xrl_timing_time_callback", "xrl_timing_time_graph", "xrl_timing_time_spin", "xrl_timing_release",
           "xrl_timing_error_string")

CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class HarnessError(XrlError):
    """The native timing harness is missing, does not build, or reports a CUDA error."""


def library_path() -> Path:
    """Where the harness library is: $XRL_TIMING_LIB, else cuda/build/libxrl_timing.so."""
    env = os.environ.get(LIB_ENV)
    return Path(env) if env else CUDA_DIR / "build" / "libxrl_timing.so"


def build(*, nvcc: str | None = None, timeout_s: float = 300.0) -> Path:
    """Compile the harness with `make -C cuda` (nvcc from PATH unless given); returns the library path."""
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None:
        raise HarnessError("nvcc is not on PATH: install the CUDA toolkit (12 or 13) to build the timing harness, "
                           f"or point ${LIB_ENV} at a built libxrl_timing.so")
    if not (CUDA_DIR / "Makefile").exists():
        raise HarnessError(f"{CUDA_DIR}/Makefile not found: the harness builds from a source checkout of xrl; "
                           f"or point ${LIB_ENV} at a built libxrl_timing.so")
    proc = subprocess.run(["make", "-C", str(CUDA_DIR), f"NVCC={nvcc}"], capture_output=True, text=True,
                          timeout=timeout_s)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise HarnessError(f"building the timing harness failed (make -C {CUDA_DIR}): {tail[0]}")
    return CUDA_DIR / "build" / "libxrl_timing.so"


class Harness:
    """The loaded library. Times come back in seconds, one per repetition (per launch when inner > 1)."""

    def __init__(self, path: str | Path) -> None:
        try:
            self.lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise HarnessError(f"cannot load the timing harness {path}: {e}") from None
        self.path = Path(path)
        missing = [s for s in EXPORTS if not hasattr(self.lib, s)]
        if missing:
            raise HarnessError(f"{path} lacks {', '.join(missing)}: rebuild it with `make -C cuda`")
        self._declare()
        if self.abi_version != ABI_VERSION:
            raise HarnessError(f"{path} has ABI version {self.abi_version}, this xrl needs {ABI_VERSION}: "
                               f"rebuild it with `make -C cuda`")

    def _declare(self) -> None:
        lib, i, u, p, f = self.lib, ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float)
        pi = ctypes.POINTER(ctypes.c_int)
        sigs = {
            "xrl_timing_abi_version": (i, []),
            "xrl_timing_runtime_version": (i, []),
            "xrl_timing_device_count": (i, [pi]),
            "xrl_timing_l2_bytes": (i, [i, pi]),
            "xrl_timing_time_callback": (i, [i, ctypes.c_size_t, CALLBACK, p, i, i, i, i, f]),
            "xrl_timing_time_graph": (i, [i, ctypes.c_size_t, ctypes.c_size_t, i, i, i, i, f]),
            "xrl_timing_time_spin": (i, [i, ctypes.c_size_t, u, i, i, i, f]),
            "xrl_timing_release": (i, []),
            "xrl_timing_error_string": (ctypes.c_char_p, [i]),
        }
        for name, (res, args) in sigs.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args

    # ----- queries ------------------------------------------------------------------------------
    @property
    def abi_version(self) -> int:
        return int(self.lib.xrl_timing_abi_version())

    @property
    def runtime_version(self) -> int:
        """The CUDA runtime the library was built with, e.g. 13000 for 13.0."""
        return int(self.lib.xrl_timing_runtime_version())

    def error_string(self, status: int) -> str:
        return self.lib.xrl_timing_error_string(status).decode()

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise HarnessError(f"timing harness: {what} failed: {self.error_string(status)} (status {status})")

    def device_count(self) -> int:
        """CUDA devices visible; 0 without a GPU or driver (not an error)."""
        n = ctypes.c_int(-1)
        self._check(self.lib.xrl_timing_device_count(ctypes.byref(n)), "counting devices")
        return n.value

    def l2_bytes(self, device: int = 0) -> int:
        n = ctypes.c_int(0)
        self._check(self.lib.xrl_timing_l2_bytes(device, ctypes.byref(n)), f"querying device {device}'s L2 size")
        return n.value

    # ----- timing -------------------------------------------------------------------------------
    def time_graph(self, graph_exec: int, stream: int, *, device: int = 0, warmup: int = 3, repeats: int = 10,
                   inner: int = 1, flush_l2: bool = False) -> list[float]:
        """Seconds per launch of a CUDA graph executable (`cudaGraphExec_t` as an int) on `stream`."""
        out = (ctypes.c_float * repeats)()
        self._check(self.lib.xrl_timing_time_graph(device, stream, graph_exec, warmup, repeats, inner, int(flush_l2),
                                                   out), "timing a CUDA graph")
        return [t / 1e3 for t in out]

    def time_callback(self, fn: Callable[[], object], stream: int, *, device: int = 0, warmup: int = 3,
                      repeats: int = 10, inner: int = 1, flush_l2: bool = False) -> list[float]:
        """Seconds per call of `fn`, which must enqueue its GPU work on `stream` (e.g. torch's current stream).

        An exception in `fn` stops the remaining calls (they return at once) and is re-raised here.
        """
        errors: list[BaseException] = []

        def trampoline(_user: int | None) -> None:
            if errors:
                return
            try:
                fn()
            except BaseException as e:  # carried across the C frame, re-raised below
                errors.append(e)

        cb = CALLBACK(trampoline)  # kept referenced until the call returns
        out = (ctypes.c_float * repeats)()
        status = self.lib.xrl_timing_time_callback(device, stream, cb, None, warmup, repeats, inner, int(flush_l2), out)
        if errors:
            raise errors[0]
        self._check(status, "timing a callback")
        return [t / 1e3 for t in out]

    def time_spin(self, ns: int, stream: int = 0, *, device: int = 0, warmup: int = 2, repeats: int = 5,
                  flush_l2: bool = False) -> list[float]:
        """Self-test: seconds measured for a kernel that spins `ns` nanoseconds (should be about ns / 1e9)."""
        out = (ctypes.c_float * repeats)()
        self._check(self.lib.xrl_timing_time_spin(device, stream, ns, warmup, repeats, int(flush_l2), out),
                    "timing the spin kernel")
        return [t / 1e3 for t in out]

    def release(self) -> None:
        """Free the L2 flush buffers."""
        self._check(self.lib.xrl_timing_release(), "releasing flush buffers")


_lock = threading.Lock()
_loaded: Harness | None = None


def load(*, required: bool = True, build_if_missing: bool = True) -> Harness | None:
    """The harness, loaded once per process; built first when missing and nvcc is available.

    With `required` False, a harness that is missing and cannot be built gives None instead of an error.
    """
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        path = library_path()
        try:
            if not path.exists():
                if not build_if_missing or LIB_ENV in os.environ:
                    raise HarnessError(f"timing harness {path} not found: build it with `make -C cuda`")
                path = build()
            _loaded = Harness(path)
        except HarnessError:
            if required:
                raise
            return None
        return _loaded
