"""A training run's curves (issue 32.5): metrics.jsonl -> curves.csv and curves.png.

Per update: environment steps, the sampled episodes' mean speed-up, and, every eval_every updates, the policy's
argmax geomean speed-up on the train, validation and held-out graphs (under the run's cost), the value loss, the
entropy and the wall time.

    .venv/bin/python experiments/training_curves.py /work/runs/research_r2 --out experiments/results/research_train_r2
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a training run's folder (its metrics.jsonl)")
    ap.add_argument("--out", required=True, help="folder for curves.csv and curves.png")
    args = ap.parse_args(argv)
    try:
        rows = [json.loads(line) for line in (Path(args.run) / "metrics.jsonl").read_text().splitlines() if line]
    except (OSError, json.JSONDecodeError) as e:
        print(f"training_curves: cannot read {args.run}/metrics.jsonl: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "curves.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([r.get(c, "") for c in COLUMNS])

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["env_steps"] for r in rows]
    ax1.plot(steps, [r["speedup_mean"] for r in rows], color="0.7", lw=1, label="sampled episodes (train)")
    for key, label in (("eval_speedup_mean", "argmax, train"), ("eval_val_speedup_mean", "argmax, validation"),
                       ("eval_heldout_speedup_mean", "argmax, held-out")):
        pts = [(r["env_steps"], r[key]) for r in rows if key in r]
        if pts:
            ax1.plot(*zip(*pts), marker="o", ms=3, label=label)
    ax1.set_xlabel("environment steps")
    ax1.set_ylabel("geomean speed-up (estimated)")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    ax2.plot(steps, [r.get("value_loss", float("nan")) for r in rows], label="value loss")
    if any("rehearse_nll" in r for r in rows):
        ax2.plot(steps, [r.get("rehearse_nll", float("nan")) for r in rows], label="rehearsal NLL")
    ax2.set_xlabel("environment steps")
    ax2.set_yscale("log")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.suptitle(f"training run {Path(args.run).name}: {len(rows)} updates, {int(steps[-1]) if steps else 0} steps")
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    print(f"wrote {out / 'curves.csv'} and {out / 'curves.png'} ({len(rows)} updates)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
