"""Summaries across the runs of a sweep (a Hydra multirun)."""

from xrl.sweeps.summary import RunSummary, load_runs, summarize, write_summary

__all__ = ["RunSummary", "load_runs", "summarize", "write_summary"]
