"""The `xrl` command line: wiring only (DESIGN.md). Each command group lives in its own module."""

from xrl.cli.main import main

__all__ = ["main"]
