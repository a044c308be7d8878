"""Timing a compiled graph (`xrl.cost.torch_exec.BoundRun`): wall clock on the CPU; on CUDA the native
event harness of cuda/ (replaying a captured CUDA graph), torch.cuda events or a synchronised wall clock.
Used by the measured `op`, `e2e` and `cuda` backends; the compiler that makes a BoundRun is torch_exec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xrl.cost.base import Measurement
from xrl.cost.timing import check_counts, summarize, time_callable
from xrl.errors import ConfigError

if TYPE_CHECKING:
    from xrl.cost.torch_exec import BoundRun

TIMERS = ("auto", "harness", "events", "wall")


def check_timer(timer: str) -> None:
    if timer not in TIMERS:
        raise ConfigError(f"unknown timer {timer!r}; choose one of: {', '.join(TIMERS)}")


def time_run(run: BoundRun, *, warmup: int, repeats: int, timer: str = "auto", flush_l2: bool = False,
             min_run_s: float = 0.0) -> Measurement:
    """Seconds per call of `run`.

    CPU: wall clock (`time_callable`; `min_run_s` batches calls of a fast run into one sample).
    CUDA: timer "harness" (the native event harness in cuda/, replaying the captured CUDA graph when
    there is one, with an optional L2 flush between repetitions), "events" (torch.cuda.Event pairs on
    the current stream) or "wall" (synchronised wall clock); "auto" is the harness when it loads,
    else events.
    """
    check_counts(warmup, repeats, "time_run")
    check_timer(timer)
    if run.device != "cuda":
        return time_callable(run, warmup=warmup, repeats=repeats, min_run_s=min_run_s)
    import torch

    if timer == "wall":
        return time_callable(run, warmup=warmup, repeats=repeats, sync=torch.cuda.synchronize, min_run_s=min_run_s)
    if timer in ("auto", "harness"):
        from xrl.cost import cuda_harness

        harness = cuda_harness.load(required=timer == "harness")
        if harness is not None:
            stream = torch.cuda.current_stream()
            handle = run.graph_exec_handle()
            if handle is not None:
                times = harness.time_graph(handle, stream.cuda_stream, device=stream.device.index or 0,
                                           warmup=warmup, repeats=repeats, flush_l2=flush_l2)
            else:
                times = harness.time_callback(run, stream.cuda_stream, device=stream.device.index or 0,
                                              warmup=warmup, repeats=repeats, flush_l2=flush_l2)
            return summarize(times)
    return _time_events(run, warmup=warmup, repeats=repeats)


def _time_events(run: BoundRun, *, warmup: int, repeats: int) -> Measurement:
    import torch

    for _ in range(warmup):
        run()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, stop in pairs:
        start.record()
        run()
        stop.record()
    torch.cuda.synchronize()
    return summarize([start.elapsed_time(stop) / 1e3 for start, stop in pairs])
