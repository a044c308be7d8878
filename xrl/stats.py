"""The geometric mean every report uses (`xrl eval`, `xrl compare`, training metrics, the experiments), so
two reports of the same speed-ups never disagree.

Policy: a geometric mean is over ratios (speed-ups, improvements), which are positive and finite. A value
that is NaN (a failed or missing run), +-inf, zero or negative is not such a ratio: it is skipped, not an
error, and does not count in n. With no value left the result is NaN, so an empty row reads as "no data",
never as 1.0 (no change) or 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def geomean_values(values: Iterable[float]) -> list[float]:
    """The values `geomean` averages: the positive finite ones, in order."""
    return [float(v) for v in values if 0 < v < math.inf]  # NaN fails both comparisons


def geomean(values: Iterable[float]) -> float:
    """exp(mean(log v)) over the positive finite `values`; NaN when there is none (see the module's policy)."""
    kept = geomean_values(values)
    return math.exp(math.fsum(map(math.log, kept)) / len(kept)) if kept else math.nan
