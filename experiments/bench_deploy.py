"""The deployment models (issue 10: bert, gpt, vit, resnet, effnet, the family `deploy`) against the peers:
experiments/bench_models.py with `--families deploy --size base` as its defaults (`--models` is `--families`).

    .venv/bin/python experiments/bench_deploy.py [--models bert,gpt,vit,resnet,effnet] [--exporters ts,dynamo]
        [--size base|tiny] [--threads 1,all] [--rounds 7] [--runs 5] [--out experiments/results/deploy_cpu.md]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import main as _main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return _main(argv, prog="bench_deploy.py", families="deploy", size="base")


if __name__ == "__main__":
    sys.exit(main())
