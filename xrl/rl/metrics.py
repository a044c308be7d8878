"""What a training run logs about its episodes, and the metric best.pt is chosen by.

    episode_metrics(episodes)                 the training episodes of one update
    eval_metrics(records, train, val)         greedy episodes: per graph, and geomeans per split
    selection_key(val)                        the metric that picks best.pt
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from xrl.stats import geomean

if TYPE_CHECKING:
    from xrl.rl.rollout import EpisodeRecord


def episode_metrics(episodes: Sequence[EpisodeRecord]) -> dict[str, float]:
    """Mean return and length, geomean speed-ups, and each graph's mean speed-up."""
    m: dict[str, float] = {
        "episodes": float(len(episodes)),
        "episode_return": float(np.mean([e.ret for e in episodes])),
        "episode_length": float(np.mean([e.length for e in episodes])),
        "speedup_mean": geomean([e.speedup for e in episodes]),
        "best_speedup_mean": geomean([e.best_speedup for e in episodes]),
    }
    for name in sorted({e.graph for e in episodes}):
        m[f"speedup/{name}"] = float(np.mean([e.speedup for e in episodes if e.graph == name]))
    return m


def eval_metrics(records: Sequence[EpisodeRecord], train_graphs: Sequence[str],
                 val_graphs: Sequence[str] = ()) -> dict[str, float]:
    """Greedy-episode speed-ups per graph; geomeans over the training, validation and held-out graphs apart."""
    m = {f"eval_speedup/{r.graph}": r.speedup for r in records}
    train = [r.speedup for r in records if r.graph in train_graphs]
    val = [r.speedup for r in records if r.graph in val_graphs]
    held = [r.speedup for r in records if r.graph not in train_graphs and r.graph not in val_graphs]
    m["eval_speedup_mean"] = geomean(train)
    if val:
        m["eval_val_speedup_mean"] = geomean(val)
    if held:
        m["eval_heldout_speedup_mean"] = geomean(held)
    return m


def selection_key(val_graphs: Sequence[str]) -> str:
    """The metric best.pt is chosen by: the validation graphs' geomean, or the training graphs' without any."""
    return "eval_val_speedup_mean" if val_graphs else "eval_speedup_mean"
