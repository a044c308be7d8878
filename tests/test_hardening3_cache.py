"""Issue 34 item 3: a kernel cache that cannot be steered. Aliases carry a keyed checksum; every row's
checksum is an HMAC under a per-install secret (0600, made atomically) so an edit that stays "sane" and a row
forged with its plain hash recomputed are refused; a timing outside its kernel's roofline bounds is refused,
measured again, and counted in the report. Item 7: a line on stderr while waiting for another process's lock."""

from __future__ import annotations

import hashlib
import multiprocessing
import sqlite3
import stat
import threading
import time
from pathlib import Path

import pytest

from xrl import graphs
from xrl.cost import MeasuredKernelCostModel, op_measured
from xrl.cost.base import Measurement
from xrl.cost.kernel_measured import in_bounds
from xrl.cost.op_measured import SECRET_FILE, OpTimingCache, cache_secret
from xrl.cost.runtime_fusion import runtime_plan
from xrl.frontends.onnx_io import from_onnx
from xrl.ir import Graph, Node, TensorType

FAST = {"warmup": 1, "repeats": 3}


@pytest.fixture
def cache_path(tmp_path: Path) -> Path:
    return tmp_path / "kernel_costs.sqlite"


def mlp() -> Graph:
    return from_onnx(graphs.build("mlp"), name="mlp")


def honest(cache_path: Path) -> float:
    return MeasuredKernelCostModel(target="ort-cpu", cache_path=cache_path, **FAST).cost(mlp())


def again(cache_path: Path) -> MeasuredKernelCostModel:
    fresh = MeasuredKernelCostModel(target="ort-cpu", cache_path=cache_path, **FAST)
    fresh.cost(mlp())
    return fresh


def test_a_repointed_alias_is_refused_and_the_kernel_measured_again(cache_path: Path) -> None:
    first = honest(cache_path)
    with sqlite3.connect(cache_path) as conn:
        aliases = conn.execute("SELECT COUNT(*) FROM key_aliases_v2").fetchone()[0]
        slowest = conn.execute("SELECT key FROM op_timings_v2 ORDER BY median_s DESC LIMIT 1").fetchone()[0]
        conn.execute("UPDATE key_aliases_v2 SET target = ?", (slowest,))  # every kernel costs the slowest's
    fresh = again(cache_path)
    report = fresh.report()
    assert aliases >= 2 and report["cache_rows_refused"] >= aliases - 1  # (the slowest's own alias may be true)
    # each kernel's session was made again to find what it runs: the same cached timings, the same cost
    assert fresh.cost(mlp()) == pytest.approx(first, rel=1e-9)


@pytest.mark.parametrize("forge", ["one_percent", "plain_hash"])
def test_an_edited_row_that_stays_sane_is_refused(cache_path: Path, forge: str) -> None:
    honest(cache_path)
    with sqlite3.connect(cache_path) as conn:
        n = conn.execute("SELECT COUNT(*) FROM op_timings_v2").fetchone()[0]
        rows = conn.execute("SELECT key, device, median_s, cv, repeats, min_s, max_s FROM op_timings_v2").fetchall()
        for key, device, median_s, cv, repeats, min_s, max_s in rows:
            edit = (median_s * 1.01, min_s * 1.01, max_s * 1.01)  # 1% slower: min <= median <= max, all sane
            checksum = None
            if forge == "plain_hash":  # the checksum as an unkeyed hash of the row's numbers, recomputed
                text = f"{key}|{device}|{edit[0]!r}|{cv!r}|{int(repeats)}|{edit[1]!r}|{edit[2]!r}"
                checksum = hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
            conn.execute("UPDATE op_timings_v2 SET median_s = ?, min_s = ?, max_s = ?, checksum = COALESCE(?, "
                         "checksum) WHERE key = ? AND device = ?", (*edit, checksum, key, device))
    fresh = again(cache_path)
    assert fresh.cache.refused >= 1 and fresh.report()["kernels_measured"] >= 1
    assert fresh.report()["cache_rows_refused"] >= 1
    assert len(OpTimingCache(cache_path)) == n  # the refused rows were measured and stored again


