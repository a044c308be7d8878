"""`xrl calibrate`: this CPU's rates under onnxruntime, cached, and used by the ort-cpu target."""

from __future__ import annotations

import json

from xrl.cli import main
from xrl.cost import calibrate
from xrl.cost.targets import get_target


def test_calibrate_measures_saves_and_is_used(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XRL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("XRL_NO_CALIBRATION")
    assert get_target("ort-cpu").device_profile == "cpu"  # nothing calibrated yet: the generic profile
    code = main(["calibrate", "--repeats", "5", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and (tmp_path / calibrate.CALIBRATION_FILE).exists()
    assert 1e-8 <= out["launch_overhead_s"] < 1e-3 and 1e8 < out["bandwidth"] < 1e12
    assert 1e8 < out["peak_flops"] < 1e13 and len(out["gemm_rates"]) == len(calibrate.GEMM_SIZES)
    assert get_target("ort-cpu").device_profile == calibrate.PROFILE_NAME
    monkeypatch.setenv("XRL_NO_CALIBRATION", "1")
    assert get_target("ort-cpu").device_profile == "cpu"


def test_a_calibration_of_another_machine_is_not_used(monkeypatch, tmp_path):
    monkeypatch.setenv("XRL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("XRL_NO_CALIBRATION")
    cal = calibrate.Calibration("some other CPU x64", "1.0", 1, 1e-6, 1e10, 1e11, 1e6, {})
    calibrate.save(cal)
    assert calibrate.calibrated_profile() is None and get_target("ort-cpu").device_profile == "cpu"


def test_saturation_fit_recovers_a_known_curve():
    s = 2e7
    eff = {f: min(1.0, f / s) ** calibrate.SATURATION_EXPONENT for f in (1e5, 1e6, 5e6, 1e8, 1e9)}
    assert abs(calibrate._fit_saturation(eff) / s - 1) < 0.1
