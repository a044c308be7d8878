"""Test-wide settings."""

import pytest


@pytest.fixture(autouse=True)
def _generic_cpu_profile(monkeypatch):
    """Tests estimate with the generic cpu profile, whatever `xrl calibrate` left on this machine."""
    monkeypatch.setenv("XRL_NO_CALIBRATION", "1")
