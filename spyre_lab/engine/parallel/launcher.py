"""Rank 0's side of tensor parallelism: start one worker per extra card, join the group, drive every step.

`TensorParallelWorkers` spawns ranks 1..k-1 (``spawn``, so a worker starts from a clean interpreter),
chooses the rendezvous in this process (a file in a fresh temporary directory) and joins the gloo group as
rank 0 with a short timeout. `TensorParallelRunner` wraps rank 0's `ModelRunner`: before each step it
sends the scheduled sequences to every worker, then runs its own shard. When a worker dies or raises,
the collective rank 0 is waiting in fails (the peer's sockets close) or times out; rank 0 then reads
the workers' reports and exit codes and raises one `TensorParallelError` naming the rank and cause,
after stopping every worker and destroying the group, so no process, file or socket is left behind.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import tempfile
import time
import weakref
from typing import Any

import torch
import torch.distributed as dist

from spyre_lab.device.trace import Trace, TraceEvent
from spyre_lab.engine.parallel.group import TensorParallelGroup
from spyre_lab.engine.parallel.worker import backend_for, init_group, threads_per_rank, worker_main

REPORT_GRACE_S = 5.0  # how long a failed step waits for a worker's report or exit code
STOP_GRACE_S = 5.0  # how long a stopping worker may take before it is killed


class TensorParallelError(RuntimeError):
    """A tensor-parallel rank failed; the message names the rank and the cause. The engine cannot continue."""


class TensorParallelWorkers:
    """Ranks 1..k-1 as processes, and this process as rank 0 of their group."""

    def __init__(self, config: Any, timeout_s: float) -> None:
        if dist.is_initialized():
            raise RuntimeError("this process already belongs to a torch.distributed group (another LLM with "
                               "tensor_parallel_size > 1 is open?); close it first (LLM.close())")
        size = config.tensor_parallel_size
        self.group = TensorParallelGroup(0, size)
        self._threads = torch.get_num_threads()  # rank 0 shares the cores with its workers until close()
        torch.set_num_threads(min(self._threads, threads_per_rank(size)))
        self._rendezvous_dir = tempfile.TemporaryDirectory(prefix="spyre-lab-tp-")
        self.rendezvous = os.path.join(self._rendezvous_dir.name, "rendezvous")
        context = mp.get_context("spawn")
        self.workers: list[tuple[int, Any, Any]] = []
        for rank in range(1, size):
            here, there = context.Pipe()
            process = context.Process(target=worker_main, name=f"spyre-lab tensor-parallel rank {rank}", daemon=True,
                                      args=(rank, size, self.rendezvous, config, timeout_s, there, os.getpid()))
            process.start()
            there.close()
            self.workers.append((rank, process, here))
        self._finalizer = weakref.finalize(self, _stop, self.workers)
        self.failed: TensorParallelError | None = None
        try:
            init_group(0, size, self.rendezvous, timeout_s, backend_for(config.platform))
        except Exception as error:
            raise self.failure(error) from error

    @property
    def pids(self) -> dict[int, int]:
        return {rank: process.pid for rank, process, _ in self.workers}

    def send(self, *command: Any) -> None:
        """Send a command to every worker; a TensorParallelError if one is gone."""
        if self.failed is not None:
            raise self.failed
        try:
            for _, _, conn in self.workers:
                conn.send(command)
        except OSError as error:
            raise self.failure(error) from error

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until every worker has built its shard (or report the one that could not)."""
        for rank, _, conn in self.workers:
            reply = self._reply(rank, conn, timeout_s)
            if reply[0] != "ready":
                raise self.failure(RuntimeError(f"rank {rank} answered {reply[0]!r} instead of 'ready'"))

    def call(self, function: Any, *args: Any) -> list[Any]:
        """``function(rank, runner, *args)`` on every worker; their results in rank order (1..k-1)."""
        self.send("call", function, args)
        return [self._reply(rank, conn, None)[1] for rank, _, conn in self.workers]

    def collect(self, kind: str) -> list[Any]:
        """Every worker's next message, which must be a ``kind`` one: its payloads in rank order (1..k-1)."""
        payloads = []
        for rank, _, conn in self.workers:
            reply = self._reply(rank, conn, None)
            if reply[0] != kind:
                raise self.failure(RuntimeError(f"rank {rank} answered {reply[0]!r} instead of {kind!r}"))
            payloads.append(reply[1])
        return payloads

    def _reply(self, rank: int, conn: Any, timeout_s: float | None) -> tuple:
        process = dict((r, p) for r, p, _ in self.workers)[rank]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not conn.poll(0.2):
            if not process.is_alive() or (deadline is not None and time.monotonic() > deadline):
                raise self.failure(TimeoutError(f"rank {rank} did not answer"))
        try:
            reply = conn.recv()
        except EOFError as error:
            raise self.failure(error) from error
        if reply[0] == "error":
            self._pending = {rank: reply[1]}
            raise self.failure(RuntimeError(reply[1]))
        return reply

    def failure(self, cause: BaseException) -> TensorParallelError:
        """Stop everything and return the error that names the failed rank(s) and why (raise it)."""
        if self.failed is not None:
            return self.failed
        _drop_frames(cause)  # a failed collective's frames hold the process group (and its sockets) alive
        reports = dict(getattr(self, "_pending", {}))
        deadline = time.monotonic() + REPORT_GRACE_S
        while not reports and time.monotonic() < deadline:
            for rank, process, conn in self.workers:
                detail = _report(conn)
                if detail is not None:
                    reports[rank] = f"raised {detail}"
                elif not process.is_alive():
                    reports[rank] = f"died ({_exit_reason(process.exitcode)})"
            if not reports:
                time.sleep(0.05)
        self.close()
        if reports:
            what = "; ".join(f"rank {rank} {why}" for rank, why in sorted(reports.items()))
        else:
            what = f"rank 0 failed: {type(cause).__name__}: {cause}"
        self.failed = TensorParallelError(f"tensor-parallel group of {self.group.size} failed: {what}. The engine "
                                          "cannot continue; build a new LLM")
        return self.failed

    def close(self) -> None:
        """Stop every worker, destroy the group (this process's rank 0 too); safe to call twice."""
        self._finalizer()
        if dist.is_initialized():
            dist.destroy_process_group()
        self._rendezvous_dir.cleanup()
        torch.set_num_threads(self._threads)


