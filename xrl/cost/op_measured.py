"""The `op` cost model: every distinct operator configuration run alone and timed (TASO's method).

A graph's cost is the sum of its ops' measured times (`per_op = True`, so `delta_cost` re-costs a
rewrite from the few nodes it changes). An op configuration is what decides its run time: op,
attributes, input and output types, which inputs are weights, and the values of small integer
constants (a Reshape's target, a Slice's bounds); see `op_config`. It is executed alone by the
PyTorch executor on the target device (a one-node graph with seeded random inputs and the graph's
own weights), warmed up, and timed `repeats` times; the median is its cost. View ops (Reshape,
Flatten, Squeeze, Unsqueeze, Identity, Dropout, Constant) run no kernel and cost 0 without a
measurement. An op PyTorch cannot run (an opaque op) is timed alone in onnxruntime instead.

Timings persist in a cache shared by every process on the machine: an sqlite database in WAL mode
(`$XRL_CACHE_DIR/op_costs.sqlite`, else `~/.cache/xrl/op_costs.sqlite`), keyed by the configuration
and by the identity of the device (CPU model and thread count or GPU name, torch version, timer).
Each timing is committed in its own transaction: a process killed mid-run leaves every timing it
committed and nothing half-written, and concurrent processes agree on one value per key (the first
one written wins).

What changes here relative to TASO: medians instead of means, a recorded spread (`measure` combines
the per-op CVs), CUDA graphs and an L2 flush on the GPU, and a cache that outlives the process.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from xrl.cache import CACHE_ENV, SECRET_FILE, cache_dir, cache_secret  # noqa: F401 - cache_dir, SECRET_FILE: this module's API
from xrl.cost.base import CostModel, Measurement
from xrl.cost.timing import check_counts
from xrl.cost.torch_exec import TorchExecutor, resolve_device, torch_dtype, torch_threads
from xrl.cost.torch_timing import check_timer, time_run
from xrl.errors import XrlError
from xrl.ir import Graph, Node
from xrl.ir.ops import is_known, op_kind

CACHE_FILE = "op_costs.sqlite"
_SMALL_CONST = 64  # integer weights up to this many elements are shape-like: their values enter the key


class CacheError(XrlError):
    """The op timing cache file cannot be opened or is not an xrl cache."""


def default_cache_path() -> Path:
    return cache_dir() / CACHE_FILE


# A timing outside these bounds is not a kernel's run time on any machine: refused and measured again
MAX_SANE_S = 60.0
MAX_SANE_CV = 10.0


# Waiting for another process's lock on a cache file: a line on stderr after LOCK_NOTICE_S, at most LOCK_WAIT_S
LOCK_NOTICE_S = 2.0
LOCK_WAIT_S = 60.0

def _checksum(secret: bytes, key: str, device: str, median_s: float, cv: float, repeats: int, min_s: float,
              max_s: float) -> str:
    """What a row's numbers must hash to, keyed by the install's secret (HMAC-SHA256): a flipped bit, a
    hand-edited timing, or a row forged with its plain hash recomputed is caught on read."""
    text = f"timing|{key}|{device}|{median_s!r}|{cv!r}|{int(repeats)}|{min_s!r}|{max_s!r}"
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()[:32]


def _alias_checksum(secret: bytes, key: str, device: str, target: str) -> str:
    """An alias row's keyed checksum: repointing a kernel at another kernel's timing is caught on read."""
    return hmac.new(secret, f"alias|{key}|{device}|{target}".encode(), hashlib.sha256).hexdigest()[:32]


def sane(m: Measurement) -> bool:
    """A timing that could be real: finite, positive, below a minute, ordered min <= median <= max."""
    values = (m.median_s, m.cv, m.min_s, m.max_s)
    return (all(isinstance(v, float) and math.isfinite(v) for v in values) and isinstance(m.repeats, int)
            and m.repeats >= 1 and 0 < m.median_s < MAX_SANE_S and 0 <= m.cv <= MAX_SANE_CV
            and 0 < m.min_s <= m.median_s * (1 + 1e-9) and m.median_s <= m.max_s * (1 + 1e-9))


class OpTimingCache:
    """Timings on disk: (config key, device id) -> Measurement, in an sqlite database (WAL mode).

    Every row (timings and aliases) carries a checksum of its contents keyed by the install's secret
    (`cache_secret`: HMAC-SHA256, the key in `cache.key` beside the file, private to the user), so an
    edited or forged row is refused even with its plain hash recomputed. A row that fails it, or holds a
    timing no machine produces (`sane`), is deleted on read and reported missing, so the caller measures
    it again: a corrupted cache costs time, never a wrong number. Any sqlite failure (a file that is not a
    database, a locked or read-only file, another schema) is one `CacheError` line.
    The connection opens lazily, reopens after a fork, and is left out when the object is pickled.
    """

    _SCHEMA = """CREATE TABLE IF NOT EXISTS op_timings_v2 (
        key TEXT NOT NULL, device TEXT NOT NULL, config TEXT NOT NULL,
        median_s REAL NOT NULL, cv REAL NOT NULL, repeats INTEGER NOT NULL, min_s REAL NOT NULL, max_s REAL NOT NULL,
        created REAL NOT NULL, checksum TEXT NOT NULL,
        PRIMARY KEY (key, device)) WITHOUT ROWID"""

    # What a key stands for: a kernel's model -> the key of what the runtime runs for it (many models, one
    # kernel), each row with its keyed checksum (v1 had none: a repointed alias steered a graph's cost)
    _ALIASES = """CREATE TABLE IF NOT EXISTS key_aliases_v2 (
        key TEXT NOT NULL, device TEXT NOT NULL, target TEXT NOT NULL, checksum TEXT NOT NULL,
        PRIMARY KEY (key, device)) WITHOUT ROWID"""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self._lock = threading.Lock()
        self.refused = 0  # rows deleted on read as corrupted, insane or out of their kernel's bounds
        self._secret: bytes | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])

    def _error(self, e: BaseException) -> CacheError:
        return CacheError(f"cannot use {self.path} as xrl's timing cache ({e}); delete it, or pass another "
                          f"cache_path (or set ${CACHE_ENV})")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # sqlite waits LOCK_NOTICE_S for a lock on its own; then xrl says so and waits the rest (`_execute`)
            conn = sqlite3.connect(self.path, timeout=LOCK_NOTICE_S, isolation_level=None, check_same_thread=False)
            self._execute(conn, "PRAGMA journal_mode=WAL")
            self._execute(conn, "PRAGMA synchronous=NORMAL")  # with WAL: durable across a killed process, never corrupt
            self._execute(conn, self._SCHEMA)
            self._execute(conn, self._ALIASES)
            columns = [r[1] for r in conn.execute("PRAGMA table_info(op_timings_v2)")]
            if "checksum" not in columns:
                raise sqlite3.DatabaseError("table op_timings_v2 has another schema")
            self._secret = cache_secret(self.path.parent)
        except (sqlite3.Error, OSError) as e:
            raise self._error(e) from None
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _sql(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Run one statement (its own transaction) and return its rows; any sqlite failure is a CacheError."""
        try:
            with self._lock:
                return self._execute(self._connection(), sql, params)
        except sqlite3.Error as e:
            raise self._error(e) from None

    def _execute(self, conn: sqlite3.Connection, sql: str, params: tuple = ()) -> list[tuple]:
        """One statement; where another process holds the file's lock past LOCK_NOTICE_S, a line on stderr
        says xrl is waiting for it, and it waits up to LOCK_WAIT_S in all (then a CacheError)."""
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e):
                raise
        import sys

        print(f"xrl: waiting for the timing cache lock on {self.path} (another process is writing it; up to "
              f"{LOCK_WAIT_S:.0f} s)", file=sys.stderr, flush=True)
        conn.execute(f"PRAGMA busy_timeout = {int((LOCK_WAIT_S - LOCK_NOTICE_S) * 1000)}")
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(LOCK_NOTICE_S * 1000)}")

    @property
    def secret(self) -> bytes:
        if self._secret is None or self._pid != os.getpid():
            self._connection()
        return self._secret  # type: ignore[return-value]

    def get(self, key: str, device: str) -> Measurement | None:
        rows = self._sql("SELECT median_s, repeats, cv, min_s, max_s, checksum FROM op_timings_v2 "
                         "WHERE key = ? AND device = ?", (key, device))
        if not rows:
            return None
        median_s, repeats, cv, min_s, max_s, checksum = rows[0]
        try:
            m = Measurement(float(median_s), int(repeats), float(cv), float(min_s), float(max_s))
            ok = sane(m) and isinstance(checksum, str) and hmac.compare_digest(
                checksum, _checksum(self.secret, key, device, m.median_s, m.cv, m.repeats, m.min_s, m.max_s))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            self.discard(key, device)
            return None
        return m

    def discard(self, key: str, device: str) -> None:
        """Delete a row its reader refuses (corrupted, insane, or outside its kernel's bounds): it is measured
        again."""
        self._sql("DELETE FROM op_timings_v2 WHERE key = ? AND device = ?", (key, device))
        self.refused += 1

    def put(self, key: str, device: str, config: str, m: Measurement) -> Measurement:
        """Store `m` unless another process stored this key first; returns the stored value. An insane
        `m` (a timer glitch) is returned to the caller but not stored."""
        if not sane(m):
            return m
        self._sql("INSERT OR IGNORE INTO op_timings_v2 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  (key, device, config, m.median_s, m.cv, m.repeats, m.min_s, m.max_s, time.time(),
                   _checksum(self.secret, key, device, m.median_s, m.cv, m.repeats, m.min_s, m.max_s)))
        stored = self.get(key, device)
        return m if stored is None else stored

    def get_alias(self, key: str, device: str) -> str | None:
        """The run key `key` stands for; None where there is none or its row fails its keyed checksum (the row
        is then deleted, counted in `refused`, and the kernel's session is made again to find its key)."""
        rows = self._sql("SELECT target, checksum FROM key_aliases_v2 WHERE key = ? AND device = ?", (key, device))
        if not rows:
            return None
        target, checksum = rows[0]
        if isinstance(target, str) and isinstance(checksum, str) and hmac.compare_digest(
                checksum, _alias_checksum(self.secret, key, device, target)):
            return target
        self._sql("DELETE FROM key_aliases_v2 WHERE key = ? AND device = ?", (key, device))
        self.refused += 1
        return None

    def put_alias(self, key: str, device: str, target: str) -> None:
        self._sql("INSERT OR IGNORE INTO key_aliases_v2 VALUES (?, ?, ?, ?)",
                  (key, device, target, _alias_checksum(self.secret, key, device, target)))

    def __len__(self) -> int:
        return int(self._sql("SELECT COUNT(*) FROM op_timings_v2")[0][0])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


