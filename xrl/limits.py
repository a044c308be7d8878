"""Resource limits every front end checks before it allocates anything a model asks for.

A model file of a few hundred bytes can declare a tensor of 10^12 elements (a ConstantOfShape, an
input dimension, an HLO shape). xrl checks element counts against `max_elements()` before it folds,
materialises or runs such a tensor, and refuses with a one-line user error instead of exhausting memory.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

from xrl.errors import ConfigError, ModelLoadError

MAX_ELEMENTS_ENV = "XRL_MAX_ELEMENTS"
# 2^29 elements (2 GiB of float32, protobuf's limit for a whole inline model) for one tensor: above
# the largest weight or activation of the built-in and benchmark models, and small enough that
# verification (input, output and onnxruntime's copies) fits a 24 GB machine. Raise it with XRL_MAX_ELEMENTS.
DEFAULT_MAX_ELEMENTS = 1 << 29


class TensorTooLargeError(ModelLoadError):
    """A tensor the model declares or computes is larger than xrl's limit."""


def max_elements() -> int:
    """The most elements one tensor may have: $XRL_MAX_ELEMENTS, else DEFAULT_MAX_ELEMENTS."""
    raw = os.environ.get(MAX_ELEMENTS_ENV, "").strip().replace("_", "")
    if not raw:
        return DEFAULT_MAX_ELEMENTS
    try:
        value = int(float(raw)) if "e" in raw.lower() else int(raw)
    except (ValueError, OverflowError):
        raise ConfigError(f"{MAX_ELEMENTS_ENV}={raw!r} is not a whole number of elements") from None
    if value <= 0:
        raise ConfigError(f"{MAX_ELEMENTS_ENV}={raw!r} must be a positive number of elements")
    return value


def elements(shape: Iterable[int]) -> int:
    """The element count of a shape, in Python ints (no overflow, nothing allocated)."""
    return math.prod(int(d) for d in shape)


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    return f"{n} B"


def check_elements(count: int, what: str, *, itemsize: int = 4) -> None:
    """TensorTooLargeError naming `what` when `count` elements exceed the limit."""
    limit = max_elements()
    if count > limit:
        raise TensorTooLargeError(
            f"{what} has {count:,} elements ({human_bytes(count * itemsize)}), over xrl's limit of {limit:,} "
            f"elements per tensor; fix the shape, or raise the limit with {MAX_ELEMENTS_ENV}=N")


def check_shape(shape: Iterable[int], what: str, *, itemsize: int = 4) -> None:
    dims = [int(d) for d in shape]
    check_elements(elements(dims), f"{what} (shape {','.join(map(str, dims))})", itemsize=itemsize)
