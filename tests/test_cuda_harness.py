"""The native GPU timing harness (cuda/): it compiles with nvcc, exports its C ABI, loads and fails cleanly
without a GPU; on a GPU (tests marked `gpu`), its timings are accurate and ordered."""

from __future__ import annotations

import ctypes
import ctypes.util
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from xrl.cost import cuda_harness
from xrl.cost.cuda_harness import EXPORTS, Harness, HarnessError

HAS_GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The harness compiled from cuda/ into a fresh directory (the Makefile's BUILD), not the shared build."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH: the CUDA toolkit is needed to build the harness")
    out = tmp_path_factory.mktemp("harness")
    proc = subprocess.run(["make", "-C", str(cuda_harness.CUDA_DIR), f"BUILD={out}", f"NVCC={nvcc}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    path = out / "libxrl_timing.so"
    assert path.exists()
    return path


@pytest.fixture(scope="module")
def harness(lib: Path) -> Harness:
    return Harness(lib)


def test_library_exports_exactly_the_c_abi(lib: Path) -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm is not on PATH")
    out = subprocess.run([nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split()[1:2] == ["T"]}
    # only the harness: the statically linked CUDA runtime must not interpose on torch's libcudart
    assert exported == set(EXPORTS)


def test_loads_and_reports_versions(harness: Harness) -> None:
    assert harness.abi_version == cuda_harness.ABI_VERSION
    assert harness.runtime_version >= 12000  # CUDA 12 or 13
    assert harness.error_string(0) == "success"
    assert "invalid argument" in harness.error_string(-1)
    assert "captured" in harness.error_string(-2)
    assert harness.error_string(100)  # a CUDA runtime code: named by cudaGetErrorString


def test_device_count_agrees_with_torch(harness: Harness) -> None:
    # Without a GPU (or a driver) this is 0 and no error, not a crash or an exception.
    assert harness.device_count() == torch.cuda.device_count()
    assert harness.device_count() == torch.cuda.device_count()  # no sticky error from the first call


def test_invalid_arguments_are_rejected_before_touching_the_gpu(harness: Harness) -> None:
    with pytest.raises(HarnessError, match="invalid argument"):
        harness.time_graph(0, 0)  # a null cudaGraphExec_t
    with pytest.raises(HarnessError, match="invalid argument"):
        harness.time_spin(1000, 0, repeats=0)
    status = harness.lib.xrl_timing_device_count(None)
    assert status == -1


@pytest.mark.skipif(HAS_GPU, reason="checks the errors on a machine without a GPU")
def test_gpu_calls_fail_cleanly_without_a_gpu(harness: Harness) -> None:
    with pytest.raises(HarnessError, match="failed: .*status"):
        harness.l2_bytes(0)
    with pytest.raises(HarnessError, match="failed"):
        harness.time_spin(1000)
    calls = []
    with pytest.raises(HarnessError):
        harness.time_callback(lambda: calls.append(1), 0)
    assert calls == []  # the device check comes before any call
    harness.release()  # nothing allocated: a no-op


def test_a_library_with_the_wrong_abi_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="cannot load"):
        Harness(tmp_path / "missing.so")
    libc = ctypes.util.find_library("c")
    if libc:
        with pytest.raises(HarnessError, match="lacks xrl_timing_abi_version"):
            Harness(libc)


def test_load_prefers_the_env_variable(lib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_harness, "_loaded", None)
    monkeypatch.setenv(cuda_harness.LIB_ENV, str(lib.parent / "nope.so"))
    with pytest.raises(HarnessError, match="not found: build it with `make -C cuda`"):
        cuda_harness.load()
    assert cuda_harness.load(required=False) is None
    monkeypatch.setenv(cuda_harness.LIB_ENV, str(lib))
    h = cuda_harness.load()
    assert h is not None and h.path == lib and cuda_harness.load() is h


# ----- on a GPU -------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_gpu
def test_spin_kernel_timings_are_accurate(harness: Harness) -> None:
    stream = torch.cuda.current_stream().cuda_stream
    for us in (50, 400):
        times = harness.time_spin(us * 1000, stream, repeats=10)
        med = sorted(times)[len(times) // 2]
        assert us * 1e-6 * 0.95 < med < us * 1e-6 * 1.25, (us, times)
    assert harness.l2_bytes(0) > 1 << 20


def _captured(fn) -> torch.cuda.CUDAGraph:
    """fn captured into a CUDA graph, after one warm-up run outside the capture (cuBLAS handle, workspace)."""
    stream = torch.cuda.current_stream()
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        fn()
    stream.wait_stream(side)
    with torch.cuda.graph(g):
        fn()
    return g


def _matmul_times(harness: Harness, n: int, *, graph: bool, flush: bool = False) -> float:
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    out = torch.empty(n, n, device="cuda")
    stream = torch.cuda.current_stream()
    if graph:
        g = _captured(lambda: torch.matmul(a, b, out=out))
        times = harness.time_graph(int(g.raw_cuda_graph_exec()), stream.cuda_stream, repeats=20, flush_l2=flush)
    else:
        times = harness.time_callback(lambda: torch.matmul(a, b, out=out), stream.cuda_stream, repeats=20,
                                      flush_l2=flush)
    return sorted(times)[len(times) // 2]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("graph", [False, True])
def test_matmul_timings_are_ordered_and_plausible(harness: Harness, graph: bool) -> None:
    small, big = _matmul_times(harness, 512, graph=graph), _matmul_times(harness, 4096, graph=graph)
    assert 0 < small < big
    flops = 2 * 4096**3
    assert 1e12 < flops / big < 2e15  # between 1 TFLOP/s and 2 PFLOP/s: the time is the kernel's


@pytest.mark.gpu
@needs_gpu
def test_l2_flush_slows_a_cache_resident_op(harness: Harness) -> None:
    # Replayed as a CUDA graph: timed as eager launches, the host's launch gap falls inside the unflushed
    # repetitions but behind the flush's memset in the flushed ones, and an H200 measured cold 6.5 us
    # against warm 7.7 us that way.
    x = torch.randn(4 << 20, device="cuda")  # 16 MiB: stays in L2 (50 MB on an H100, 60 on an H200) unless flushed
    stream = torch.cuda.current_stream().cuda_stream
    g = _captured(lambda: x.mul_(1.0))  # held: its executable lives as long as it does
    exec_ = int(g.raw_cuda_graph_exec())
    warm = sorted(harness.time_graph(exec_, stream, repeats=31))[15]
    cold = sorted(harness.time_graph(exec_, stream, repeats=31, flush_l2=True))[15]
    assert cold >= warm * 0.98  # never faster, and usually slower, from a cold L2


@pytest.mark.gpu
@needs_gpu
def test_callback_exceptions_propagate(harness: Harness) -> None:
    def boom() -> None:
        raise ValueError("from the callback")

    with pytest.raises(ValueError, match="from the callback"):
        harness.time_callback(boom, torch.cuda.current_stream().cuda_stream)