# ----- op configurations ----------------------------------------------------------------------
def stable_value(v: Any) -> Any:
    """A JSON-able value that prints the same in every process and numpy version."""
    if isinstance(v, np.ndarray):
        digest = hashlib.blake2b(np.ascontiguousarray(v).tobytes(), digest_size=16).hexdigest()
        return {"ndarray": [v.dtype.str, list(v.shape), digest]}
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple)):
        return [stable_value(x) for x in v]
    return v


def op_config(node: Node, graph: Graph, dtype: str = "float32") -> str:
    """What decides `node`'s run time, as a stable string (JSON with sorted keys).

    Beyond `xrl.cost.base.op_key`: output types (a Slice's or Pad's output size is not in its input
    types) and the values of small integer weights (shape-like inputs), plus the compute dtype.
    """
    consts = {}
    for i, v in enumerate(node.inputs):
        w = graph.const_value(v) if v else None
        if w is not None and w.size <= _SMALL_CONST and not np.issubdtype(w.dtype, np.floating):
            consts[str(i)] = [int(x) for x in w.reshape(-1)]
    return json.dumps({
        "op": node.op, "domain": node.domain,
        "attrs": {k: stable_value(val) for k, val in node.attrs.items()},
        "inputs": [str(graph.type_of(v)) if v else "" for v in node.inputs],
        "weights": [bool(v) and graph.is_weight(v) for v in node.inputs],
        "consts": consts,
        "outputs": [str(graph.type_of(v)) for v in node.outputs],
        "dtype": dtype,
    }, sort_keys=True, separators=(",", ":"))


