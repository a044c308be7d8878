"""The deployment benchmark (issues 10, 23, 33): family members against the original, the peers, and their
limit where they have one, timed under onnxruntime by the one harness (experiments/harness.py, whose
docstring says what is timed and how).

    .venv/bin/python experiments/bench_models.py [--families lora,reparam,llama,attention,deploy | member,...]
        [--exporters ts,dynamo] [--size small|full|xl|tiny|base] [--threads 1,all] [--rounds 7] [--runs 5]
        [--min-ms 50] [--seed 0] [--cache ~/.cache/xrl/families] [--xrl-time-limit 120] [--out FILE.md]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog="bench_models.py"))
