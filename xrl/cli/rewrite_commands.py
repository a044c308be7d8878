"""Rewrite-engine commands: rules list/verify, candidates. Filled in with the rewrite engine."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    return None
