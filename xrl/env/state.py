"""CompilerGym-style episode states of the rewrite environment: record, write, read, replay, validate.

An `EnvState` names the source graph (a built-in graph name or a model path), its canonical hash
(so a replay on a different graph fails loudly), the rewrites applied as `rule@node,node`, and the
reward and speed-up the episode earned. States are written as JSON (one object, or a list) or CSV
(CompilerGym's columns: graph, graph_hash, reward, speedup, cost, actions joined by spaces).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from xrl.cost.base import CostModel
from xrl.errors import ConfigError
from xrl.ir import Graph

CSV_FIELDS = ("graph", "graph_hash", "reward", "speedup", "cost", "actions")
# A state file is a record of a few episodes, read from wherever a user got it: bounded before it is parsed.
MAX_FILE_BYTES = 16 << 20
MAX_STATES = 256  # distinct states replayed from one file (a warning says how many more were cut)
MAX_SOURCES = 32  # distinct source graphs in one file: each is loaded once and kept while replaying
MAX_ACTIONS = 10_000  # rewrites in one state
CSV_FIELD_LIMIT = 1 << 20  # one CSV field (a state's actions joined by spaces)


@dataclass(frozen=True)
class EnvState:
    graph: str  # built-in graph name or model path: how to load the source again
    graph_hash: str  # the source graph's canonical hash
    actions: tuple[str, ...] = ()  # `rule@node,node`, in order
    reward: float = 0.0  # the episode's total reward
    cost: str = ""  # the cost model the reward was measured under
    speedup: float = 1.0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["actions"] = list(self.actions)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> EnvState:
        if not isinstance(d, dict):
            raise ConfigError(f"not an xrl environment state: expected an object, got {type(d).__name__}")
        try:
            actions = d.get("actions", ())
            if isinstance(actions, str):
                actions = actions.split()
            if not isinstance(actions, list | tuple) or not all(isinstance(a, str) for a in actions):
                raise TypeError("actions must be a list of `rule@location` strings")
            if len(actions) > MAX_ACTIONS:
                raise ValueError(f"{len(actions)} actions, at most {MAX_ACTIONS}")
            if not isinstance(d["graph"], str) or not isinstance(d["graph_hash"], str):
                raise TypeError("graph and graph_hash must be strings")
            return EnvState(graph=str(d["graph"]), graph_hash=str(d["graph_hash"]), actions=tuple(map(str, actions)),
                            reward=float(d.get("reward") or 0.0), cost=str(d.get("cost") or ""),
                            speedup=float(d.get("speedup") or 1.0))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"not an xrl environment state: {type(e).__name__}: {e}") from None


@dataclass(frozen=True)
class ValidationResult:
    ok: bool
    reward_reproduced: bool
    outputs_match: bool
    reward: float  # the reward the replay earned
    max_abs_err: float
    errors: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        head = "valid" if self.ok else "INVALID"
        tail = f": {'; '.join(self.errors)}" if self.errors else ""
        return f"{head} (reward {self.reward:.4f}, max abs error {self.max_abs_err:.3g}){tail}"


def check_source(spec: str) -> None:
    """A state's `graph` must be a built-in graph name or a regular file: a state file must not make xrl
    read /dev/zero until memory runs out, nor wait on a FIFO for good."""
    from xrl.frontends.loader import check_regular_file, names_a_file

    if not spec or "\0" in spec:
        raise ConfigError(f"a state names the graph {spec!r}: not a built-in graph name or a model file")
    if names_a_file(spec):  # a built-in name: an unknown one fails with the list of names when it is built
        check_regular_file(Path(spec), f"a state's graph {spec!r}")


def load_source(spec: str) -> Graph:
    """The graph a state names: a built-in graph or a model file (ONNX or HLO text)."""
    from xrl.frontends.loader import load_model

    check_source(spec)
    return load_model(spec).graph


def reference_model(spec: str | None, graph: Graph):
    """The ONNX model the result is checked against: the source's own model where it has one."""
    from xrl.frontends.onnx_io import to_onnx

    if spec is not None:
        try:
            from xrl.frontends.loader import load_model

            loaded = load_model(spec)
            if loaded.graph.canonical_hash == graph.canonical_hash:
                return loaded.reference
        except Exception:  # noqa: BLE001  (a name that no longer loads: check against the IR's export)
            pass
    return to_onnx(graph)


class Replayable(Protocol):
    """What `validate` replays a state on (xrl.env.graph_rewrite.GraphRewriteEnv), named here so that this
    module, which the env imports, does not import it back."""

    cost_model: CostModel
    episode_reward: float

    @property
    def graph(self) -> Graph: ...
    @property
    def start_graph(self) -> Graph: ...
    @property
    def source(self) -> str | None: ...
    def replica(self) -> Replayable: ...
    def apply(self, state: EnvState) -> None: ...


def validate(env: Replayable, state: EnvState, *, seed: int = 0, rtol: float = 1e-3,
             atol: float = 1e-4) -> ValidationResult:
    """Replay `state` on a fresh copy of `env`; check the reward and the outputs (see GraphRewriteEnv.validate)."""
    from xrl.frontends.onnx_io import to_onnx
    from xrl.frontends.verify import compare_models

    errors: list[str] = []
    replay = env.replica()
    try:
        replay.apply(state)
    except ConfigError as e:
        return ValidationResult(False, False, False, math.nan, math.inf, (str(e),))
    reward = replay.episode_reward
    ref = reference_model(replay.source, replay.start_graph)
    res = compare_models(ref, to_onnx(replay.graph), seed=seed, rtol=rtol, atol=atol)
    if not res.ok:
        errors.append(f"outputs differ from the source: {res.detail}")
    outputs = ValidationResult(res.ok, True, res.ok, reward, res.max_abs_err, tuple(errors))
    return with_reward_check(outputs, state, measured=env.cost_model.measured)


