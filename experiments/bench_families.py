"""The deployment families (issue 23: LoRA, re-parameterisation, LLaMA, attention) against the peers and their
limits: experiments/bench_models.py with those four families and `--size small` as its defaults.

    .venv/bin/python experiments/bench_families.py [--families lora,reparam,llama,attention | member,...]
        [--exporters ts,dynamo] [--size small|full] [--threads 1,all] [--rounds 7] [--runs 5] [--min-ms 50]
        [--xrl-time-limit 120] [--out experiments/results/families/small.md]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog="bench_families.py", size="small"))
