"""A tensor-parallel worker: one process per card beyond the first, holding its shard of the model.

Rank 0 (the caller's process) drives: it sends each step's sequences down a pipe, and every rank
prepares the same inputs and runs its shard; the collectives inside the layers keep the ranks in step.
Commands come over the pipe, not over the process group, so an idle engine never trips a collective
timeout; the worker leaves when told, when its parent disappears, or when it fails, and it reports a
failure (naming its cause) down the pipe before leaving. Every exit path destroys the process group.
"""

from __future__ import annotations

import contextlib
import os
import socket
import traceback
from collections.abc import Iterator
from datetime import timedelta
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

POLL_S = 0.5  # how often an idle worker checks that its parent is still there


CARD_BACKEND = "cpu:gloo,spyre:spyreccl"
"""The init string of a group of spyre cards, as torch-spyre spells it: gloo for host tensors, spyreccl for cards'."""


def backend_for(platform: object) -> str:
    """The c10d backend a group on ``platform`` (a name) uses: spyreccl for spyre tensors, else gloo alone."""
    if platform == "spyre":
        import spyre_lab.distributed  # noqa: F401  (registers spyreccl)

        return CARD_BACKEND
    return "gloo"


def init_group(rank: int, size: int, rendezvous: str, timeout_s: float, backend: str = "gloo") -> None:
    """Join the group through the rendezvous file rank 0 chose, with gloo for host tensors (and spyreccl for the
    cards' with ``backend=CARD_BACKEND``).

    A file, not a TCP store: nothing listens for the rendezvous (a TCP store serves on every interface),
    and the group's own connections are between the ranks' gloo endpoints on this machine."""
    try:
        with _loopback_only():
            dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=rank, world_size=size,
                                    timeout=timedelta(seconds=timeout_s))
    except BaseException:
        # A failed init leaves torch's count of groups made one higher (only destroy_process_group resets it), and
        # the default group's keys in the next rendezvous are named by that count: a later engine's rank 0 would
        # wait for keys its fresh workers never write. Undo it, as destroying the group would.
        if not dist.is_initialized():
            dist.distributed_c10d._world.group_count = 0
        raise


@contextlib.contextmanager
def _loopback_only() -> Iterator[None]:
    """Gloo's endpoints on the loopback interface (``GLOO_SOCKET_IFNAME``), unless the caller chose one: the
    cards of this engine are processes of one machine, and nothing should listen beyond it."""
    loopback = next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)
    if loopback is None or "GLOO_SOCKET_IFNAME" in os.environ:
        yield
        return
    os.environ["GLOO_SOCKET_IFNAME"] = loopback
    try:
        yield
    finally:
        del os.environ["GLOO_SOCKET_IFNAME"]


def threads_per_rank(size: int) -> int:
    """Intra-op threads for each of ``size`` ranks on this machine: its cores shared out, at least one.

    Every rank is a process with torch's own thread pool, by default one thread per core; ``size`` such pools on
    the same cores oversubscribe them, and the pools' threads spin while they wait for one another (measured on 2
    cores, TP 2 on the cpu platform: rank 0 spent 7.9 s of CPU on 32 decode steps with the default, 0.4 s with one
    thread a rank)."""
    return max(1, (os.cpu_count() or 1) // size)


def worker_main(rank: int, size: int, rendezvous: str, config, timeout_s: float, conn: Connection, parent: int) -> None:
    """Build this rank's shard of the model as ``config`` describes, then serve rank 0's commands."""
    torch.set_num_threads(threads_per_rank(size))
    try:
        init_group(rank, size, rendezvous, timeout_s, backend_for(config.platform))
        runner = _build_runner(rank, size, config)
        conn.send(("ready",))
        _serve(rank, runner, conn, parent)
    except BaseException as error:
        where = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
        detail = f"{type(error).__name__}: {error}" + (f" (at {where.filename}:{where.lineno})" if where else "")
        with contextlib.suppress(OSError):
            conn.send(("error", detail))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        conn.close()


def _build_runner(rank: int, size: int, config):
    from spyre_lab.engine.loader import load_model, resolve_model_path
    from spyre_lab.engine.model_runner import ModelRunner
    from spyre_lab.engine.parallel.group import TensorParallelGroup
    from spyre_lab.engine.platforms.registry import resolve_platform

    platform = resolve_platform(config.platform, **config.platform_options)
    if platform.static_shapes:
        platform.configure_buckets(config.max_model_len, config.max_num_seqs)
    model = load_model(resolve_model_path(config.model), platform, config.dtype, TensorParallelGroup(rank, size))
    return ModelRunner(model, platform, config.block_size, config.num_kv_blocks, config.max_model_len,
                       config.dtype, config.seed)


def _run_step(runner, seqs, is_prefill: bool):
    """One step of this rank's shard, timed as rank 0 times its own (the platform knows the step's bucket); the
    step's modeled events (None on a platform without a device model)."""
    model_input = runner.prepare_prefill(seqs) if is_prefill else runner.prepare_decode(seqs)
    kind = "prefill" if is_prefill else "decode"
    with runner.platform.device_timer(kind, model_input.input_ids.numel(), len(seqs)) as timing:
        runner.execute(model_input)
        runner.platform.synchronize()
    return timing.trace


def step_collectives(trace) -> list[tuple]:
    """The collectives of one step's modeled trace (events on the ``card<r>.ccl`` lanes spyreccl charges), as
    (lane, name, start from the step's first event in us, duration us, args): what a rank sends rank 0."""
    if trace is None or not len(trace):
        return []
    t0 = trace.start_us
    return [(e.lane, e.name, e.start_us - t0, e.dur_us, e.args) for e in trace.events if e.lane.endswith(".ccl")]


def _serve(rank: int, runner, conn: Connection, parent: int) -> None:
    while True:
        if not conn.poll(POLL_S):
            if os.getppid() != parent:  # rank 0 is gone: nothing will drive this shard again
                return
            continue
        command, *args = conn.recv()
        if command == "stop":
            return
        if command == "run":
            seqs, is_prefill, send_collectives = args
            trace = _run_step(runner, seqs, is_prefill)
            if send_collectives:
                conn.send(("collectives", step_collectives(trace)))
        elif command == "warmup":
            runner.warmup(show_progress=False)
        elif command == "call":
            function, call_args = args
            conn.send(("result", function(rank, runner, *call_args)))
        else:
            raise ValueError(f"unknown command {command!r} from rank 0")
