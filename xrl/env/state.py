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
from typing import TYPE_CHECKING, Any

from xrl.errors import ConfigError
from xrl.ir import Graph

if TYPE_CHECKING:
    from xrl.env.graph_rewrite import GraphRewriteEnv

CSV_FIELDS = ("graph", "graph_hash", "reward", "speedup", "cost", "actions")


@dataclass(frozen=True)
class EnvState:
    graph: str  # built-in graph name or model path: how to load the source again
    graph_hash: str  # the source graph's canonical hash
    actions: tuple[str, ...] = ()  # `rule@node,node`, in order
    reward: float = 0.0  # the episode's total reward
    cost: str = ""  # the cost model the reward was measured under
    speedup: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["actions"] = list(self.actions)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> EnvState:
        try:
            actions = d.get("actions", ())
            if isinstance(actions, str):
                actions = actions.split()
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


def load_source(spec: str) -> Graph:
    """The graph a state names: a built-in graph or a model file (ONNX or HLO text)."""
    from xrl.frontends.loader import load_model

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


def validate(env: GraphRewriteEnv, state: EnvState, *, seed: int = 0, rtol: float = 1e-3,
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
    # A measured cost (onnxruntime timing) is noisy: its reward cannot be reproduced, only the graph.
    measured = bool(getattr(env.cost_model, "measured", False))
    reward_ok = measured or math.isclose(reward, state.reward, rel_tol=1e-6, abs_tol=1e-6)
    if not reward_ok:
        errors.append(f"replay earned reward {reward:.6g}, the state says {state.reward:.6g}")
    ref = reference_model(replay._source, replay._start)
    res = compare_models(ref, to_onnx(replay.graph), seed=seed, rtol=rtol, atol=atol)
    if not res.ok:
        errors.append(f"outputs differ from the source: {res.detail}")
    return ValidationResult(reward_ok and res.ok, reward_ok, res.ok, reward, res.max_abs_err, tuple(errors))


# ----- files ------------------------------------------------------------------------------------
def dumps(states: Sequence[EnvState], fmt: str = "json") -> str:
    if fmt == "json":
        body: Any = states[0].to_dict() if len(states) == 1 else [s.to_dict() for s in states]
        return json.dumps(body, indent=2) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
        w.writeheader()
        for s in states:
            d = s.to_dict()
            d["actions"] = " ".join(s.actions)
            w.writerow({k: d[k] for k in CSV_FIELDS})
        return buf.getvalue()
    raise ConfigError(f"unknown state format {fmt!r}; choose json or csv")


def loads(text: str, fmt: str = "json") -> list[EnvState]:
    if fmt == "json":
        try:
            body = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"state file is not JSON: {e}") from None
        return [EnvState.from_dict(d) for d in (body if isinstance(body, list) else [body])]
    if fmt == "csv":
        return [EnvState.from_dict(row) for row in csv.DictReader(io.StringIO(text))]
    raise ConfigError(f"unknown state format {fmt!r}; choose json or csv")


def format_of(path: str | Path) -> str:
    return "csv" if str(path).lower().endswith(".csv") else "json"


def write_states(states: Iterable[EnvState], path: str | Path) -> Path:
    import os
    import tempfile

    path = Path(path)
    text = dumps(list(states), format_of(path))
    # atomic (a reader never sees half a file), under a name of this writer's own (two writers never collide)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_states(path: str | Path) -> list[EnvState]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"no such state file: {path}")
    return loads(path.read_text(), format_of(path))
