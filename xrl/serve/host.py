"""The host's side of the pipe protocol (xrl.serve.pipe), in Python: drives a rewrite episode through a server.

An external optimiser in any language does the same: write the header once, then for each decision
the observation, and read the advice.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from xrl.serve.pipe import (
    FifoWriter,
    TensorSpec,
    check_fifos,
    check_timeout,
    open_fifo,
    read_advice,
    specs_of,
    write_header,
    write_observation,
)

ADVICE = TensorSpec("action", (1,), "int64")


@contextlib.contextmanager
def host_pipes(in_path: str, out_path: str, timeout: float | None) -> Iterator[tuple[FifoWriter, int]]:
    """The host's ends: IN for writing (waiting at most `timeout` for the server to open it), then OUT for
    reading; (writer, fd). Nothing blocks in open(): a server that never starts is an error, not a hang."""
    timeout = check_timeout(timeout)
    check_fifos(in_path, out_path)
    with FifoWriter(open_fifo(in_path, "w", timeout), timeout, f"the observation pipe {in_path}") as to_server:
        from_server = open_fifo(out_path, "r", timeout)
        try:
            yield to_server, from_server
        finally:
            os.close(from_server)


def drive(env: Any, in_path: str, out_path: str, *, seed: int = 0, timeout: float | None = 60.0) -> list[str]:
    """Run one episode of `env` (a GraphRewriteEnv with a graph observation), asking the server at each
    step; the rewrites applied (`rule@location`). Opens IN for writing, then OUT for reading."""
    obs, _ = env.reset(seed=seed)
    features = specs_of(obs)
    with host_pipes(in_path, out_path, timeout) as (to_server, from_server):
        write_header(to_server, features, ADVICE)
        done, k = False, 0
        while not done:
            write_observation(to_server, features, obs, k)
            action = int(read_advice(from_server, ADVICE, timeout)[0])
            obs, _, terminated, truncated, _ = env.step(action)
            done, k = terminated or truncated, k + 1
    return list(env.actions)
