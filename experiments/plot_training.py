"""A training run's metrics.jsonl as CSV and a PNG of its curves (sampled speed-up, the policy-argmax evaluation
on the train / validation / held-out graphs, the value loss), for shipping beside a policy.

    .venv/bin/python experiments/plot_training.py RUN_DIR/metrics.jsonl --out experiments/results/research_train/curves
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

COLUMNS = ("update", "env_steps", "speedup_mean", "eval_speedup_mean", "eval_val_speedup_mean",
           "eval_heldout_speedup_mean", "value_loss", "entropy", "rehearse_nll", "time_s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("metrics")
    ap.add_argument("--out", required=True, help="path stem: writes STEM.csv and STEM.png")
    args = ap.parse_args(argv)
    rows = [json.loads(line) for line in Path(args.metrics).read_text().splitlines() if line.strip()]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cols = [c for c in COLUMNS if any(c in r for r in rows)]
    with out.with_suffix(".csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow([r.get(c, "") for c in cols])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (("speedup_mean", "sampled episodes (train)"), ("eval_speedup_mean", "policy argmax, train"),
                       ("eval_val_speedup_mean", "policy argmax, validation"),
                       ("eval_heldout_speedup_mean", "policy argmax, held-out")):
        pts = [(r["update"], r[key]) for r in rows if key in r]
        if pts:
            a.plot(*zip(*pts), marker="o" if key.startswith("eval") else None, label=label)
    a.set_xlabel("PPO update")
    a.set_ylabel("geomean speed-up (paper cost)")
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    for key, label in (("value_loss", "value loss"), ("rehearse_nll", "rehearsal NLL (imitation)")):
        pts = [(r["update"], r[key]) for r in rows if key in r]
        if pts:
            b.plot(*zip(*pts), label=label)
    b.legend(fontsize=8)
    b.set_xlabel("PPO update")
    b.set_ylabel("loss")
    b.set_yscale("log")
    b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    print(f"{out.with_suffix('.csv')} {out.with_suffix('.png')} ({len(rows)} updates)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
