"""Functions the spyreccl tests run on every rank (through ``run_ranks``): each returns JSON for the parent."""

from __future__ import annotations

import atexit
import time

import torch
import torch.distributed as dist

from spyre_lab.runtime import recording


def _values(rank: int, n: int = 96) -> torch.Tensor:
    """Rank-specific fp16 values, exactly representable so CPU and card sums agree."""
    return (torch.arange(n, dtype=torch.float16) % 17 + rank * 0.5).reshape(8, n // 8)


def _check(name: str, got: torch.Tensor, want: torch.Tensor, failures: list[str]) -> None:
    if not torch.equal(got.cpu(), want):
        failures.append(f"{name}: card {got.cpu().flatten()[:4].tolist()} != cpu {want.flatten()[:4].tolist()}")


def numerics(rank: int, world: int) -> dict:
    """Every supported collective on spyre tensors against the same collective on CPU tensors (gloo)."""
    failures: list[str] = []
    x = _values(rank)
    cpu, card = x.clone(), x.to("spyre")
    dist.all_reduce(cpu)
    dist.all_reduce(card)
    _check("all_reduce", card, cpu, failures)

    cpu, card = x.clone(), x.to("spyre")
    dist.broadcast(cpu, src=1)
    dist.broadcast(card, src=1)
    _check("broadcast", card, cpu, failures)

    cpu_out = [torch.empty_like(x) for _ in range(world)]
    card_out = [torch.empty_like(x, device="spyre") for _ in range(world)]
    dist.all_gather(cpu_out, x)
    dist.all_gather(card_out, x.to("spyre"))
    for i in range(world):
        _check(f"all_gather[{i}]", card_out[i], cpu_out[i], failures)

    root = world - 1
    cpu_out = [torch.empty_like(x) for _ in range(world)] if rank == root else None
    card_out = [torch.empty_like(x, device="spyre") for _ in range(world)] if rank == root else None
    dist.gather(x, cpu_out, dst=root)
    dist.gather(x.to("spyre"), card_out, dst=root)
    if rank == root:
        for i in range(world):
            _check(f"gather[{i}]", card_out[i], cpu_out[i], failures)

    cpu, card = x.clone(), x.to("spyre")
    dist.reduce(cpu, dst=0)
    dist.reduce(card, dst=0)
    if rank == 0:
        _check("reduce", card, cpu, failures)

    bf = x.to(torch.bfloat16)  # bf16 never travels on gloo: the backend converts
    card = bf.to("spyre")
    dist.all_reduce(card)
    want = x.float().clone()
    dist.all_reduce(want)
    _check("all_reduce bf16", card.float(), want.to(torch.bfloat16).float(), failures)

    if rank < 2:
        peer = 1 - rank
        if rank == 0:
            dist.send(x.to("spyre"), dst=peer)
        else:
            got = torch.empty_like(x, device="spyre")
            dist.recv(got, src=peer)
            _check("send/recv", got, _values(peer), failures)
    dist.barrier()
    return {"failures": failures, "backend": dist.get_backend()}


def unsupported(rank: int, world: int) -> dict:
    """Each collective spyreccl refuses, on spyre tensors: the exception's type and message."""
    from spyre_lab.distributed import SpyreCCLNotSupportedError

    t = torch.ones(world * 4, dtype=torch.float16, device="spyre")
    parts = [torch.ones(4, dtype=torch.float16, device="spyre") for _ in range(world)]
    calls = {
        "scatter": lambda: dist.scatter(parts[0], parts if rank == 0 else None, src=0),
        "reduce_scatter": lambda: dist.reduce_scatter(parts[0], parts),
        "alltoall": lambda: dist.all_to_all(parts, [p.clone() for p in parts]),
        "_allgather_base": lambda: dist.all_gather_into_tensor(t, parts[0]),
        "allreduce_coalesced": lambda: dist.all_reduce_coalesced([parts[0], parts[1]]),
        "_reduce_scatter_base": lambda: dist.reduce_scatter_tensor(parts[0], t),
        "alltoall_base": lambda: dist.all_to_all_single(t, t.clone()),
    }
    seen = {}
    for name, call in calls.items():
        try:
            call()
            seen[name] = "no error"
        except SpyreCCLNotSupportedError as exc:
            seen[name] = str(exc)
        except Exception as exc:  # reported to the parent, which asserts on it
            seen[name] = f"wrong error {type(exc).__name__}: {exc}"
    # the same methods still serve CPU tensors, through gloo
    cpu_parts = [torch.full((4,), float(r), dtype=torch.float16) for r in range(world)]
    got = torch.zeros(4, dtype=torch.float16)
    dist.scatter(got, cpu_parts if rank == 0 else None, src=0)
    seen["cpu scatter"] = got.tolist()
    gathered = torch.zeros(world * 4, dtype=torch.float16)
    dist.all_to_all_single(gathered, torch.full((world * 4,), float(rank), dtype=torch.float16))
    seen["cpu all_to_all_single"] = gathered.tolist()
    dist.barrier()
    return seen


def timed_allreduce(rank: int, world: int, sizes: list[int]) -> list[dict]:
    """The modeled all-reduce events on this rank's card lane, one per message size."""
    out = []
    for n in sizes:
        card = torch.ones(n, dtype=torch.float16, device="spyre")
        with recording() as trace:
            dist.all_reduce(card)
        events = [e for e in trace.events if e.lane == f"card{rank}.ccl"]
        out.append({"n": n, "lanes": sorted({e.lane for e in trace.events}),
                    "events": [{"name": e.name, "dur_us": e.dur_us, **{k: e.args[k] for k in ("bytes", "rounds")}}
                               for e in events]})
    return out


def raises_on(rank: int, world: int, bad_rank: int) -> dict:
    """Rank ``bad_rank`` raises before the collective the others wait in."""
    if rank == bad_rank:
        raise ValueError(f"deliberate failure on rank {rank}")
    dist.all_reduce(torch.ones(8, dtype=torch.float16, device="spyre"))
    return {}


def raises_and_exits_late_on(rank: int, world: int, bad_rank: int) -> dict:
    """As :func:`raises_on`, but the failing rank's process lingers a second at exit, so the peer it left
    in the collective exits first with a lost-peer error."""
    if rank == bad_rank:
        atexit.register(time.sleep, 1.0)
    return raises_on(rank, world, bad_rank)


def everything(rank: int, world: int, sizes: list[int]) -> dict:
    """One rendezvous for all the passing checks (each process start costs seconds of CPU)."""
    return {"numerics": numerics(rank, world), "unsupported": unsupported(rank, world),
            "timed": timed_allreduce(rank, world, sizes)}


def dies_on(rank: int, world: int, bad_rank: int) -> dict:
    """Rank ``bad_rank`` dies without a Python exception (as a crashed process would)."""
    import os

    if rank == bad_rank:
        os._exit(3)
    dist.all_reduce(torch.ones(8, dtype=torch.float16, device="spyre"))
    return {}