def with_reward_check(replayed: ValidationResult, state: EnvState, *, measured: bool) -> ValidationResult:
    """`replayed` (the replay of the state's actions: its reward and output check) judged against the reward
    `state` claims. States that differ only in their reward share one replay."""
    if math.isnan(replayed.reward):  # the actions did not replay: that is the error, whatever the reward
        return replayed
    # A measured cost (onnxruntime timing) is noisy: its reward cannot be reproduced, only the graph.
    reward_ok = measured or math.isclose(replayed.reward, state.reward, rel_tol=1e-6, abs_tol=1e-6)
    errors = [e for e in replayed.errors if not e.startswith("replay earned reward")]
    if not reward_ok:
        errors.insert(0, f"replay earned reward {replayed.reward:.6g}, the state says {state.reward:.6g}")
    return ValidationResult(reward_ok and replayed.outputs_match, reward_ok, replayed.outputs_match, replayed.reward,
                            replayed.max_abs_err, tuple(errors))


# ----- files ------------------------------------------------------------------------------------
def dumps(states: Sequence[EnvState], fmt: str = "json") -> str:
    if fmt == "json":
        body: Any = states[0].to_json() if len(states) == 1 else [s.to_json() for s in states]
        return json.dumps(body, indent=2) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
        w.writeheader()
        for s in states:
            d = s.to_json()
            d["actions"] = " ".join(s.actions)
            w.writerow({k: d[k] for k in CSV_FIELDS})
        return buf.getvalue()
    raise ConfigError(f"unknown state format {fmt!r}; choose json or csv")


def loads(text: str, fmt: str = "json") -> list[EnvState]:
    if fmt == "json":
        try:
            body = json.loads(text)
        except ValueError as e:  # JSONDecodeError, or a number of thousands of digits
            raise ConfigError(f"state file is not JSON: {str(e)[:200]}") from None
        except RecursionError:
            raise ConfigError("state file is not a state: its JSON is nested too deeply") from None
        if not isinstance(body, dict | list):
            raise ConfigError(f"state file holds a JSON {type(body).__name__}; expected a state object or a list "
                              "of them")
        return [EnvState.from_dict(d) for d in (body if isinstance(body, list) else [body])]
    if fmt == "csv":
        previous = csv.field_size_limit(CSV_FIELD_LIMIT)
        try:
            rows = list(csv.DictReader(io.StringIO(text)))
        except csv.Error as e:
            raise ConfigError(f"state file is not CSV with the columns {', '.join(CSV_FIELDS)}: {e}") from None
        finally:
            csv.field_size_limit(previous)
        return [EnvState.from_dict(row) for row in rows]
    raise ConfigError(f"unknown state format {fmt!r}; choose json or csv")


def format_of(path: str | Path) -> str:
    return "csv" if str(path).lower().endswith(".csv") else "json"


def write_states(states: Iterable[EnvState], path: str | Path) -> Path:
    from xrl.atomic import write_atomic

    path = Path(path)
    # atomic (a reader never sees half a file), under a name of this writer's own (two writers never collide)
    return write_atomic(path, dumps(list(states), format_of(path)))


def read_states(path: str | Path, *, limit: int | None = MAX_STATES) -> list[EnvState]:
    """The distinct states of a file (a repeated state is kept once), at most `limit` of them and of at most
    MAX_SOURCES source graphs: a warning says what was cut. Only regular files are read, and at most
    MAX_FILE_BYTES of them; every state's source must be a built-in graph or a regular file."""
    import os
    import stat
    import warnings

    from xrl.errors import XrlWarning

    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"no such state file: {path}") from None
    except OSError as e:
        raise ConfigError(f"cannot read state file {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path} is not a regular file (a directory, device or pipe); give a state file "
                          "(.json or .csv)")
    if st.st_size > MAX_FILE_BYTES:
        raise ConfigError(f"state file {path} has {st.st_size:,} bytes, over the limit of {MAX_FILE_BYTES:,}; "
                          "split it")
    with path.open("rb") as f:
        raw = f.read(MAX_FILE_BYTES + 1)  # the file may have grown since stat
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"state file {path} is over the limit of {MAX_FILE_BYTES:,} bytes; split it")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"state file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    states = list(dict.fromkeys(loads(text, format_of(path))))  # distinct, in file order
    kept, sources = [], set()
    for s in states:
        if limit is not None and len(kept) >= limit:
            break
        if s.graph not in sources and len(sources) >= MAX_SOURCES:
            continue
        sources.add(s.graph)
        kept.append(s)
    if len(kept) < len(states):
        warnings.warn(f"{path}: replaying {len(kept)} of its {len(states)} distinct states (at most {limit} states "
                      f"of at most {MAX_SOURCES} source graphs per file); split the file for the rest",
                      XrlWarning, stacklevel=2)
    for source in sources:
        check_source(source)
    return kept
