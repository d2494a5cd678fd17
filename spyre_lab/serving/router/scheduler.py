"""llm-d's endpoint-picker pipeline: filters -> weighted scorers -> a picker, over the replicas' scraped state.

For each request: every filter drops replicas that must not serve it (``healthy-filter``: replicas whose
last scrape or proxied request failed); every scorer gives each remaining replica a score in [0, 1]; a
replica's total is the weighted sum; the picker takes the highest total, a tie broken at random
(``max-score-picker``). Then each plugin with a ``pre_request`` hook sees the choice (the prefix-cache scorer
records the prompt's blocks for that replica). The scorers are llm-d's:

* ``queue-scorer``: min-max of the waiting queue, ``(max - q) / (max - min)``; 1 for all when they are equal;
* ``kv-cache-utilization-scorer``: ``1 - kv_cache_usage``;
* ``prefix-cache-scorer``: the fraction of the prompt's blocks the replica probably caches (:mod:`.prefix_index`);
* ``load-aware-scorer``: 0.5 with an empty queue, else ``0.5 * (1 - min(q, threshold) / threshold)``.

``round-robin-picker`` is spyre_lab's baseline for the ablation: it ignores the scores and cycles.
"""

from __future__ import annotations

import itertools
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from spyre_lab.serving.router.prefix_index import PrefixIndex


@dataclass
class Replica:
    """One engine replica as the router sees it: its URL and the state its last `/metrics` scrape gave."""

    url: str
    healthy: bool = True
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    last_error: str | None = None
    scraped_at: float = 0.0

    @property
    def name(self) -> str:
        """host:port, as llm-d's destination header names an endpoint."""
        return self.url.split("://", 1)[-1].rstrip("/")


@dataclass
class RoutingRequest:
    """What the scheduler knows of a request: its model and its prompt text (chat messages rendered)."""

    model: str
    text: str
    hashes: list[str] = field(default_factory=list)


class Plugin(Protocol):
    name: str


class HealthyFilter:
    def __init__(self, name: str = "healthy-filter") -> None:
        self.name = name

    def filter(self, request: RoutingRequest, replicas: list[Replica]) -> list[Replica]:
        return [r for r in replicas if r.healthy]


class QueueScorer:
    def __init__(self, name: str = "queue-scorer") -> None:
        self.name = name

    def score(self, request: RoutingRequest, replicas: list[Replica]) -> dict[str, float]:
        low, high = min(r.waiting for r in replicas), max(r.waiting for r in replicas)
        if high == low:
            return {r.url: 1.0 for r in replicas}
        return {r.url: (high - r.waiting) / (high - low) for r in replicas}


class KVCacheUtilizationScorer:
    def __init__(self, name: str = "kv-cache-utilization-scorer") -> None:
        self.name = name

    def score(self, request: RoutingRequest, replicas: list[Replica]) -> dict[str, float]:
        return {r.url: 1.0 - min(1.0, max(0.0, r.kv_usage)) for r in replicas}


class LoadAwareScorer:
    def __init__(self, name: str = "load-aware-scorer", threshold: float = 128) -> None:
        if threshold <= 0:
            raise ValueError(f"load-aware-scorer threshold must be > 0, got {threshold}")
        self.name, self.threshold = name, float(threshold)

    def score(self, request: RoutingRequest, replicas: list[Replica]) -> dict[str, float]:
        return {r.url: 0.5 if r.waiting == 0 else 0.5 * (1 - min(r.waiting, self.threshold) / self.threshold)
                for r in replicas}


class PrefixCacheScorer:
    def __init__(self, name: str = "prefix-cache-scorer", hashBlockSize: int = 16,  # llm-d's parameter names
                 maxPrefixBlocksToMatch: int = 256, lruCapacityPerServer: int = 31_250) -> None:
        self.name = name
        self.index = PrefixIndex(hashBlockSize, maxPrefixBlocksToMatch, lruCapacityPerServer)

    def score(self, request: RoutingRequest, replicas: list[Replica]) -> dict[str, float]:
        if not request.hashes:
            request.hashes = self.index.hashes(request.text, request.model)
        total = len(request.hashes)
        return {r.url: self.index.matched_blocks(r.url, request.hashes) / total if total else 0.0 for r in replicas}

    def pre_request(self, request: RoutingRequest, chosen: Replica) -> None:
        self.index.add(chosen.url, request.hashes or self.index.hashes(request.text, request.model))


class MaxScorePicker:
    def __init__(self, name: str = "max-score-picker", seed: int | None = None) -> None:
        self.name, self._random = name, random.Random(seed)

    def pick(self, replicas: list[Replica], totals: dict[str, float]) -> Replica:
        best = max(totals[r.url] for r in replicas)
        return self._random.choice([r for r in replicas if abs(totals[r.url] - best) < 1e-12])


class RoundRobinPicker:
    def __init__(self, name: str = "round-robin-picker") -> None:
        self.name, self._turn, self._lock = name, itertools.count(), threading.Lock()

    def pick(self, replicas: list[Replica], totals: dict[str, float]) -> Replica:
        with self._lock:
            return replicas[next(self._turn) % len(replicas)]


PLUGIN_TYPES: dict[str, type] = {
    "healthy-filter": HealthyFilter,
    "queue-scorer": QueueScorer,
    "kv-cache-utilization-scorer": KVCacheUtilizationScorer,
    "prefix-cache-scorer": PrefixCacheScorer,
    "load-aware-scorer": LoadAwareScorer,
    "max-score-picker": MaxScorePicker,
    "round-robin-picker": RoundRobinPicker,
}


class NoReplicaError(RuntimeError):
    """Every replica was filtered out (all unhealthy)."""


@dataclass
class Decision:
    """Why a request went where it went: each scorer's scores, the weighted totals, the chosen replica."""

    chosen: Replica
    scores: dict[str, dict[str, float]]
    totals: dict[str, float]


class SchedulingProfile:
    """One profile of an EndpointPickerConfig: its filters, (scorer, weight) pairs and picker, run in order."""

    def __init__(self, name: str, filters: list, scorers: list[tuple[Any, float]], picker: Any) -> None:
        if picker is None:
            raise ValueError(f"scheduling profile {name!r} has no picker; add max-score-picker")
        self.name, self.filters, self.scorers, self.picker = name, filters, scorers, picker

    def schedule(self, request: RoutingRequest, replicas: list[Replica]) -> Decision:
        candidates = list(replicas)
        for plugin in self.filters:
            candidates = plugin.filter(request, candidates)
        if not candidates:
            down = ", ".join(f"{r.name} ({r.last_error or 'unhealthy'})" for r in replicas)
            raise NoReplicaError(f"no replica can serve the request: {down}")
        scores = {plugin.name: plugin.score(request, candidates) for plugin, _ in self.scorers}
        totals = {r.url: sum(weight * scores[p.name][r.url] for p, weight in self.scorers) for r in candidates}
        chosen = self.picker.pick(candidates, totals)
        for plugin, _ in self.scorers:
            hook = getattr(plugin, "pre_request", None)
            if hook is not None:
                hook(request, chosen)
        return Decision(chosen, scores, totals)
