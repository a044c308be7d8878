"""The deployment benchmark's models under their old names: they are the family `deploy` now
(`xrl.graphs.families.deploy`, built and exported by the families' helpers). Kept for the scripts and
tests that name a model and a path:

    export("bert", "base", "ts", Path("bert.onnx"))
    cached_export("gpt", "tiny", "dynamo", cache_dir)   # -> Path (the families' cache key)

Exporters are the families' "ts" and "dynamo" ("torchscript" is read as "ts").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import families
from .families.deploy import DIMS, MEMBERS, SIZES, TRANSFORMERS, network, torch_outputs

MODELS = MEMBERS
EXPORTERS = families.EXPORTERS


def build(name: str, size: str = "base", seed: int = 0):
    """The torch module, seeded, in eval mode."""
    families.check(name, size)
    return network(name, size, seed)


def input_feeds(name: str, size: str = "base", seed: int = 0) -> dict[str, np.ndarray]:
    return families.input_feeds(name, size, seed=seed)


def cached_export(name: str, size: str, exporter: str, cache_dir: Path, seed: int = 0) -> Path:
    """The exported file, made once per model/size/exporter/seed/torch version."""
    return families.cached_export(name, size, exporter, cache_dir, seed=seed)


def export(name: str, size: str, exporter: str, path: Path, seed: int = 0) -> Path:
    """One static-shape, batch-1 export to a single self-contained .onnx file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(families.build_onnx(name, size, exporter, seed=seed).SerializeToString())
    return path


__all__ = ["DIMS", "EXPORTERS", "MODELS", "SIZES", "TRANSFORMERS", "build", "cached_export", "export", "input_feeds",
           "torch_outputs"]
