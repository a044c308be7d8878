"""Timing a callable, and telling a real speed-up from timing noise.

Every measured backend (`op`, `e2e`, `cuda`) turns a list of per-run seconds into a `Measurement`
(median, coefficient of variation, min, max) with `summarize`, so they report spread the same way.

Noise model. A reward or a search step compares two medians. The median of n runs with standard
deviation s has a standard error of about sqrt(pi/2) * s / sqrt(n) (the normal-theory value), so an
improvement `before - after` is called significant when it exceeds z times the combined standard
error of the two medians. Drift between the two measurements (thermal, frequency, other tenants) is
not in that error; `z` = 2 leaves room for some of it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

from xrl.cost.base import Measurement
from xrl.errors import ConfigError

_MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)


def summarize(times_s: Sequence[float]) -> Measurement:
    """A Measurement from per-run seconds: median, CV (population std / mean), min, max."""
    if not times_s:
        raise ValueError("summarize needs at least one timing")
    mean = statistics.fmean(times_s)
    cv = statistics.pstdev(times_s) / mean if mean > 0 and len(times_s) > 1 else 0.0
    return Measurement(statistics.median(times_s), len(times_s), cv, min(times_s), max(times_s))


def check_counts(warmup: int, repeats: int, who: str, *, threads: int | None = None) -> None:
    """Reject timing options no measurement can use (threads None means the engine's default)."""
    if warmup < 0 or repeats < 1:
        raise ConfigError(f"{who} needs warmup >= 0 and repeats >= 1, got warmup={warmup} and repeats={repeats}")
    if threads is not None and threads < 1:
        raise ConfigError(f"{who}'s threads must be >= 1 or unset, got {threads}")


def time_callable(fn: Callable[[], object], *, warmup: int = 3, repeats: int = 10,
                  sync: Callable[[], object] | None = None, min_run_s: float = 0.0,
                  clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """Wall time of `fn()`: `warmup` untimed calls, then `repeats` timed ones.

    `sync` (e.g. `torch.cuda.synchronize`) is called before each clock start and inside each timed
    interval after `fn`, so asynchronous work is counted to its end. With `min_run_s` > 0, one timed
    sample calls `fn` as many times as it takes to last about that long and reports the time per
    call: a microsecond op timed one call at a time is mostly clock and loop overhead.
    `clock` is the wall clock by default; `calling_thread_clock` where the work runs on the caller.
    """
    check_counts(warmup, repeats, "time_callable")
    # with `min_run_s`, the last warm-up call is the one timed to size the samples: no call beyond the warm-up
    # (a bert-base run is 245 ms, a guard measures up to 28 of them a run)
    for _ in range(warmup - 1 if min_run_s > 0 and warmup > 0 else warmup):
        fn()
    inner = _calls_per_sample(fn, sync, min_run_s) if min_run_s > 0 else 1
    times = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        t0 = clock()
        for _ in range(inner):
            fn()
        if sync is not None:
            sync()
        times.append((clock() - t0) / inner)
    return summarize(times)


def calling_thread_clock(cpu: bool, threads: int | None) -> Callable[[], float]:
    """The clock that times CPU work run on the calling thread: its CPU time, where the runtime computes
    on the caller (the CPU with one intra-op thread), so that another process taking the core away
    does not count; else the wall clock."""
    return time.thread_time if cpu and threads == 1 else time.perf_counter


def _calls_per_sample(fn: Callable[[], object], sync: Callable[[], object] | None, min_run_s: float) -> int:
    """How many calls of `fn` make one sample of at least `min_run_s` (one calibration call, capped)."""
    t0 = time.perf_counter()
    fn()
    if sync is not None:
        sync()
    one = time.perf_counter() - t0
    return max(1, min(10_000, math.ceil(min_run_s / max(one, 1e-7))))


def median_stderr(m: Measurement) -> float:
    """Standard error of `m.median_s` in seconds (0 for an unmeasured, single-valued estimate)."""
    if m.repeats <= 1 or m.cv <= 0:
        return 0.0
    return _MEDIAN_SE_FACTOR * m.cv * m.median_s / math.sqrt(m.repeats)


def combined_noise(before: Measurement, after: Measurement, *, z: float = 2.0) -> float:
    """Seconds of difference between the two medians that noise alone explains at `z` standard errors."""
    return z * math.hypot(median_stderr(before), median_stderr(after))


def improvement_is_significant(before: Measurement, after: Measurement, *, z: float = 2.0) -> bool:
    """True when `after` is faster than `before` by more than their combined noise.

    A caller (the RL reward, a search) re-measures, or discounts, an improvement for which this is
    False rather than trust it. Deterministic estimates (cv 0) compare exactly: any gain counts.
    """
    if z < 0:
        raise ValueError(f"z must be non-negative, got {z}")
    gain = before.median_s - after.median_s
    return gain > 0 and gain > combined_noise(before, after, z=z)


def noisier_than(before: Measurement, after: Measurement, *, z: float = 2.0) -> bool:
    """True when the difference between the medians (either sign) is within the combined noise:
    the flag for a reward whose noise is larger than the change it claims."""
    return abs(before.median_s - after.median_s) <= combined_noise(before, after, z=z)
