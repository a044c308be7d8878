"""Test-wide settings."""

import pytest


@pytest.fixture(autouse=True)
def _generic_cpu_profile(monkeypatch):
    """Tests estimate with the generic cpu profile, whatever `xrl calibrate` left on this machine."""
    monkeypatch.setenv("XRL_NO_CALIBRATION", "1")


def pytest_configure(config):
    """One torch thread per test process: `make test` runs two processes on two cores, and a second thread
    per process only spin-waits (small GNN forward passes measured 20x slower on two threads under load)."""
    import torch

    torch.set_num_threads(1)