def config_key(config: str) -> str:
    return hashlib.sha256(config.encode()).hexdigest()[:32]


def op_graph(node: Node, graph: Graph) -> Graph:
    """`node` alone: its activation inputs become graph inputs, its weights come along."""
    acts = [v for v in dict.fromkeys(node.inputs) if v and not graph.is_weight(v)]
    weights = {v: graph.initializers[v] for v in node.inputs if v and graph.is_weight(v)}
    types = {v: graph.type_of(v) for v in (*acts, *weights, *node.outputs)}
    return Graph([node], acts, node.outputs, types, weights, name=f"op_{node.op}", domain_opsets=graph.domain_opsets)


def is_free(node: Node) -> bool:
    """A view op: no kernel runs, so it costs 0 and is never measured."""
    return is_known(node.op, node.domain) and op_kind(node.op) == "view"


def combine(parts: list[tuple[Measurement, int]]) -> Measurement:
    """The Measurement of a sum of op times: (op measurement, times the op occurs) pairs.

    Occurrences of one configuration share a measurement, so their errors add linearly; distinct
    configurations are measured independently, so theirs add in quadrature.
    """
    if not parts:
        return Measurement(0.0, 1, 0.0, 0.0, 0.0)
    total = sum(k * m.median_s for m, k in parts)
    std = math.sqrt(sum((k * m.cv * m.median_s) ** 2 for m, k in parts))
    return Measurement(total, min(m.repeats for m, _ in parts), std / total if total > 0 else 0.0,
                       sum(k * m.min_s for m, k in parts), sum(k * m.max_s for m, k in parts))


