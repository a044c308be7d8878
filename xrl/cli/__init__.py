"""The `xrl` command line: wiring only (docs/architecture.md, "The CLI is wiring only"); a module per command group."""

from xrl.cli.main import main

__all__ = ["main"]
