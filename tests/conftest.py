"""Test-wide settings."""

import pytest


@pytest.fixture(autouse=True)
def _generic_cpu_profile(monkeypatch):
    """Tests estimate with the generic cpu profile, whatever `xrl calibrate` left on this machine.

    Tests that do not test measurement cost kernels by their roofline and skip the measured guard: those
    two defaults time the machine, which makes a result depend on the load and costs seconds per call.
    The tests of measurement (test_kernel_cost.py, test_guard.py) turn both back on, and a test of a
    default path that must see them names `measured_defaults`."""
    monkeypatch.setenv("XRL_NO_CALIBRATION", "1")
    monkeypatch.setenv("XRL_TARGET_COST", "roofline")
    monkeypatch.setenv("XRL_GUARD", "0")


@pytest.fixture
def measured_defaults(monkeypatch, tmp_path):
    """The defaults a user gets: measured kernel costs (in a fresh cache) and the measured guard."""
    monkeypatch.delenv("XRL_TARGET_COST")
    monkeypatch.delenv("XRL_GUARD")
    monkeypatch.setenv("XRL_CACHE_DIR", str(tmp_path / "cache"))


def pytest_configure(config):
    """One torch thread per test process: `make test` runs two processes on two cores, and a second thread
    per process only spin-waits (small GNN forward passes measured 20x slower on two threads under load)."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def paper():
    """The research setting's cost: analytic, on the H100 profile."""
    from xrl.cost import get_cost_model

    return get_cost_model("analytic", device="h100")


@pytest.fixture(scope="module")
def shipped():
    """The shipped policy's network, in eval mode."""
    from xrl.rl.checkpoint import default_policy_path, load_policy

    return load_policy(default_policy_path())[0]
