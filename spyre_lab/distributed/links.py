"""The links a collective crosses: PCIe to the host (the card's own config) and card to card (an estimate).

Why a module of its own: no card-to-card bandwidth is published for Spyre, so every number a collective
charges rests on :data:`CARD_LINK`, an *estimate* read from ``SpyreConfig`` (``card_link_bandwidth``,
``card_link_latency_us``, next to ``pcie_bandwidth`` and ``pcie_latency_us``) with one switch
(:func:`set_card_link`) to change it for this process.
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

    Spyre cards sit on PCIe Gen5 x16 and no peer link is published, so the estimate is a peer-to-peer DMA through
    a PCIe switch: one crossing per byte at 80 % of the modeled host link's 50 GB/s (switch and peer-write
    overheads), and per message one doorbell plus a DMA descriptor on each side. It must stay faster than the
    route through host memory (:func:`host_staged_link`: two PCIe crossings, 25 GB/s and 4 us per message).
    """

    bandwidth: float = SPYRE.card_link_bandwidth  # estimate: not published (see SpyreConfig)
    latency_us: float = SPYRE.card_link_latency_us  # estimate: not published (see SpyreConfig)

    @classmethod
    def of(cls, config: SpyreConfig) -> CardLinkEstimate:
        """The estimate a device config carries."""
        return cls(config.card_link_bandwidth, config.card_link_latency_us)

    def link(self) -> Link:
        return Link("card-to-card", self.bandwidth, self.latency_us, estimate=True)


CARD_LINK = CardLinkEstimate.of(SPYRE)
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


def host_staged_link(config: SpyreConfig = SPYRE) -> Link:
    """A card-to-card message staged through host memory: a D2H then an H2D on the modeled PCIe link.

    Store and forward: both hops' latencies add, and each byte crosses PCIe twice (half the bandwidth).
    The route a card pair takes with no peer-to-peer path; pass it as ``link=`` to any cost in ``algorithms``.
    """
    pcie = pcie_link(config)
    return Link("host-staged (2x PCIe)", pcie.bandwidth / 2, 2 * pcie.latency_us, estimate=True)
