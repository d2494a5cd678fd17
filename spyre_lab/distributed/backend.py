"""``spyreccl``: a c10d backend for spyre tensors, modeled on torch-spyre's.

``dist.init_process_group("cpu:gloo,spyre:spyreccl")`` (or just ``"spyreccl"``) after
``import spyre_lab.distributed``: one card per process, synchronous only. Supported: send, recv, broadcast,
barrier, gather, allgather, reduce, allreduce. scatter, reduce_scatter, alltoall, ``_allgather_base`` and
allreduce_coalesced raise :class:`SpyreCCLNotSupportedError`, which names the workaround.

How it runs: the numerics go through a gloo group of its own (fp16/fp32, see :mod:`.staging`); then the
collective's **modeled** time, from its named algorithm over the card-to-card link (:mod:`.algorithms`,
:mod:`.links`), is enqueued on the card's current stream on the lane ``card<rank>.ccl`` and the host waits for
it, so the card's clock and the trace both show it. CPU tensors pass straight to gloo with no modeled time.

torch 2.13 sends ``all_gather_into_tensor`` to ``all_gather_single`` (spyreccl's ``_allgather_base``),
``reduce_scatter_tensor`` to ``reduce_scatter_single`` and ``all_to_all_single`` by that name; each is refused
like its older name. torch 2.13 lets a pure-Python backend be a ``ProcessGroup`` only, and c10d then uses it
for every device of the group; so this one also carries the ``cpu:gloo`` half of the init string,
through its own gloo group.
"""

from __future__ import annotations

import collections
import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

from spyre_lab.distributed import algorithms
from spyre_lab.distributed.algorithms import CollectiveCost
from spyre_lab.distributed.staging import card_bytes, empty_wire, from_wire, is_spyre, to_wire

BACKEND_NAME = "spyreccl"
HISTORY_LIMIT = 4096

@dataclass(frozen=True)
class Unsupported:
    """One collective spyreccl refuses on spyre tensors (as torch-spyre does), and what to do instead.

    ``method`` is the ``ProcessGroup`` method torch calls, ``refused_as`` the collective the error names,
    ``gloo`` the gloo method that still serves CPU tensors; the first ``tensor_args`` positional arguments hold
    tensors and ``arity`` arguments come before the options.
    """

    method: str
    refused_as: str
    gloo: str
    options: Callable[[], object]
    workaround: str
    tensor_args: int = 2
    arity: int = 2


_SLICE_OF_ALLREDUCE = "all_reduce the whole tensor and keep this rank's slice"
_SEND_RECV_PAIRS = "exchange the chunks with send/recv pairs, or all_gather and slice"

UNSUPPORTED = (
    Unsupported("scatter", "scatter", "scatter", dist.ScatterOptions,
                "broadcast the whole tensor from the source and keep this rank's slice"),
    Unsupported("reduce_scatter", "reduce_scatter", "reduce_scatter", dist.ReduceScatterOptions,
                _SLICE_OF_ALLREDUCE),
    Unsupported("reduce_scatter_single", "_reduce_scatter_base", "_reduce_scatter_base", dist.ReduceScatterOptions,
                _SLICE_OF_ALLREDUCE),
    Unsupported("alltoall", "alltoall", "alltoall", dist.AllToAllOptions, _SEND_RECV_PAIRS),
    Unsupported("all_to_all_single", "alltoall_base", "alltoall_base", dist.AllToAllOptions, _SEND_RECV_PAIRS,
                arity=4),
    Unsupported("all_gather_single", "_allgather_base", "_allgather_base", AllgatherOptions,
                "use list-form all_gather (one output tensor per rank) and torch.cat the list"),
    Unsupported("allreduce_coalesced", "allreduce_coalesced", "allreduce_coalesced", dist.AllreduceCoalescedOptions,
                "call all_reduce once per tensor (or flatten the tensors into one)", tensor_args=1, arity=1),
)
"""The one place that names each refused collective and its workaround."""

WORKAROUNDS = {spec.refused_as: spec.workaround for spec in UNSUPPORTED}


class SpyreCCLNotSupportedError(RuntimeError):
    """spyreccl does not implement this collective (as in torch-spyre); the message names the workaround."""


def _unsupported(op: str) -> SpyreCCLNotSupportedError:
    return SpyreCCLNotSupportedError(f"spyreccl does not support {op} on spyre tensors; workaround: {WORKAROUNDS[op]}")


