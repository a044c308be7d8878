"""The one benchmark harness (experiments/harness.py, issue 33): the deployment models are a family of
`xrl.graphs.families` (no limit), the driver's command line (and the two old entry points' defaults), the
bootstrap interval on fixed numbers, a failing xrl as a row, and one tiny run end to end."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from xrl.graphs import families as F

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import harness  # noqa: E402

pytest.importorskip("torch")


class Bar:
    def update(self, n: int) -> None: ...
    def set_description(self, text: str) -> None: ...


def test_deploy_is_a_family_without_a_limit() -> None:
    assert "deploy" in F.FAMILIES and "deploy" not in F.LIMIT_FAMILIES
    assert F.members(families=("deploy",)) == list(F.family_module("deploy").MEMBERS) == [
        "bert", "gpt", "vit", "resnet", "effnet"]
    assert F.FAMILY_SIZES["deploy"] == ("tiny", "base") and F.limit_kind("gpt") == "none"
    assert F.model_info("bert", "tiny") == ("bert", 4, 64) and F.model_info("resnet", "tiny")[0] is None
    with pytest.raises(ValueError, match="no limit"):
        F.build_onnx("effnet", "tiny", "ts", limit=True)
    with pytest.raises(ValueError, match="has no size small"):
        F.build_onnx("bert", "small", "ts")
    from xrl import graphs  # the built-in graph registry holds the limit families only

    assert not [n for n in graphs.names() if n.startswith(("fam_bert", "fam_resnet"))]


@pytest.mark.parametrize("member", ["bert", "effnet"])
def test_deploy_members_build_and_export_with_both_names_of_ts(member: str) -> None:
    model = F.build_onnx(member, "tiny", "torchscript")  # the old spelling is read as "ts"
    assert model.SerializeToString() == F.build_onnx(member, "tiny", "ts").SerializeToString()
    assert {o.domain: o.version for o in model.opset_import}[""] == 17
    feeds = F.input_feeds(member, "tiny")
    assert [i.name for i in model.graph.input] == list(feeds)
    if member == "bert":  # token ids within the vocabulary, a padded mask
        assert feeds["input_ids"].dtype == np.int64 and feeds["input_ids"].max() < F.family_module("deploy").DIMS[
            "tiny"].vocab
        assert 0 < feeds["attention_mask"].sum() < feeds["attention_mask"].size
    (out,) = F.run(model, feeds)
    (ref,) = F.family_module("deploy").torch_outputs(member, "tiny")
    np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4)


def test_bootstrap_interval_on_fixed_numbers() -> None:
    num, den = [10.0, 10.0, 10.0, 10.0, 10.0], [5.0, 5.0, 5.0, 5.0, 5.0]
    assert harness.ratio_interval(num, den, seed=0) == (2.0, 2.0, 2.0)
    med, lo, hi = harness.ratio_interval([1.0, 1.1, 1.2, 0.9, 1.0, 1.05, 0.95], [1.0] * 7, seed=0)
    assert med == 1.0 and 0.9 <= lo <= med <= hi <= 1.2
    assert harness.ratio_interval([1.0, 1.1, 1.2, 0.9, 1.0, 1.05, 0.95], [1.0] * 7, seed=0) == (med, lo, hi)  # seeded
    aa = harness.Timing(1.0, speedup=1.0, lo=0.98, hi=1.01)
    assert harness.verdict(harness.Timing(1.0, speedup=1.2, lo=1.1, hi=1.3), aa) == "faster"
    assert harness.verdict(harness.Timing(1.0, speedup=0.9, lo=0.85, hi=0.95), aa) == "slower"
    assert harness.verdict(harness.Timing(1.0, speedup=1.0, lo=0.99, hi=1.02), aa) == "within noise"


def test_one_command_line_with_the_old_defaults() -> None:
    a = harness.parse_args(["--models", "bert,gpt", "--exporters", "torchscript,dynamo", "--threads", "1"],
                           "bench_deploy.py", "deploy", "base")
    assert a.members == ["bert", "gpt"] and a.exporters == ["ts", "dynamo"] and a.size == "base" and not a.limits
    a = harness.parse_args(["--size", "tiny"], "bench_deploy.py", "deploy", "base")
    assert a.members == list(F.family_module("deploy").MEMBERS) and a.threads == ["1", "all"]
    a = harness.parse_args(["--families", "lora,attn_bert", "--rounds", "3"], "bench_families.py")
    assert a.members == [*F.family_module("lora").MEMBERS, "attn_bert"] and a.size == "small" and a.limits
    assert harness.parse_args([]).members == F.members(families=F.LIMIT_FAMILIES)
    for argv, message in ((["--families", "alexnet"], "unknown family or member 'alexnet'"),
                          (["--families", "bert"], "size 'small' is not a size of deploy"),
                          (["--exporters", "onnx"], "unknown exporter onnx"),
                          (["--rounds", "1"], "--rounds must be at least 2")):
        with pytest.raises(harness.UserError, match=message):
            harness.parse_args(argv)


def test_user_error_is_one_line_exit_2(capsys: pytest.CaptureFixture) -> None:
    import bench_deploy

    assert bench_deploy.main(["--models", "alexnet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: unknown family or member 'alexnet'")


def test_xrl_failure_is_a_row_and_a_table_without_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "xrl"
    fake.write_text("#!/bin/sh\necho 'error: cannot import this model' >&2\nexit 2\n")
    fake.chmod(0o755)
    monkeypatch.setattr(harness, "xrl_binary", lambda: str(fake))
    args = harness.parse_args(["--size", "tiny", "--families", "effnet", "--exporters", "ts", "--cache",
                               str(tmp_path / "cache"), "--threads", "1", "--rounds", "2", "--runs", "1",
                               "--min-ms", "0"], "bench_deploy.py", "deploy", "base")
    res = harness.prepare("effnet", "ts", args, tmp_path, Bar())
    assert res.variants["xrl"].error == "xrl optimize exit 2: error: cannot import this model"
    assert res.variants["onnxslim"].error is None and res.variants["ort-transformers"].error == "n/a"
    assert res.variants["limit"].error == "n/a" and not res.has_limit
    res.timings["1"] = harness.time_result(res, "1", args, Bar())
    assert set(res.timings["1"]) == {"original", "A/A", "onnxslim", "onnx-simplifier", "onnxscript-ort"}
    text = harness.markdown([res], args, 1.0)
    assert text.startswith("# Deployment benchmark") and "effnet/ts: xrl FAILED: xrl optimize exit 2" in text
    assert "| limit" not in text and "xrl/limit" not in text  # no limit columns for the deployment models
    header = next(line for line in text.splitlines() if line.startswith("| member |"))
    row = next(line for line in text.splitlines() if line.startswith("| effnet | ts | 1 |"))
    geo = next(line for line in text.splitlines() if line.startswith("| **geomean, all**"))
    assert header.count("|") == row.count("|") == geo.count("|")


def test_end_to_end_tiny_bert(tmp_path: Path) -> None:
    out = tmp_path / "deploy.md"
    proc = subprocess.run(
        [sys.executable, str(EXPERIMENTS / "bench_deploy.py"), "--size", "tiny", "--models", "bert", "--exporters",
         "torchscript", "--threads", "1", "--rounds", "2", "--runs", "1", "--min-ms", "0", "--cache",
         str(tmp_path / "cache"), "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| bert | ts | 1 |"))
    assert "| A/A |" in proc.stdout and "FAILED" not in row, proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert out.read_text() == proc.stdout
    rows = list(csv.DictReader(open(out.with_suffix(".csv"))))
    assert {r["variant"] for r in rows} == set(harness.VARIANTS)
    original = next(r for r in rows if r["variant"] == "original")
    assert int(original["nodes"]) > 0 and "MatMul:" in original["ops"]
    xrl = next(r for r in rows if r["variant"] == "xrl")
    assert xrl["status"] == "ok" and float(xrl["speedup"]) > 0
    onnx.checker.check_model(onnx.load(next(Path(tmp_path / "cache").glob("bert-tiny-ts-*.onnx"))))
