"""Named device profiles for the analytic cost model: peak rates, efficiencies and per-kernel overhead.

Peak compute is the **FP32 CUDA-core** rate (non-tensor-core) on every GPU. The graphs xrl optimises
are float32, FP32 GEMMs in onnxruntime and PyTorch do not use TF32 by default, and the older
devices (V100, GTX 1080) have no TF32 at all, so one convention keeps the profiles comparable. The
same peak is used for every dtype: bytes follow the dtype, FLOP rates do not.

Sources: vendor datasheets (H100 SXM5, A100 SXM4 80GB, V100 SXM2, GTX 1080 Founders Edition at
boost clock).

`saturation_flops` is the work from which a GEMM/conv fills the device; smaller kernels leave units
idle (see `xrl.cost.analytic` for how efficiency falls below it). Every profile sets it to the work
of `SATURATION_S` = 20 us at full efficiency. On an H100 that is 0.94 GFLOP, close to one
128x128-output tile with a 256-deep reduction on each of its 132 SMs (1.1 GFLOP). One time for all
devices, rather than one tile per SM, keeps a faster device faster on every kernel: per-SM rates
differ (a GTX 1080 SM has twice a V100 SM's FP32 lanes), and libraries pick smaller tiles on wider
GPUs, so SM count alone would make a GTX 1080 beat a V100 on small GEMMs.
"""

from __future__ import annotations

import glob
import shutil
import subprocess
from dataclasses import dataclass

SATURATION_S = 20e-6


def _saturation(peak_flops: float, compute_efficiency: float) -> float:
    return SATURATION_S * peak_flops * compute_efficiency


@dataclass(frozen=True)
class DeviceProfile:
    """Rates of one device. Units: FLOP/s, bytes/s, seconds.

    compute_efficiency / memory_efficiency: the fraction of peak a large, well-shaped kernel reaches.
    saturation_flops: work (FLOPs) from which a compute kernel reaches `compute_efficiency`; 0 turns
    the small-kernel penalty off. saturation_exponent: how fast efficiency falls below it.
    """

    name: str
    peak_flops: float
    bandwidth: float
    launch_overhead_s: float
    compute_efficiency: float
    memory_efficiency: float
    description: str
    saturation_flops: float = 0.0
    saturation_exponent: float = 0.5

    def __post_init__(self) -> None:
        if self.peak_flops <= 0 or self.bandwidth <= 0 or self.launch_overhead_s < 0:
            raise ValueError(f"device {self.name!r}: rates must be positive and the overhead non-negative")
        if not (0 < self.compute_efficiency <= 1 and 0 < self.memory_efficiency <= 1):
            raise ValueError(f"device {self.name!r}: efficiencies must lie in (0, 1]")
        if self.saturation_flops < 0 or not 0 <= self.saturation_exponent <= 1:
            raise ValueError(f"device {self.name!r}: saturation_flops >= 0 and saturation_exponent in [0, 1]")


DEVICE_PROFILES: dict[str, DeviceProfile] = {
    p.name: p
    for p in (
        DeviceProfile("h100", 67e12, 3.35e12, 4e-6, 0.7, 0.8,
                      "NVIDIA H100 SXM5: 67 TFLOP/s FP32 (CUDA cores), 3.35 TB/s HBM3, 132 SMs",
                      saturation_flops=_saturation(67e12, 0.7)),
        DeviceProfile("a100", 19.5e12, 2.039e12, 4.5e-6, 0.7, 0.8,
                      "NVIDIA A100 SXM4 80GB: 19.5 TFLOP/s FP32 (CUDA cores), 2.04 TB/s HBM2e, 108 SMs",
                      saturation_flops=_saturation(19.5e12, 0.7)),
        DeviceProfile("v100", 15.7e12, 0.9e12, 5e-6, 0.7, 0.8,
                      "NVIDIA V100 SXM2: 15.7 TFLOP/s FP32, 900 GB/s HBM2, 80 SMs",
                      saturation_flops=_saturation(15.7e12, 0.7)),
        DeviceProfile("gtx1080", 8.87e12, 0.32e12, 5e-6, 0.7, 0.75,
                      "NVIDIA GTX 1080: 8.9 TFLOP/s FP32 (boost), 320 GB/s GDDR5X, 20 SMs",
                      saturation_flops=_saturation(8.87e12, 0.7)),
        # Two cores with AVX2 FMA at ~3 GHz give ~100-200 GFLOP/s peak; per-op cost is the framework's
        # dispatch, not a kernel launch. 20 us of work (1.2 MFLOP) is a few blocked-GEMM tiles per core.
        DeviceProfile("cpu", 100e9, 20e9, 2e-6, 0.6, 0.7,
                      "generic 2-core desktop CPU: ~100 GFLOP/s FP32, ~20 GB/s DRAM, ~2 us per op dispatch",
                      saturation_flops=_saturation(100e9, 0.6)),
    )
}


def get_device(device: str | DeviceProfile) -> DeviceProfile:
    """A profile by name (see DEVICE_PROFILES), or the profile itself."""
    if isinstance(device, DeviceProfile):
        return device
    from xrl.errors import ConfigError

    try:
        return DEVICE_PROFILES[device]
    except KeyError:
        raise ConfigError(f"unknown device {device!r}; choose one of: {', '.join(DEVICE_PROFILES)}") from None


# Substrings of an NVIDIA model name -> the closest profile (H200 and GH200 share the H100's SMs).
_GPU_NAMES = (("h100", "h100"), ("h200", "h100"), ("a100", "a100"), ("v100", "v100"), ("1080", "gtx1080"))
NVIDIA_PROC = "/proc/driver/nvidia/gpus/*/information"


def gpu_model_names(pattern: str = NVIDIA_PROC, smi: str | None = "nvidia-smi") -> list[str]:
    """Model names of the NVIDIA GPUs the driver lists (Linux), without importing a CUDA library:
    from its /proc files, else (sandboxes without them, such as gVisor) from `smi` when installed."""
    names = []
    for path in sorted(glob.glob(pattern)):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("Model:"):
                        names.append(line.split(":", 1)[1].strip())
        except OSError:
            continue
    if names or smi is None or shutil.which(smi) is None:
        return names
    try:
        proc = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()] if proc.returncode == 0 else []


def profile_for_gpu(model_name: str) -> str:
    """The profile closest to an NVIDIA model name; h100 for a GPU no profile names."""
    lower = model_name.lower()
    return next((profile for key, profile in _GPU_NAMES if key in lower), "h100")


def this_machine_profile(pattern: str = NVIDIA_PROC, smi: str | None = "nvidia-smi") -> str:
    """The analytic profile of this machine: its first NVIDIA GPU's, else "cpu".

    `xrl optimize` and `xrl cost` use it when no --device is given: a graph rewritten for another
    device can run much slower here (on this CPU, squeezenet rewritten for the H100 profile ran at
    0.72x under onnxruntime), so the default target is the machine itself."""
    names = gpu_model_names(pattern, smi)
    return profile_for_gpu(names[0]) if names else "cpu"
