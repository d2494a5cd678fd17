"""Paged KV-cache bookkeeping: fixed-size blocks, a free list, and prefix caching.

The KV tensors themselves live in the attention layers (see layers/attention.py); this module
decides which block ids a sequence owns. A block that is *full and computed* gets a hash that
chains over every token before it: hash(previous block's hash, this block's tokens). A new
request whose prompt starts with the same tokens finds those hashes and reuses the blocks
instead of recomputing them.

Freed blocks keep their contents and hash, and go to the back of the free list; new allocations
take from the front. So the free list doubles as an LRU: the blocks evicted first are those freed
longest ago, and a popular prefix survives as long as possible.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from spyre_lab.engine.sequence import Sequence


def chain_hash(previous: int | None, tokens: tuple[int, ...]) -> int:
    """Hash of a full block given the hash of the block before it (deterministic across runs)."""
    return hash((previous, tokens))


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached_blocks: dict[int, int] = {}  # hash -> block id
        self.prefix_cache_hits = 0  # blocks reused, counted over the manager's lifetime

    # ---- queries ------------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _prefix_hits(self, seq: Sequence) -> list[tuple[int, int]]:
        """(hash, block id) of the cached blocks that match the start of `seq`.

        Only blocks entirely before the last token count: the last token must be computed to
        produce the next token's logits.
        """
        if not self.enable_prefix_caching:
            return []
        hits, previous, tokens = [], None, seq.token_ids
        for start in range(0, len(seq) - 1 - self.block_size + 1, self.block_size):
            block_tokens = tuple(tokens[start : start + self.block_size])
            digest = chain_hash(previous, block_tokens)
            block_id = self.cached_blocks.get(digest)
            if block_id is None or self.blocks[block_id].token_ids != block_tokens:
                break
            hits.append((digest, block_id))
            previous = digest
        return hits

    # ---- prefill ----------------------------------------------------------------------------
    def can_allocate(self, seq: Sequence) -> bool:
        hits = self._prefix_hits(seq)
        reused_in_use = sum(1 for _, block_id in hits if self.blocks[block_id].ref_count > 0)
        return self.blocks_for(len(seq)) - reused_in_use <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> None:
        """Give `seq` blocks for all its tokens, reusing cached prefix blocks; sets its computed count."""
        if seq.block_table:
            raise RuntimeError(f"request {seq.request_id} already holds blocks")
        hits = self._prefix_hits(seq)
        for digest, block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_block_ids[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            seq.block_hashes.append(digest)
        self.prefix_cache_hits += len(hits)
        while len(seq.block_table) < self.blocks_for(len(seq)):
            seq.block_table.append(self._take_free_block())
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size

    # ---- decode -----------------------------------------------------------------------------
    def can_append(self, seq: Sequence) -> bool:
        """Is there room for the K/V of `seq`'s last token (the one the next decode step feeds)?"""
        return len(seq.block_table) >= self.blocks_for(len(seq)) or self.num_free_blocks > 0

    def append_slot(self, seq: Sequence) -> None:
        if len(seq.block_table) < self.blocks_for(len(seq)):
            seq.block_table.append(self._take_free_block())

    def commit(self, seq: Sequence) -> None:
        """Hash the blocks `seq` has filled and computed since the last call, so others can reuse them."""
        tokens = None                   # the token list is built only when a block filled (most calls: none)
        while len(seq.block_hashes) < seq.num_computed_tokens // self.block_size:
            tokens = seq.token_ids if tokens is None else tokens
            index = len(seq.block_hashes)
            block_tokens = tuple(tokens[index * self.block_size : (index + 1) * self.block_size])
            digest = chain_hash(seq.block_hashes[-1] if seq.block_hashes else None, block_tokens)
            block = self.blocks[seq.block_table[index]]
            if self.enable_prefix_caching and block.hash is None and digest not in self.cached_blocks:
                block.hash, block.token_ids = digest, block_tokens
                self.cached_blocks[digest] = block.block_id
            seq.block_hashes.append(digest)

    # ---- release ----------------------------------------------------------------------------
    def free(self, seq: Sequence) -> None:
        """Return `seq`'s blocks; last blocks first, so a shared prefix is the last to be evicted."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
        seq.block_table.clear()
        seq.block_hashes.clear()
        seq.num_computed_tokens = 0

    def snapshot(self, seqs: list[Sequence]):
        """A KVSnapshot of every block now, with the block tables of ``seqs`` (for stats and views)."""
        from spyre_lab.engine.stats import KVSnapshot

        return KVSnapshot(
            block_size=self.block_size,
            ref_counts=[b.ref_count for b in self.blocks],
            cached=[b.hash is not None for b in self.blocks],
            tables={seq.request_id: list(seq.block_table) for seq in seqs if seq.block_table},
            cached_tokens={seq.request_id: seq.num_cached_tokens for seq in seqs if seq.block_table},
        )

    def _take_free_block(self) -> int:
        if not self.free_block_ids:
            raise RuntimeError("no free KV blocks; the scheduler should have preempted a request first")
        block_id, _ = self.free_block_ids.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:  # evict its cached contents
            del self.cached_blocks[block.hash]
            block.hash, block.token_ids = None, ()
        block.ref_count = 1
        return block_id
