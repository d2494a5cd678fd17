"""The links a collective crosses: PCIe to the host (the card's own config) and card to card (an estimate).

Why a module of its own: no card-to-card bandwidth is published for Spyre, so every number a collective
charges rests on :data:`CARD_LINK`, an *estimate* with one switch (:func:`set_card_link`) to change it.
The PCIe numbers are the ones ``SpyreConfig`` already models (``pcie_bandwidth``, ``pcie_latency_us``).
These fields belong in ``SpyreConfig`` next to the PCIe ones once that class can take them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from spyre_lab.device.config import SPYRE, SpyreConfig


@dataclass(frozen=True)
class Link:
    """One hop: ``latency_us`` to start a message, then ``bandwidth`` bytes per second."""

    name: str
    bandwidth: float
    latency_us: float
    estimate: bool = True

    def __post_init__(self) -> None:
        if self.bandwidth <= 0:
            raise ValueError(f"link {self.name!r}: bandwidth must be > 0 bytes/s, got {self.bandwidth}")
        if self.latency_us < 0:
            raise ValueError(f"link {self.name!r}: latency_us must be >= 0, got {self.latency_us}")

    def transfer_us(self, nbytes: float) -> float:
        """Modeled microseconds for one message of ``nbytes`` over this hop."""
        return self.latency_us + nbytes / self.bandwidth * 1e6

    def describe(self) -> str:
        tag = " (estimate)" if self.estimate else ""
        return f"{self.name}: {self.bandwidth / 1e9:.1f} GB/s, {self.latency_us:.1f} us per message{tag}"


@dataclass(frozen=True)
class CardLinkEstimate:
    """The card-to-card link: **estimate, not published**.

    Spyre cards sit on PCIe Gen5 x16; with no published peer link the estimate is a peer-to-peer transfer
    through the PCIe switch: half the modeled host link's bandwidth (both cards' DMA engines and the switch
    share it) and a per-message latency of a doorbell + DMA setup on each side.
    """

    bandwidth: float = 25e9  # estimate: not published (half of SpyreConfig.pcie_bandwidth's 50 GB/s)
    latency_us: float = 5.0  # estimate: not published (two PCIe round trips plus DMA descriptor setup)

    def link(self) -> Link:
        return Link("card-to-card", self.bandwidth, self.latency_us, estimate=True)


CARD_LINK = CardLinkEstimate()
"""The one switch: every collective's modeled time uses this estimate (change it with :func:`set_card_link`)."""


def set_card_link(bandwidth: float | None = None, latency_us: float | None = None) -> CardLinkEstimate:
    """Change the card-to-card estimate for this process; returns the previous one (to restore it)."""
    global CARD_LINK
    previous = CARD_LINK
    changes = {k: v for k, v in (("bandwidth", bandwidth), ("latency_us", latency_us)) if v is not None}
    candidate = dataclasses.replace(CARD_LINK, **changes)
    candidate.link()  # validates before it takes effect
    CARD_LINK = candidate
    return previous


def card_link() -> Link:
    """The card-to-card hop in force now."""
    return CARD_LINK.link()


def pcie_link(config: SpyreConfig = SPYRE) -> Link:
    """The card's host link, as the device config models it (its numbers are tagged there)."""
    return Link("pcie-host", config.pcie_bandwidth, config.pcie_latency_us, estimate=True)
