"""A one-line progress display for long searches, and the default time limit every search gets.

Every search asks the rewrite engine for the candidates of the graph it is at, once a step; the
engine calls the hook installed here (`xrl.rewrite.match.step_hook`), so every method shows step,
the current graph's estimated speed-up and the elapsed time without knowing about it. The line is
drawn on stderr only when stderr is a terminal, at most a few times a second, and erased at the end.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from xrl.cost.base import CostModel
    from xrl.ir import Graph

# Seconds a search may run when the caller gives no limit (`--time-limit`, `time_limit=`): long
# enough for every built-in graph under every method, short enough that a 20,000-op model cannot
# search for hours without a word. Raise it with --time-limit N (inf: no limit).
DEFAULT_TIME_LIMIT_S = 300.0
_REDRAW_S = 0.25


class SearchProgress:
    """Draws `[method] step N  speed-up 1.234x  elapsed 12 s / 300 s` on a terminal."""

    def __init__(self, method: str, cost: CostModel, original: Graph, time_limit: float | None,
                 stream: TextIO | None = None) -> None:
        self.method = method
        self.cost = cost
        self.stream = stream if stream is not None else sys.stderr
        self.time_limit = time_limit
        self.steps = 0
        self.t0 = time.perf_counter()
        self._last_draw = 0.0
        self._drawn = False
        # Only a cheap estimate is recomputed for the display; a measured model is not run for it.
        self._base = None if cost.measured else _safe_cost(cost, original)

    def __call__(self, graph: Graph) -> None:
        self.steps += 1
        now = time.perf_counter()
        if now - self._last_draw < _REDRAW_S and self._drawn:
            return
        self._last_draw = now
        speedup = ""
        if self._base:
            c = _safe_cost(self.cost, graph)
            if c:
                speedup = f"  speed-up {self._base / c:.3f}x"
        limit = f" / {self.time_limit:.0f} s" if self.time_limit is not None and self.time_limit != float("inf") \
            else ""
        line = f"[{self.method}] step {self.steps}{speedup}  elapsed {now - self.t0:.0f} s{limit}"
        self.stream.write("\r\033[K" + line)
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _safe_cost(cost: CostModel, graph: Graph) -> float | None:
    try:
        return float(cost.cost(graph))
    except Exception:  # the display must never break a search
        return None


@contextlib.contextmanager
def search_progress(method: str, cost: CostModel, original: Graph, time_limit: float | None,
                    stream: TextIO | None = None, force: bool = False) -> Iterator[SearchProgress | None]:
    """Show progress for the search run inside the block, when `stream` (stderr) is a terminal."""
    from xrl.rewrite.match import step_hook

    out = stream if stream is not None else sys.stderr
    if not force and not _is_tty(out):
        yield None
        return
    progress = SearchProgress(method, cost, original, time_limit, out)
    with step_hook(progress):
        try:
            yield progress
        finally:
            progress.close()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
