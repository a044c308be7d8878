"""The host's side of the pipe protocol (xrl.serve.pipe), in Python: drives a rewrite episode through a server.

An external optimiser in any language does the same: write the header once, then for each decision
the observation, and read the advice.
"""

from __future__ import annotations

from typing import Any

from xrl.serve.pipe import TensorSpec, read_advice, specs_of, write_header, write_observation

ADVICE = TensorSpec("action", (1,), "int64")


def drive(env: Any, in_path: str, out_path: str, *, seed: int = 0, timeout: float | None = 60.0) -> list[str]:
    """Run one episode of `env` (a GraphRewriteEnv with a graph observation), asking the server at each
    step; the rewrites applied (`rule@location`). Opens IN for writing, then OUT for reading."""
    obs, _ = env.reset(seed=seed)
    features = specs_of(obs)
    with open(in_path, "wb", buffering=0) as to_server, open(out_path, "rb", buffering=0) as from_server:
        write_header(to_server, features, ADVICE)
        done, k = False, 0
        while not done:
            write_observation(to_server, features, obs, k)
            action = int(read_advice(from_server, ADVICE, timeout)[0])
            obs, _, terminated, truncated, _ = env.step(action)
            done, k = terminated or truncated, k + 1
    return list(env.actions)
