"""Calibrate the CPU roofline against this machine's onnxruntime: measured once, cached on disk.

The `cpu` profile is a generic two-core desktop. The ort-cpu target's estimate is only as good as
its rates, so `xrl calibrate` measures them here, with onnxruntime (ORT_ENABLE_ALL, one intra-op
thread unless told otherwise), on single-op models built in memory:

    per-kernel overhead   a chain of 1 vs 65 Relus on 256 floats: the slope per op
    bandwidth             a chain of 1 vs 5 Relus on 16 MiB: bytes read and written per second
    GEMM rate             MatMul [M, K] x [K, N] over sizes from 0.03 to 270 MFLOP; the fastest rate is
                          the peak, and the saturation work S (where a kernel reaches it) is fitted to
                          the smaller sizes' rates under the roofline's e(F) = min(1, F / S) ** 0.5

Each figure is the median of `repeats` timed runs after a warm-up. The profile is written to
`$XRL_CACHE_DIR/cpu_calibration.json` (default ~/.cache/xrl) with the machine, onnxruntime version
and thread count it was measured for; the ort-cpu target uses it as the profile `cpu-local` when it
matches this machine (`calibrated_profile()`), and the generic `cpu` profile otherwise. Delete the
file, or set XRL_NO_CALIBRATION=1, to go back to the generic profile.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from xrl.cost.devices import DEVICE_PROFILES, DeviceProfile

CALIBRATION_FILE = "cpu_calibration.json"
PROFILE_NAME = "cpu-local"
GEMM_SIZES = ((1, 128, 128), (1, 512, 512), (16, 256, 256), (64, 256, 512), (128, 768, 768), (128, 768, 3072))
SATURATION_EXPONENT = 0.5


@dataclass(frozen=True)
class Calibration:
    machine: str
    onnxruntime: str
    threads: int
    launch_overhead_s: float
    bandwidth: float
    peak_flops: float
    saturation_flops: float
    gemm_rates: dict[str, float]  # "MxKxN" -> measured FLOP/s

    def profile(self) -> DeviceProfile:
        return DeviceProfile(PROFILE_NAME, self.peak_flops, self.bandwidth, self.launch_overhead_s, 1.0, 1.0,
                             f"this CPU as onnxruntime {self.onnxruntime} runs it with {self.threads} thread(s), "
                             f"calibrated by `xrl calibrate`", saturation_flops=self.saturation_flops,
                             saturation_exponent=SATURATION_EXPONENT)


def machine_id() -> str:
    """What the calibration is valid for: the CPU model and the number of cores."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} x{os.cpu_count()}"


def calibration_path() -> Path:
    from xrl.cost.op_measured import cache_dir

    return cache_dir() / CALIBRATION_FILE


def _session(nodes, inits, x_shape, y_name, y_shape, threads: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    g = helper.make_graph(nodes, "calibration", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info(y_name, TensorProto.FLOAT, y_shape)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _median_run(sess, x: np.ndarray, repeats: int) -> float:
    for _ in range(max(3, repeats // 10)):
        sess.run(None, {"x": x})
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        sess.run(None, {"x": x})
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _relu_chain(n: int, shape: list[int], threads: int):
    from onnx import helper

    nodes = [helper.make_node("Relu", ["x" if i == 0 else f"v{i}"], [f"v{i + 1}"]) for i in range(n)]
    return _session(nodes, [], shape, f"v{n}", shape, threads)


def calibrate(threads: int = 1, repeats: int = 50, seed: int = 0) -> Calibration:
    """Measure this machine (about 10-30 s)."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    small = rng.standard_normal((1, 256)).astype(np.float32)
    t1 = _median_run(_relu_chain(1, [1, 256], threads), small, repeats)
    t65 = _median_run(_relu_chain(65, [1, 256], threads), small, repeats)
    overhead = max((t65 - t1) / 64, 1e-8)
    big = rng.standard_normal((4096, 1024)).astype(np.float32)
    b1 = _median_run(_relu_chain(1, [4096, 1024], threads), big, max(5, repeats // 5))
    b5 = _median_run(_relu_chain(5, [4096, 1024], threads), big, max(5, repeats // 5))
    # one Relu's time: the difference of the chains, unless noise ate it (a busy machine: b5 <= b1 was seen),
    # then the long chain's time per Relu, which also counts the input's copy (a lower bandwidth, not 1e17)
    per_relu = (b5 - b1) / 4 - overhead
    whole = b5 / 5 - overhead
    bandwidth = 2 * big.nbytes / max(per_relu if per_relu > 0.5 * whole else whole, 1e-9)
    rates: dict[str, float] = {}
    for m, k, n in GEMM_SIZES:
        w = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w")
        sess = _session([helper.make_node("MatMul", ["x", "w"], ["y"])], [w], [m, k], "y", [m, n], threads)
        t = _median_run(sess, rng.standard_normal((m, k)).astype(np.float32), repeats)
        flops = 2 * m * k * n
        # the roofline adds the overhead and takes the larger of compute and traffic: invert that
        traffic = 4 * (m * k + k * n + m * n) / bandwidth
        rates[f"{m}x{k}x{n}"] = flops / max(t - overhead, traffic, 1e-9)
    peak = max(rates.values())
    saturation = _fit_saturation({_flops(key): r / peak for key, r in rates.items()})
    return Calibration(machine_id(), ort.__version__, threads, overhead, bandwidth, peak, saturation, rates)


def _flops(key: str) -> int:
    m, k, n = (int(v) for v in key.split("x"))
    return 2 * m * k * n


def _fit_saturation(efficiency: dict[int, float]) -> float:
    """The S minimising the squared log error of min(1, F / S) ** a against the measured efficiencies."""
    best, best_err = 0.0, math.inf
    for s in np.geomspace(1e4, 1e10, 241):
        err = sum((math.log(min(1.0, f / s) ** SATURATION_EXPONENT) - math.log(max(e, 1e-6))) ** 2
                  for f, e in efficiency.items())
        if err < best_err:
            best, best_err = float(s), err
    return best


def save(cal: Calibration, path: Path | None = None) -> Path:
    from xrl.atomic import write_atomic

    # a temporary of this writer's own (two `xrl calibrate` at once must not share one), then an atomic
    # rename: a reader sees the old calibration or the new one
    return write_atomic(path or calibration_path(), json.dumps(asdict(cal), indent=2), mkdir=True)


def load(path: Path | None = None) -> Calibration | None:
    try:
        data = json.loads((path or calibration_path()).read_text())
        return Calibration(**data)
    except (OSError, ValueError, TypeError):
        return None


def calibrated_profile(threads: int = 1) -> DeviceProfile | None:
    """This machine's calibrated profile (registered as `cpu-local`), or None when there is none for it."""
    if os.environ.get("XRL_NO_CALIBRATION"):
        return None
    cal = load()
    if cal is None or cal.machine != machine_id() or cal.threads != threads:
        return None
    import onnxruntime as ort

    if cal.onnxruntime != ort.__version__:
        return None
    profile = cal.profile()
    DEVICE_PROFILES[PROFILE_NAME] = profile
    return profile
