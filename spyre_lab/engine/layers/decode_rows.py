"""Decode attention over per-sequence rows kept from step to step, instead of gathering every block table anew.

The batched decode path (`attention._decode_attention`) gathers each sequence's pages through its block table into
a [B, L] rectangle of keys and values, in every layer of every step: on a mixed load that copy was a fifth of a cpu
platform decode step. Between two decode steps a sequence's keys differ by one token, so here (a platform with
``Platform.decode_rows``, dynamic shapes) each layer keeps a rectangle whose rows outlive the step: a sequence keeps
its row while it decodes, a step writes this step's key into it straight from the projection (one ``index_copy_``
for the batch) and copies from the cache only the earlier keys a row lacks (all of them when the sequence has just
joined the batch), and SDPA reads the rows where they are.

Rows are in no particular batch order (a sequence that finishes frees its row and leaves the others in place), so the
step's queries are taken into row order and the outputs back into batch order: two [B, heads * d] index_selects.
A row no sequence of the step owns attends to its first key only and its output is dropped. The paged cache stays
the source of truth: a row is refilled from it whenever its sequence was prefilled since (a new request, or one
recomputed after a preemption) or a step was prepared and not run.

Same keys, same widths and the same mask per sequence as the gathered rectangle: the same softmax
(``tests/engine/test_decode_rows.py``). The rows never hold more tokens than the paged cache does (``capacity``);
a step that would need more falls back to the gather.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class DecodeRowsStep:
    """One decode step's plan (host-built by `DecodeRows.plan`) for every layer's rows."""

    store: DecodeRows
    state: list[tuple[str, int] | None]  # rows after this step: (request id, keys held); committed when the step ran
    src_index: torch.Tensor  # [N * kv_heads] int64 the (cache slot, head) vectors a row lacks: slot * kv_heads + head
    dst_index: torch.Tensor  # [N * kv_heads] int64 where each goes: (row * kv_heads + head) * length + position
    new_index: torch.Tensor  # [B * kv_heads] int64 where batch row b's key of this step goes, head by head
    batch_of_row: torch.Tensor  # [R] int64 the batch row whose query each row takes (an idle row: 0)
    row_of_batch: torch.Tensor  # [B] int64 the row of each batch row
    bias: torch.Tensor  # [R, 1, 1, L] additive mask in row order: 0 for the keys a row's sequence covers
    width: int  # L: key positions attended (the step's widest block table, in tokens)


class DecodeRows:
    """The rows' host bookkeeping and, per layer, the row tensors [rows, kv_heads, length, head_dim] (K and V).

    Head-major, so each (row, head) is one dense [length, head_dim] matrix, as SDPA reads it fastest (the paged
    cache's token-major [slot, kv_heads, head_dim] would give it every other stretch of a cache line)."""

    def __init__(self, length: int, capacity: int, num_kv_heads: int) -> None:
        self.length, self.capacity, self.num_kv_heads = length, capacity, num_kv_heads
        self.state: list[tuple[str, int] | None] = []
        # per layer (by its index among the model's attention layers) its K and V rows: keyed by layer, not by the
        # cache tensor's id(), which a new tensor can take once the old one is freed
        self._tensors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._masks: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        self._empty: dict[torch.device, torch.Tensor] = {}

    def plan(self, seqs, slot, width: int, dtype: torch.dtype, device: torch.device) -> DecodeRowsStep | None:
        """Rows for ``seqs`` (a decode step, one new token each; ``slot(seq, position)`` its cache slot), or None when
        they would hold more tokens than ``capacity`` (the step gathers instead).

        Built on the host in plain Python lists with one ``torch.tensor`` per index and the mask read from a table
        (`_mask_rows`): a decode step runs this once, and each torch call here costs as much host time as a
        small kernel of the forward pass."""
        held = {entry[0]: (row, entry[1]) for row, entry in enumerate(self.state) if entry is not None}
        wanted = {seq.request_id for seq in seqs}
        state = [entry if entry is not None and entry[0] in wanted else None for entry in self.state]
        free = (row for row in range(len(seqs) + len(state)) if row >= len(state) or state[row] is None)
        kv_heads, length = self.num_kv_heads, self.length
        refill_slots, refill_dst, new, row_of_batch = [], [], [], []
        for seq in seqs:
            total = len(seq)
            row, keys = held.get(seq.request_id, (None, 0))
            if row is None:
                row = next(free)
            if keys != total - 1 and total > 1:    # joined, prefilled again, or a step prepared and not run: refill
                refill_slots += [slot(seq, position) for position in range(total - 1)]   # the keys the row lacks
                first_dst = row * kv_heads * length
                refill_dst += range(first_dst, first_dst + total - 1)
            first_new = row * kv_heads * length + total - 1     # this step's key, from the step's projection
            new += range(first_new, first_new + kv_heads * length, length)
            if row >= len(state):
                state += [None] * (row + 1 - len(state))
            state[row] = (seq.request_id, total)
            row_of_batch.append(row)
        while state and state[-1] is None:
            state.pop()
        rows = len(state)
        if rows * length > self.capacity:
            return None
        batch_of_row = [0] * rows
        for index, row in enumerate(row_of_batch):
            batch_of_row[row] = index
        covered = [entry[1] if entry is not None else 1 for entry in state]
        batch = len(row_of_batch)
        # every order and the mask's key counts in one tensor, split into views (each torch call here costs as much
        # host time as a small kernel of the forward pass)
        packed = host_long_tensor(batch_of_row + row_of_batch + new + covered)
        if device.type != "cpu":
            packed = packed.to(device)
        batch_of_row_t, row_of_batch_t, new_t, covered_t = packed.split((rows, batch, len(new), rows))
        # the table's first ``width`` columns, gathered: a contiguous mask (SDPA reads a strided one ~30% slower)
        bias = self._mask_rows(dtype, device)[:, :width].index_select(0, covered_t).view(rows, 1, 1, width)
        empty = self._empty.get(device)
        if empty is None:                       # read only: an index_select / index_copy_ of nothing
            empty = self._empty[device] = torch.empty(0, dtype=torch.long, device=device)
        src, dst = _refill_indices(refill_slots, refill_dst, kv_heads, length, empty)
        return DecodeRowsStep(self, state, src, dst, new_t, batch_of_row_t, row_of_batch_t, bias, width)

    def _mask_rows(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """[length + 1, length] additive masks, row ``c``: 0 over the first ``c`` keys, -inf past them; a step's
        mask is the rows of its sequences' key counts (one gather instead of building it)."""
        table = self._masks.get((dtype, device))
        if table is None:
            visible = torch.arange(self.length).view(1, -1) < torch.arange(self.length + 1).view(-1, 1)
            table = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, float("-inf")).to(device)
            self._masks[dtype, device] = table
        return table

    def commit(self, step: DecodeRowsStep) -> None:
        """The step ran: its rows now hold what it planned."""
        self.state = step.state

    def forget(self, request_ids) -> None:
        """These requests are being prefilled (their cache entries written anew): their rows no longer count."""
        gone = set(request_ids)
        self.state = [entry if entry is not None and entry[0] not in gone else None for entry in self.state]

    def tensors(self, layer: int, k_cache: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s K and V rows (at least ``rows`` of them, shaped for its ``k_cache``), made on first use;
        growing keeps what they hold."""
        made = self._tensors.get(layer)
        if made is not None and (made[0].dtype != k_cache.dtype or made[0].device != k_cache.device
                                 or made[0].shape[-1] != k_cache.shape[-1]):
            raise ValueError(f"decode rows of layer {layer} were made for another cache ({made[0].dtype}, "
                             f"{made[0].device}, head_dim {made[0].shape[-1]}); give each attention layer its own "
                             "kv_layer index")
        if made is None or made[0].shape[0] < rows:
            shape = (rows, self.num_kv_heads, self.length, k_cache.shape[-1])
            grown = tuple(torch.zeros(shape, dtype=k_cache.dtype, device=k_cache.device) for _ in range(2))
            if made is not None:
                for old, new in zip(made, grown, strict=True):
                    new[:old.shape[0]] = old
            made = self._tensors[layer] = grown
        return made


def host_long_tensor(values: list[int]) -> torch.Tensor:
    """``torch.tensor(values, dtype=torch.long)`` on the host in a third of the time: the ints packed by `array`
    (C, no per-element type checks) and the tensor made over its buffer (which it keeps alive)."""
    if not values:
        return torch.empty(0, dtype=torch.long)
    return torch.frombuffer(array("q", values), dtype=torch.long)


def _refill_indices(slots: list[int], dst: list[int], kv_heads: int, length: int,
                    empty: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (source, destination) vector indices [N * kv_heads] of the keys rows lack: each key's cache ``slots``
    entry and its place ``dst`` in head 0 of its row, expanded over the heads (``slot * kv_heads + head`` from the
    cache, ``+ head * length`` in the row) with two broadcasts, not a Python loop over keys and heads; no torch
    call at all in a step whose rows lack nothing (most decode steps: ``empty``, an empty index on the device)."""
    if not slots:
        return empty, empty
    both = torch.tensor([slots, dst], dtype=torch.long).view(2, -1, 1)
    heads = torch.arange(kv_heads).view(1, 1, -1) * torch.tensor([1, length]).view(2, 1, 1)
    src, dst_index = (both * torch.tensor([kv_heads, 1]).view(2, 1, 1) + heads).view(2, -1).to(empty.device).unbind()
    return src, dst_index


def rows_decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, step: DecodeRowsStep, num_heads: int, num_kv_heads: int,
                          head_dim: int, scale: float, layer: int = 0) -> torch.Tensor:
    """[B, heads * d]: the decode step's attention over layer ``layer``'s rows, this step's ``key`` and ``value``
    ([B, kv_heads, d], also written to the cache) written into them."""
    rows = step.batch_of_row.shape[0]
    k_rows, v_rows = step.store.tensors(layer, k_cache, rows)
    k_rows.view(-1, head_dim).index_copy_(0, step.new_index, key.reshape(-1, head_dim))
    v_rows.view(-1, head_dim).index_copy_(0, step.new_index, value.reshape(-1, head_dim))
    if step.src_index.numel():
        for cache, kept in ((k_cache, k_rows), (v_cache, v_rows)):
            vectors = cache.view(-1, head_dim).index_select(0, step.src_index)
            kept.view(-1, head_dim).index_copy_(0, step.dst_index, vectors)
    keys = k_rows[:rows, :, :step.width]                 # [R, kv, L, d], read in place
    values = v_rows[:rows, :, :step.width]
    queries = query.index_select(0, step.batch_of_row).view(rows, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=step.bias, scale=scale)
    return out.view(rows, num_heads * head_dim).index_select(0, step.row_of_batch)
