"""Modeled collective times: named algorithms as rounds of messages over one :class:`~.links.Link`.

Each algorithm is the sequence of rounds the cards run; every round costs the hop's latency plus its
bytes over the hop's bandwidth, and rounds do not overlap (the backend is synchronous). The names follow
spyreccl's (ReduceScatterAllGather, BiTreeBcast, GatherSumBcast):

* ``ring`` all-reduce = reduce-scatter + all-gather: ``2 (k-1)`` rounds of ``bytes / k`` each, so the time
  grows as ``2 (k-1)/k x bytes / bandwidth + 2 (k-1) x latency``: bandwidth-bound for big messages,
  latency-bound for small ones (a decode step's activations).
* ``gather_sum_bcast`` all-reduce: ``k-1`` full messages into the root (its link serialises them), a sum,
  then a tree broadcast.
* ``tree`` broadcast: a binomial tree, ``ceil(log2 k)`` rounds of the full message.
* ``gather_sum`` reduce, ``direct`` gather (``k-1`` messages into the root), ``ring`` all-gather (``k-1`` rounds
  of one rank's part), ``direct`` send/recv (one message), ``dissemination`` barrier (``ceil(log2 k)`` empty
  rounds).

The on-card sum of a reduction is not charged (a few microseconds of vector work next to the transfers).
All times are modeled microseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spyre_lab.distributed.links import Link, card_link

ALLREDUCE_ALGORITHMS = ("ring", "gather_sum_bcast")


@dataclass(frozen=True)
class CollectiveCost:
    """The modeled time of one collective and how it was made up."""

    op: str
    algorithm: str
    world_size: int
    nbytes: int  # the message one rank contributes (or receives, for broadcast)
    rounds: int
    round_bytes: float
    us: float
    link: str

    def describe(self) -> str:
        return (f"{self.op} [{self.algorithm}] {self.nbytes:,} B over {self.world_size} cards: {self.rounds} rounds x "
                f"{self.round_bytes:,.0f} B on {self.link} = {self.us:.2f} us (modeled)")


def _rounds(op: str, algorithm: str, k: int, nbytes: int, rounds: int, round_bytes: float,
            link: Link) -> CollectiveCost:
    us = rounds * link.transfer_us(round_bytes) if rounds else 0.0
    return CollectiveCost(op, algorithm, k, nbytes, rounds, round_bytes, us, link.name)


def _check(k: int, nbytes: int) -> None:
    if k < 1:
        raise ValueError(f"a collective needs a world size >= 1, got {k}")
    if nbytes < 0:
        raise ValueError(f"a collective moves >= 0 bytes, got {nbytes}")


def tree_depth(k: int) -> int:
    """Rounds of a binomial tree over ``k`` cards."""
    return math.ceil(math.log2(k)) if k > 1 else 0


def allreduce_cost(nbytes: int, k: int, algorithm: str = "ring", link: Link | None = None) -> CollectiveCost:
    """All-reduce of ``nbytes`` per card over ``k`` cards (``ring`` or ``gather_sum_bcast``)."""
    _check(k, nbytes)
    link = link or card_link()
    if algorithm == "ring":
        return _rounds("allreduce", "ring", k, nbytes, 2 * (k - 1), nbytes / k, link)
    if algorithm == "gather_sum_bcast":
        return _rounds("allreduce", "gather_sum_bcast", k, nbytes, (k - 1) + tree_depth(k), nbytes, link)
    raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; choose one of {ALLREDUCE_ALGORITHMS}")


def broadcast_cost(nbytes: int, k: int, link: Link | None = None) -> CollectiveCost:
    _check(k, nbytes)
    return _rounds("broadcast", "tree", k, nbytes, tree_depth(k), nbytes, link or card_link())


def reduce_cost(nbytes: int, k: int, link: Link | None = None) -> CollectiveCost:
    _check(k, nbytes)
    return _rounds("reduce", "gather_sum", k, nbytes, k - 1, nbytes, link or card_link())


def gather_cost(nbytes: int, k: int, link: Link | None = None) -> CollectiveCost:
    _check(k, nbytes)
    return _rounds("gather", "direct", k, nbytes, k - 1, nbytes, link or card_link())


def allgather_cost(nbytes: int, k: int, link: Link | None = None) -> CollectiveCost:
    _check(k, nbytes)
    return _rounds("allgather", "ring", k, nbytes, k - 1, nbytes, link or card_link())


def send_cost(nbytes: int, link: Link | None = None) -> CollectiveCost:
    _check(2, nbytes)
    return _rounds("send", "direct", 2, nbytes, 1, nbytes, link or card_link())


def barrier_cost(k: int, link: Link | None = None) -> CollectiveCost:
    _check(k, 0)
    return _rounds("barrier", "dissemination", k, 0, tree_depth(k), 0, link or card_link())
