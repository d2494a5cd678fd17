"""Run one function on ``k`` ranks, one process per card, and get every rank's result or a clear error.

Why processes and a file: each rank is its own Python process with its own modeled card (torch-spyre runs
one card per process), and the rendezvous is a ``FileStore`` in a directory the parent chose, so no port is
ever left bound. The parent starts ``k`` interpreters of :mod:`spyre_lab.distributed.worker`, each of which
calls ``init_process_group(backend, store=FileStore)``, runs ``function(rank, world_size, *args)``, writes its
JSON result and calls ``destroy_process_group`` on every exit path. If a rank fails (raises, dies, or the
whole run passes ``timeout_s``), the parent kills the ranks still running, reaps them, and raises
:class:`RankFailedError` naming the rank and the cause.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MAX_RANKS = 8
DEFAULT_BACKEND = "cpu:gloo,spyre:spyreccl"


class RankFailedError(RuntimeError):
    """A rank of :func:`run_ranks` raised, died or timed out; ``rank`` says which."""

    def __init__(self, rank: int, cause: str) -> None:
        super().__init__(f"rank {rank} failed: {cause}")
        self.rank = rank
        self.cause = cause


def _stderr_tail(path: Path, lines: int = 12) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return "\n".join(text[-lines:]) or "(no output)"


def _stop(procs: list[subprocess.Popen]) -> None:
    """Kill the ranks still running and reap every one (no orphans, no zombies)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


PEER_LOST = ("closed by peer", "reset by peer", "remote worker crashing")
"""What a rank's error says when it failed only because another rank went away mid-collective."""

ROOT_CAUSE_GRACE_S = 5.0
"""How long to wait for the rank that caused a lost-peer failure to exit too, so it is the one named."""


def _lost_a_peer(workdir: Path, rank: int) -> bool:
    tail = _stderr_tail(workdir / f"rank{rank}.err")
    return any(phrase in tail for phrase in PEER_LOST)


def _watch(procs: list[subprocess.Popen], workdir: Path, deadline: float) -> None:
    """Wait for all ranks; raise RankFailedError for the rank that failed first or at the deadline.

    A rank that raises tears its process group down, so a peer waiting in a collective fails too, and either may
    exit first. The error names the cause: a rank whose own error is a lost peer is named only if no other rank
    failed by itself within :data:`ROOT_CAUSE_GRACE_S`."""
    grace_until = None
    while True:
        failed = [(r, p.returncode) for r, p in enumerate(procs) if p.poll() not in (None, 0)]
        if failed:
            causes = [(r, code) for r, code in failed if not _lost_a_peer(workdir, r)]
            grace_until = grace_until or min(deadline, time.monotonic() + ROOT_CAUSE_GRACE_S)
            running = any(p.poll() is None for p in procs)
            if causes or not running or time.monotonic() > grace_until:
                rank, code = (causes or failed)[0]
                raise RankFailedError(rank, f"exit code {code}:\n{_stderr_tail(workdir / f'rank{rank}.err')}")
        elif all(p.poll() == 0 for p in procs):
            return
        if time.monotonic() > deadline:
            rank = next(r for r, p in enumerate(procs) if p.poll() is None)
            raise RankFailedError(rank, "timed out (still running at the deadline; the other ranks were waiting "
                                        f"in a collective?)\n{_stderr_tail(workdir / f'rank{rank}.err')}")
        time.sleep(0.05)


def run_ranks(script: str | os.PathLike, function: str, world_size: int, args: tuple = (),
              timeout_s: float = 60.0, backend: str = DEFAULT_BACKEND) -> list[Any]:
    """Run ``function(rank, world_size, *args)`` from file ``script`` on ``world_size`` ranks; their results.

    ``args`` and each result must be JSON values. ``timeout_s`` bounds the whole run (also the c10d timeout).
    """
    if not 1 <= world_size <= MAX_RANKS:
        raise ValueError(f"world_size must be 1..{MAX_RANKS} (one process per card), got {world_size}")
    script = Path(script).resolve()
    if not script.is_file():
        raise FileNotFoundError(f"no worker script at {script}")
    with tempfile.TemporaryDirectory(prefix="spyreccl-") as tmp:
        workdir = Path(tmp)
        spec = {"script": str(script), "function": function, "world_size": world_size, "args": list(args),
                "store": str(workdir / "store"), "backend": backend, "timeout_s": timeout_s}
        procs = []
        try:
            for rank in range(world_size):
                err = open(workdir / f"rank{rank}.err", "wb")  # noqa: SIM115 (closed when the child ends)
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "spyre_lab.distributed.worker", json.dumps({**spec, "rank": rank}),
                     str(workdir / f"rank{rank}.json")], stdout=subprocess.DEVNULL, stderr=err,
                    env={**os.environ, "OMP_NUM_THREADS": "1"}))
                err.close()
            _watch(procs, workdir, time.monotonic() + timeout_s)
        finally:
            _stop(procs)
        return [json.loads((workdir / f"rank{r}.json").read_text()) for r in range(world_size)]
