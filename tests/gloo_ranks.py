"""Real ranks for the multi-process tests: one script started ``world`` times on 127.0.0.1 with
``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set (what torchrun sets), each process
waited for, and what rank 0 printed last given back."""
from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) while the block runs: other
    processes doing the same wait their turn (conftest.py's ``job_turn``)."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_ranks(script: Path, world: int, *, timeout: float = 120, env: Mapping[str, str] | None = None) -> str:
    """Run ``script`` as ranks 0..world-1 of one group; every rank must exit 0 (else the
    assertion shows every rank's output). Returns rank 0's last line of stdout."""
    base = {**(env if env is not None else os.environ), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world)}
    procs = [subprocess.Popen([sys.executable, str(script)], env={**base, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), outs
    return outs[0][0].strip().splitlines()[-1]