# ----- the cost model -------------------------------------------------------------------------
class OpMeasuredCostModel(CostModel):
    """Sum over ops of each op configuration's median run time, measured alone through PyTorch."""

    name = "op"
    per_op = True

    def __init__(self, *, device: str | None = None, cache_path: str | Path | None = None, warmup: int = 3,
                 repeats: int = 10, threads: int | None = 1, seed: int = 0, dtype: str = "float32",
                 timer: str = "auto", cuda_graph: bool = True, flush_l2: bool = False,
                 min_sample_s: float = 1e-3) -> None:
        """device: "cpu", "cuda", "auto"/None (cuda when present) or a GPU profile name (meaning cuda).
        threads: torch CPU threads while measuring (None: torch's current setting). One by default: a
            multi-threaded op waits at every OpenMP barrier for a core that another process may hold, and on a
            busy 2-core machine a 3x3 conv of a 32x32 image timed 20 ms with 2 threads and 20 us with 1.
        timer / cuda_graph / flush_l2: how a GPU op is timed (see `xrl.cost.torch_timing.time_run`).
        min_sample_s: on the CPU, one timed sample repeats a fast op until it lasts this long.
        """
        super().__init__()
        check_counts(warmup, repeats, "the 'op' cost model", threads=threads)
        check_timer(timer)
        self.device = resolve_device(device, self.name)
        self.warmup, self.repeats, self.seed = warmup, repeats, seed
        self.dtype = dtype
        self._torch_dtype = torch_dtype(dtype)
        self.timer, self.cuda_graph, self.flush_l2 = timer, cuda_graph, flush_l2
        self.min_sample_s = min_sample_s if self.device == "cpu" else 0.0
        import torch

        self.threads = threads or torch.get_num_threads()
        self.cache = OpTimingCache(cache_path or default_cache_path())
        self.device_id = self._device_id()
        self._measured: dict[str, Measurement] = {}  # config key -> measurement, this process
        self.stats = {"measured": 0, "cache_hits": 0}

    def _device_id(self) -> str:
        import torch

        if self.device == "cpu":
            return f"cpu|{cpu_model()}|threads={self.threads}|torch={torch.__version__}"
        timer = self.timer
        if timer == "auto":
            from xrl.cost import cuda_harness

            timer = "harness" if cuda_harness.load(required=False) is not None else "events"
        return (f"cuda|{torch.cuda.get_device_name()}|torch={torch.__version__}|timer={timer}"
                f"|graph={int(self.cuda_graph)}|flush={int(self.flush_l2)}")

    # ----- the CostModel interface --------------------------------------------------------------
    def op_cost(self, node: Node, graph: Graph) -> float:
        return self.op_measurement(node, graph).median_s

    def _op_cost(self, node: Node, graph: Graph) -> float:
        return self.op_measurement(node, graph).median_s

    def cost(self, graph: Graph) -> float:
        return sum(self.op_cost(n, graph) for n in graph.nodes.values())

    def measure(self, graph: Graph) -> Measurement:
        """The summed cost, with a spread combined from the per-op measurements."""
        counts: dict[str, int] = {}
        parts: dict[str, Measurement] = {}
        for n in graph.nodes.values():
            if is_free(n):
                continue
            config = op_config(n, graph, self.dtype)
            key = config_key(config)
            counts[key] = counts.get(key, 0) + 1
            if key not in parts:
                parts[key] = self._lookup(key, n, graph, config)
        return combine([(parts[k], counts[k]) for k in parts])

    def timing_device(self) -> str | None:
        return self.device

    def describe(self) -> str:
        where = f"cpu, {self.threads} thread{'s' if self.threads > 1 else ''}" if self.device == "cpu" else "cuda"
        return f"{self.name}({where}, {self.warmup}+{self.repeats} runs, cache {self.cache.path})"

    # ----- measuring ----------------------------------------------------------------------------
    def op_measurement(self, node: Node, graph: Graph) -> Measurement:
        """`node`'s timing: from this process, else the disk cache, else measured now (and stored)."""
        if is_free(node):
            return Measurement(0.0, 1, 0.0, 0.0, 0.0)
        config = op_config(node, graph, self.dtype)
        return self._lookup(config_key(config), node, graph, config)

    def _lookup(self, key: str, node: Node, graph: Graph, config: str) -> Measurement:
        m = self._measured.get(key)
        if m is not None:
            return m
        m = self.cache.get(key, self.device_id)
        if m is None:
            m = self.cache.put(key, self.device_id, config, self._time(node, graph))
            self.stats["measured"] += 1
        else:
            self.stats["cache_hits"] += 1
        self._measured[key] = m
        return m

    def _time(self, node: Node, graph: Graph) -> Measurement:
        single = op_graph(node, graph)
        with torch_threads(self.threads if self.device == "cpu" else None):
            if not is_known(node.op, node.domain):
                return self._time_ort(single)
            run = TorchExecutor(single, self.device, self._torch_dtype).bind(seed=self.seed,
                                                                           cuda_graph=self.cuda_graph)
            return time_run(run, warmup=self.warmup, repeats=self.repeats, timer=self.timer,
                            flush_l2=self.flush_l2, min_run_s=self.min_sample_s)

    def _time_ort(self, single: Graph) -> Measurement:
        from xrl.cost.ort import OrtCostModel

        ort = OrtCostModel(device=self.device, warmup=self.warmup, repeats=self.repeats,
                           threads=self.threads if self.device == "cpu" else None, seed=self.seed, cache=False)
        return ort.measure(single)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
