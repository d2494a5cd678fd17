"""The router's approximate prefix index: which replica has probably cached which prompt prefix.

llm-d's approximate prefix-cache scorer never asks a replica what it holds. It cuts each prompt into blocks of
``hash_block_size`` characters, chains their hashes (block *i*'s hash covers every block before it; block 0's
chain is seeded with the model name, so two models never share entries) and remembers, per replica, the
hashes of the requests it routed there, in an LRU of bounded size. A new prompt's score on a replica is the
fraction of its blocks, counted from the start, found in that replica's LRU: a guess of the engine's prefix-cache
hits there. The guess goes stale when the engine evicts blocks the index still lists; the LRU's capacity is the
knob that bounds how stale.

With spyre_lab's character tokenizer one character is one token, so a block of 16 characters here lines up with
a KV block of 16 tokens in the engine (shifted by the <bos> token the engine puts first).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict


def block_hashes(text: str, model: str, block_size: int, max_blocks: int) -> list[str]:
    """Chained hashes of ``text``'s full blocks of ``block_size`` characters (at most ``max_blocks``)."""
    hashes, previous = [], hashlib.sha256(model.encode()).hexdigest()[:16]
    for start in range(0, min(len(text) // block_size, max_blocks) * block_size, block_size):
        previous = hashlib.sha256((previous + text[start:start + block_size]).encode()).hexdigest()[:16]
        hashes.append(previous)
    return hashes


class PrefixIndex:
    """Per replica, an LRU of block hashes of the prompts routed to it (thread-safe)."""

    def __init__(self, block_size: int = 16, max_blocks: int = 256, lru_capacity: int = 31_250) -> None:
        if block_size < 1 or max_blocks < 1 or lru_capacity < 1:
            raise ValueError(f"hashBlockSize, maxPrefixBlocksToMatch and lruCapacityPerServer must be >= 1, got "
                             f"{block_size}, {max_blocks}, {lru_capacity}")
        self.block_size, self.max_blocks, self.lru_capacity = block_size, max_blocks, lru_capacity
        self._lru: dict[str, OrderedDict[str, None]] = {}
        self._lock = threading.Lock()

    def hashes(self, text: str, model: str) -> list[str]:
        return block_hashes(text, model, self.block_size, self.max_blocks)

    def matched_blocks(self, replica: str, hashes: list[str]) -> int:
        """How many of ``hashes``, from the first, ``replica``'s LRU holds (a chain breaks at its first miss)."""
        with self._lock:
            lru = self._lru.get(replica, {})
            count = 0
            for digest in hashes:
                if digest not in lru:
                    break
                count += 1
            return count

    def add(self, replica: str, hashes: list[str]) -> None:
        """``replica`` was sent a prompt with these block hashes: it now (probably) caches them."""
        with self._lock:
            lru = self._lru.setdefault(replica, OrderedDict())
            for digest in hashes:
                lru[digest] = None
                lru.move_to_end(digest)
            while len(lru) > self.lru_capacity:
                lru.popitem(last=False)

    def size(self, replica: str) -> int:
        with self._lock:
            return len(self._lru.get(replica, ()))