def test_a_signed_timing_far_above_its_roofline_is_refused_measured_again_and_counted(cache_path: Path) -> None:
    """A row that passes its checksum (written through the cache with the install's key) but holds 30 s for a
    kernel of microseconds: out of its bounds, so refused and measured again."""
    first = honest(cache_path)
    cache = OpTimingCache(cache_path)
    with sqlite3.connect(cache_path) as conn:
        keys = conn.execute("SELECT key, device, config FROM op_timings_v2").fetchall()
        conn.execute("DELETE FROM op_timings_v2")
    for key, device, config in keys:
        cache.put(key, device, config, Measurement(30.0, 3, 0.01, 30.0, 30.0))
    fresh = again(cache_path)
    report = fresh.report()
    assert report["out_of_bounds_refused"] >= 1 and report["kernels_measured"] >= 1
    assert fresh.cost(mlp()) < 100 * first  # a real timing again, not 30 s a kernel


def big_matmul() -> tuple[MeasuredKernelCostModel, object, Graph]:
    t = TensorType((1024, 1024), "float32")
    g = Graph([Node("mm", "MatMul", ("x", "y"), ("z",))], ["x", "y"], ["z"], {"x": t, "y": t, "z": t}, name="mm")
    m = MeasuredKernelCostModel(target="ort-cpu", cache_path=None, **FAST)
    plan, kernels = runtime_plan(g, "cpu")
    return m, next(k for k in kernels if k.nodes), plan


def test_the_bounds_are_tenth_of_the_peak_work_to_a_thousand_times_the_estimate(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XRL_CACHE_DIR", str(tmp_path))
    m, k, plan = big_matmul()
    low, high = m.roofline_bounds(k, plan)
    assert 0 < low < high
    estimate = m.__class__.__mro__[1].kernel_cost(m, k, plan)  # the roofline's own
    assert high == pytest.approx(1000 * estimate)
    assert in_bounds(estimate, (low, high)) and in_bounds(10 * low, (low, high))
    assert not in_bounds(low / 2, (low, high)) and not in_bounds(high * 2, (low, high))


def _secret_of(directory: str) -> str:
    return cache_secret(Path(directory)).hex()


def test_the_install_secret_is_private_and_made_once_under_concurrency(tmp_path: Path) -> None:
    with multiprocessing.get_context("fork").Pool(4) as pool:
        secrets = pool.map(_secret_of, [str(tmp_path)] * 8)
    assert len(set(secrets)) == 1
    key = tmp_path / SECRET_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    assert not list(tmp_path.glob("*.tmp"))
    key.chmod(0o644)
    assert cache_secret(tmp_path).hex() == secrets[0] and stat.S_IMODE(key.stat().st_mode) == 0o600
    key.write_bytes(b"short")  # damaged: replaced, so every row is then refused and measured again
    assert len(cache_secret(tmp_path)) == 32


def test_a_locked_cache_says_it_is_waiting(cache_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(op_measured, "LOCK_NOTICE_S", 0.2)
    cache = OpTimingCache(cache_path)
    cache.put("k0", "d", "{}", Measurement(1e-3, 3, 0.1, 1e-3, 1e-3))
    holder = sqlite3.connect(cache_path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(1.0, lambda: holder.execute("COMMIT"))
    release.start()
    t0 = time.perf_counter()
    cache.put("k1", "d", "{}", Measurement(1e-3, 3, 0.1, 1e-3, 1e-3))
    waited = time.perf_counter() - t0
    release.join()
    err = capsys.readouterr().err
    assert "waiting for the timing cache lock" in err and len(err.strip().splitlines()) == 1
    assert waited >= 0.8 and cache.get("k1", "d") is not None