def _flat(tensors: Sequence) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for item in tensors:
        out.extend(_flat(item) if isinstance(item, (list, tuple)) else [item])
    return out


def _card_of(tensors: Sequence) -> int | None:
    """The card index of the spyre tensors (None: all CPU); refuses a mix and several cards."""
    flat = _flat(tensors)
    spyre = [t for t in flat if is_spyre(t)]
    if not spyre:
        return None
    if len(spyre) != len(flat):
        raise ValueError("spyreccl: a collective's tensors must all be on spyre or all on the CPU; move them with "
                         ".to('spyre') or .cpu() first")
    cards = {t.device.index or 0 for t in spyre}
    if len(cards) > 1:
        raise ValueError(f"spyreccl drives one card per process, got tensors on spyre cards {sorted(cards)}; "
                         "give each process one card (torch.spyre.set_device(local_rank))")
    return cards.pop()


class DoneWork(dist.Work):
    """A collective that finished before it was returned: spyreccl is synchronous, as torch-spyre's is, so
    ``wait()`` has nothing left to wait for and the future already holds the result."""

    def __init__(self, result: object) -> None:
        super().__init__()
        self._future: torch.futures.Future = torch.futures.Future()
        self._future.set_result(result)

    def wait(self, timeout: object = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future


def _done(result: object) -> dist.Work:
    return DoneWork(result)


class SpyreCCLProcessGroup(dist.ProcessGroup):
    """The spyreccl group: gloo for the values, the modeled algorithms for the card's time."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta,
                 allreduce_algorithm: str = "ring") -> None:
        super().__init__(rank, size)
        if allreduce_algorithm not in algorithms.ALLREDUCE_ALGORITHMS:
            raise ValueError(f"unknown all-reduce algorithm {allreduce_algorithm!r}; "
                             f"choose one of {algorithms.ALLREDUCE_ALGORITHMS}")
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore(BACKEND_NAME, store), rank, size, timeout)
        self.allreduce_algorithm = allreduce_algorithm
        # the modeled collectives of this group, in order (the latest HISTORY_LIMIT: an engine runs many per step)
        self.history: collections.deque[CollectiveCost] = collections.deque(maxlen=HISTORY_LIMIT)

    def getBackendName(self) -> str:
        return BACKEND_NAME

    @property
    def lane(self) -> str:
        """The trace lane of this rank's card."""
        return f"card{self.rank()}.ccl"

    # --- modeled time -------------------------------------------------------------------------
    def _charge(self, cost: CollectiveCost, card: int) -> None:
        """Enqueue the collective's modeled time on the card's current stream and wait for it (synchronous)."""
        stream = torch.spyre.current_stream(card)
        stream.enqueue(f"{cost.op} [{cost.algorithm}]", "ccl", self.lane, cost.us, host_cost_us=0.0,
                       collective=cost.op, algorithm=cost.algorithm, bytes=cost.nbytes, world_size=cost.world_size,
                       rounds=cost.rounds, link=cost.link, rank=self.rank(), modeled=True)
        stream.synchronize()
        self.history.append(cost)

    def _staged(self, tensors: list[torch.Tensor], run: Callable[[list[torch.Tensor]], dist.Work],
                fill: bool = True) -> None:
        """Run ``run`` on wire copies of spyre ``tensors`` and write the results back."""
        wires = [to_wire(t) if fill else empty_wire(t) for t in tensors]
        run(wires).wait()
        for t, w in zip(tensors, wires, strict=True):
            from_wire(t, w)

    # --- supported ----------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: object = None) -> dist.Work:
        opts = opts or dist.AllreduceOptions()
        card = _card_of(tensors)
        if card is None:
            return self._gloo.allreduce(tensors, opts)
        self._staged(tensors, lambda w: self._gloo.allreduce(w, opts))
        cost = algorithms.allreduce_cost(sum(map(card_bytes, tensors)), self.size(), self.allreduce_algorithm)
        self._charge(cost, card)
        return _done(tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: object = None) -> dist.Work:
        opts = opts or dist.BroadcastOptions()
        card = _card_of(tensors)
        if card is None:
            return self._gloo.broadcast(tensors, opts)
        self._staged(tensors, lambda w: self._gloo.broadcast(w, opts), fill=self.rank() == opts.rootRank)
        self._charge(algorithms.broadcast_cost(sum(map(card_bytes, tensors)), self.size()), card)
        return _done(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: object = None) -> dist.Work:
        opts = opts or dist.ReduceOptions()
        card = _card_of(tensors)
        if card is None:
            return self._gloo.reduce(tensors, opts)
        self._staged(tensors, lambda w: self._gloo.reduce(w, opts))
        self._charge(algorithms.reduce_cost(sum(map(card_bytes, tensors)), self.size()), card)
        return _done(tensors)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: object = None) -> dist.Work:
        opts = opts or AllgatherOptions()
        card = _card_of([outputs, inputs])
        if card is None:
            return self._gloo.allgather(outputs, inputs, opts)
        wire_out = [[empty_wire(t) for t in row] for row in outputs]
        self._gloo.allgather(wire_out, [to_wire(t) for t in inputs], opts).wait()
        for row, wires in zip(outputs, wire_out, strict=True):
            for t, w in zip(row, wires, strict=True):
                from_wire(t, w)
        self._charge(algorithms.allgather_cost(sum(map(card_bytes, inputs)), self.size()), card)
        return _done(outputs)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: object = None) -> dist.Work:
        opts = opts or dist.GatherOptions()
        card = _card_of([outputs, inputs])
        if card is None:
            return self._gloo.gather(outputs, inputs, opts)
        wire_out = [[empty_wire(t) for t in row] for row in outputs]
        self._gloo.gather(wire_out, [to_wire(t) for t in inputs], opts).wait()
        for row, wires in zip(outputs, wire_out, strict=True):
            for t, w in zip(row, wires, strict=True):
                from_wire(t, w)
        self._charge(algorithms.gather_cost(sum(map(card_bytes, inputs)), self.size()), card)
        return _done(outputs)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        card = _card_of(tensors)
        if card is None:
            return self._gloo.send(tensors, dst, tag)
        self._gloo.send([to_wire(t) for t in tensors], dst, tag).wait()
        self._charge(algorithms.send_cost(sum(map(card_bytes, tensors))), card)
        return _done(tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work:
        card = _card_of(tensors)
        if card is None:
            return self._gloo.recv(tensors, src, tag)
        self._staged(tensors, lambda w: self._gloo.recv(w, src, tag), fill=False)
        cost = algorithms.send_cost(sum(map(card_bytes, tensors)))
        self._charge(CollectiveCost("recv", cost.algorithm, 2, cost.nbytes, 1, cost.round_bytes, cost.us, cost.link),
                     card)
        return _done(tensors)

    def barrier(self, opts: object = None) -> dist.Work:
        self._gloo.barrier(opts or dist.BarrierOptions()).wait()
        self._charge(algorithms.barrier_cost(self.size()), torch.spyre.current_device())
        return _done(None)


def _refusing(spec: Unsupported) -> Callable[..., dist.Work]:
    """The ``ProcessGroup`` method for ``spec``: refuse spyre tensors, hand CPU tensors to gloo."""

    def method(self: SpyreCCLProcessGroup, *args: object, opts: object = None) -> dist.Work:
        if _card_of(list(args[:spec.tensor_args])) is not None:
            raise _unsupported(spec.refused_as)
        if len(args) > spec.arity:
            args, opts = args[:spec.arity], args[spec.arity]
        return getattr(self._gloo, spec.gloo)(*args, opts or spec.options())

    method.__name__ = method.__qualname__ = spec.method
    method.__doc__ = f"Refused on spyre tensors (workaround: {spec.workaround}); CPU tensors go to gloo."
    return method


for _spec in UNSUPPORTED:   # not supported on spyre (as in torch-spyre)
    setattr(SpyreCCLProcessGroup, _spec.method, _refusing(_spec))


def _create(backend_opts: object, pg_options: object = None) -> SpyreCCLProcessGroup:
    algorithm = getattr(pg_options, "allreduce_algorithm", "ring")
    return SpyreCCLProcessGroup(backend_opts.store, backend_opts.group_rank, backend_opts.group_size,
                                backend_opts.timeout, allreduce_algorithm=algorithm)


def register() -> None:
    """Make ``spyreccl`` a c10d backend for spyre tensors (idempotent; importing the package does it)."""
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["spyre"])