def _drop_frames(error: BaseException | None) -> None:
    while error is not None:
        error.__traceback__ = None
        error = error.__cause__ or error.__context__


def _report(conn: Any) -> str | None:
    try:
        while conn.poll(0):
            message = conn.recv()
            if message[0] == "error":
                return message[1]
    except (EOFError, OSError):
        return None
    return None


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "no exit code yet"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _stop(workers: list[tuple[int, Any, Any]]) -> None:
    """Tell each worker to stop, join it (killing any that outlive the grace period) and close the pipes; also run
    when the launcher is collected or the interpreter exits without `close()`."""
    for _, _, conn in workers:
        with contextlib.suppress(OSError):
            conn.send(("stop",))
    deadline = time.monotonic() + STOP_GRACE_S
    for _, process, conn in workers:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(1.0)
        conn.close()


def with_peer_collectives(trace: Any, peers: list[list[tuple]]) -> Any:
    """Rank 0's step ``trace`` with each worker's collectives of the same step added on that card's lane.

    Every card has its own modeled clock; the workers' events are placed from the start of rank 0's step (their
    offsets from their own step's start are kept), so one step's collectives line up card by card."""
    if trace is None or not len(trace) or not any(peers):
        return trace
    t0 = trace.start_us
    events = [TraceEvent(lane, name, t0 + start, dur, args) for events in peers for lane, name, start, dur, args
              in events]
    return Trace([*trace.events, *events], meta=trace.meta)


class TensorParallelRunner:
    """Rank 0's `ModelRunner` with the workers in step: every step and warmup runs on all ranks."""

    def __init__(self, runner: Any, workers: TensorParallelWorkers) -> None:
        self.runner, self.workers = runner, workers

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def run(self, seqs: list, is_prefill: bool, num_decode: int | None = None) -> Any:
        """One step on every rank; on a platform that records modeled traces, rank 0's step trace also gets each
        worker's collectives, on that card's own lane (`with_peer_collectives`). Never a mixed step: the workers'
        step command carries no decode count, and `EngineConfig` refuses ``mixed_steps`` with tensor parallelism."""
        if is_prefill and num_decode:
            raise ValueError("a tensor-parallel engine runs prefill and decode steps apart; set mixed_steps=False")
        records = self.runner.platform.device_type != "cpu"
        self.workers.send("run", seqs, is_prefill, records)
        result = self._guarded(self.runner.run, seqs, is_prefill)
        if records:
            peers = self._guarded(self.workers.collect, "collectives")
            result.device_trace = with_peer_collectives(result.device_trace, peers)
        return result

    def step_logits(self, seqs: list, is_prefill: bool) -> Any:
        """Rank 0's logits of one step over ``seqs`` (each sequence's last token), every rank running it."""
        self.workers.send("run", seqs, is_prefill, False)
        prepare = self.runner.prepare_prefill if is_prefill else self.runner.prepare_decode
        return self._guarded(lambda: self.runner.execute(prepare(seqs)))

    def warmup(self, show_progress: bool = True) -> Any:
        if not self.runner.platform.static_shapes:
            return []
        self.workers.send("warmup")
        return self._guarded(self.runner.warmup, show_progress)

    def _guarded(self, method: Any, *args: Any) -> Any:
        try:
            return method(*args)
        except Exception as error:
            raise self.workers.failure(error) from error
