"""ModelRunner: turn scheduled sequences into model inputs, run the model, sample.

It owns the KV-cache tensors (one K and one V per attention layer, plus one scratch block) and
builds the flat token batch and its `AttentionMetadata`. On a static-shape platform it pads each
step to a bucket — prefill length for prefill, batch size for decode — and remembers which
buckets have already run (warmed up); an unseen bucket still runs, with a logged warning.

A mixed step (`prepare_mixed`, on a platform where `supports_mixed_steps`) lays its decode rows' tokens first and
the prefilled prompts' tokens after them in one flat batch: the decode rows attend as in a decode step, each prompt
over its own keys (`attention_spans`).
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from spyre_lab.engine.layers.attention import Attention, AttentionMetadata, causal_bias
from spyre_lab.engine.layers.attention_spans import prefill_spans
from spyre_lab.engine.layers.decode_rows import DecodeRows, host_long_tensor
from spyre_lab.engine.models.granite import GraniteForCausalLM
from spyre_lab.engine.platforms.base import Platform
from spyre_lab.engine.sampler import Sampler
from spyre_lab.engine.sequence import Sequence

logger = logging.getLogger(__name__)

STAGING_LAYOUTS = 64
"""Input layouts whose device staging buffer is kept (a static-shape platform uses a few; dynamic shapes, more)."""


def _ints(values) -> list[int]:
    return values.tolist() if isinstance(values, torch.Tensor) else list(values)


def _append_flat(flat: list[int], values) -> tuple[int, ...]:
    """Append ``values`` (a tensor, a list of ints, or a list of equal-length rows) to ``flat``; return its shape."""
    if isinstance(values, torch.Tensor):
        flat += values.reshape(-1).tolist()
        return tuple(values.shape)
    values = list(values)
    if values and isinstance(values[0], list | tuple):
        width = len(values[0])
        for row in values:
            if len(row) != width:
                raise ValueError(f"rows of one input field must have one length, got {width} and {len(row)}")
            flat += row
        return (len(values), width)
    flat += values
    return (len(values),)



@dataclass
class ModelInput:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [num real seqs] flat index of each sequence's last token
    bucket: tuple[str, int] | None  # ("prefill", padded length) or ("decode", padded batch) when static


@dataclass
class StepResult:
    token_ids: list[int | None]  # None for a row the sampler could not sample (its reason in ``failures``)
    start: float  # time.perf_counter() when the step began
    host_ms: float
    device_ms_modeled: float | None
    num_tokens: int
    padded_tokens: int
    bucket: tuple[str, int] | None
    on_demand: bool
    tokens_per_seq: list[int] = field(default_factory=list)  # real tokens fed per sequence, batch order
    phases_ms: dict[str, float] = field(default_factory=dict)  # measured: prepare inputs, forward, sample
    device_trace: object | None = None  # the step's modeled events, when the platform records them
    failures: dict[int, str] = field(default_factory=dict)  # batch row -> why its token could not be sampled


def supports_mixed_steps(platform: Platform) -> bool:
    """Can ``platform``'s attention run prompts and decode rows in one forward pass? It needs dynamic shapes, per-
    sequence prefill attention (``per_sequence_attention``) and a decode path that needs no dense mask
    (``decode_key_mask``), and no kernel bounding its loops by ``seq_query_lens``: the plain-torch attention of
    `layers.attention`, as the cpu platform runs it. The spyre platform, static shapes, prefills apart."""
    return (not platform.static_shapes and platform.per_sequence_attention and platform.decode_key_mask
            and not platform.needs_seq_query_lens)


def _pick_bucket(buckets: tuple[int, ...], size: int) -> int:
    index = bisect.bisect_left(buckets, size)
    if index == len(buckets):
        raise ValueError(f"size {size} exceeds the largest bucket {buckets[-1]}")
    return buckets[index]


class ModelRunner:
    def __init__(
        self,
        model: GraniteForCausalLM,
        platform: Platform,
        block_size: int,
        num_kv_blocks: int,
        max_model_len: int,
        dtype: torch.dtype,
        seed: int = 0,
    ) -> None:
        self.model, self.platform, self.dtype = model, platform, dtype
        self.block_size, self.max_model_len = block_size, max_model_len
        self.device = platform.device
        self.scratch_block = num_kv_blocks  # one extra block no sequence owns; padding writes here
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        for module in model.modules():
            if isinstance(module, Attention):   # its own KV heads: a tensor-parallel rank holds only its share
                shape = (num_kv_blocks + 1, block_size, module.num_kv_heads, module.head_dim)
                module.k_cache = torch.zeros(shape, dtype=dtype, device=self.device)
                module.v_cache = torch.zeros(shape, dtype=dtype, device=self.device)
                module.kv_layer = len(self.kv_caches)
                self.kv_caches.append((module.k_cache, module.v_cache))
        self.sampler = Sampler(seed)
        # decode rows kept across steps (`layers.decode_rows`), never holding more tokens than the paged cache
        kv_heads = {module.num_kv_heads for module in model.modules() if isinstance(module, Attention)}
        self.decode_rows = None
        if platform.decode_rows and not platform.static_shapes and len(kv_heads) == 1:
            self.decode_rows = DecodeRows(self.max_blocks_per_seq * block_size, num_kv_blocks * block_size, *kv_heads)
        self.warmed_buckets: set[tuple[str, int]] = set()
        # input layout (field shapes) -> its staging buffer on the device and the model's views of it
        self._staging: OrderedDict[tuple, tuple[torch.Tensor, dict[str, torch.Tensor]]] = OrderedDict()

    @property
    def kv_cache_bytes(self) -> int:
        return sum(k.numel() * k.element_size() * 2 for k, _ in self.kv_caches)

    # ---- input preparation --------------------------------------------------------------------
    def _slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def prepare_prefill(self, seqs: list[Sequence]) -> ModelInput:
        query_lens = [len(seq) - seq.num_computed_tokens for seq in seqs]
        num_real = sum(query_lens)
        if self.decode_rows is not None:                   # their cache entries are written anew
            self.decode_rows.forget(seq.request_id for seq in seqs)
        bucket = None
        if self.platform.static_shapes:
            bucket = ("prefill", _pick_bucket(self.platform.prefill_buckets, num_real))
        num_tokens = bucket[1] if bucket else num_real
        max_query = num_tokens if bucket else max(query_lens)
        width = self.max_blocks_per_seq if bucket else max(len(seq.block_table) for seq in seqs)

        input_ids, positions, slots, token_seq, token_offset, tables = [], [], [], [], [], []
        query_index = torch.zeros(len(seqs), max_query, dtype=torch.long)
        query_positions = torch.zeros(len(seqs), max_query, dtype=torch.long)
        for i, (seq, query_len) in enumerate(zip(seqs, query_lens)):
            start, first = len(input_ids), seq.num_computed_tokens
            input_ids += seq.token_ids[first:]
            positions += range(first, len(seq))
            slots += [self._slot(seq, p) for p in range(first, len(seq))]
            token_seq += [i] * query_len
            token_offset += range(query_len)
            query_index[i, :query_len] = torch.arange(start, start + query_len)
            query_positions[i, :query_len] = torch.arange(first, len(seq))
            tables.append(seq.block_table + [self.scratch_block] * (width - len(seq.block_table)))
        padding = num_tokens - num_real
        input_ids += [0] * padding
        positions += [0] * padding
        slots += [self.scratch_block * self.block_size] * padding
        token_seq += [0] * padding
        token_offset += [0] * padding
        ends = torch.tensor(query_lens).cumsum(0) - 1
        seq_query_lens = [(len(seq), query_len) for seq, query_len in zip(seqs, query_lens)]
        spans = None
        if self.platform.per_sequence_attention and bucket is None:
            starts = (ends - torch.tensor(query_lens) + 1).tolist()
            spans = prefill_spans(starts, query_lens, [len(seq) for seq in seqs], [seq.block_table for seq in seqs],
                                  self.block_size)
        return self._to_input(input_ids, positions, slots, tables, query_index, query_positions, token_seq,
                              token_offset, ends, bucket, seq_query_lens, spans=spans)

    def prepare_decode(self, seqs: list[Sequence]) -> ModelInput:
        bucket = None
        if self.platform.static_shapes:
            bucket = ("decode", _pick_bucket(self.platform.batch_buckets, len(seqs)))
        batch = bucket[1] if bucket else len(seqs)
        width = self.max_blocks_per_seq if bucket else max(len(seq.block_table) for seq in seqs)
        padding = batch - len(seqs)
        input_ids = [seq.last_token_id for seq in seqs] + [0] * padding
        positions = [len(seq) - 1 for seq in seqs] + [0] * padding
        slots = [self._slot(seq, len(seq) - 1) for seq in seqs] + [self.scratch_block * self.block_size] * padding
        tables = [seq.block_table + [self.scratch_block] * (width - len(seq.block_table)) for seq in seqs]
        tables += [[self.scratch_block] * width] * padding
        query_index = [[i] for i in range(batch)]                  # [batch, 1]: plain lists, packed as they are
        query_positions = [[p] for p in positions]
        token_seq, token_offset = list(range(batch)), [0] * batch
        ends = list(range(len(seqs)))
        seq_query_lens = [(len(seq), 1) for seq in seqs] + [(0, 0)] * padding   # padding rows: nothing to attend
        rows = None
        if self.decode_rows is not None and bucket is None:
            rows = self.decode_rows.plan(seqs, self._slot, width * self.block_size, self.dtype, self.device)
        return self._to_input(input_ids, positions, slots, tables, query_index, query_positions, token_seq,
                              token_offset, ends, bucket, seq_query_lens, decode_rows=rows)

    def prepare_mixed(self, decode: list[Sequence], prefill: list[Sequence]) -> ModelInput:
        """One flat batch: each of ``decode``'s last token (batch rows ``0..len(decode)-1``), then each of
        ``prefill``'s uncomputed tokens; logits for every sequence's last token, in that order."""
        if not supports_mixed_steps(self.platform):
            raise ValueError(f"platform {self.platform.name!r} cannot run mixed prefill+decode steps "
                             "(see model_runner.supports_mixed_steps); set mixed_steps=False")
        if self.decode_rows is not None:                   # the prompts' cache entries are written anew
            self.decode_rows.forget(seq.request_id for seq in prefill)
        num_decode = len(decode)
        input_ids = [seq.last_token_id for seq in decode]
        positions = [len(seq) - 1 for seq in decode]
        slots = [self._slot(seq, p) for seq, p in zip(decode, positions)]
        starts, query_lens, ends = [], [], list(range(num_decode))
        for seq in prefill:
            first, total = seq.num_computed_tokens, len(seq)
            starts.append(len(input_ids))
            query_lens.append(total - first)
            input_ids += seq.token_ids[first:]
            positions += range(first, total)
            slots += [self._slot(seq, p) for p in range(first, total)]
            ends.append(len(input_ids) - 1)
        width = max(len(seq.block_table) for seq in decode)
        tables = [seq.block_table + [self.scratch_block] * (width - len(seq.block_table)) for seq in decode]
        num_tokens = len(input_ids)
        spans = prefill_spans(starts, query_lens, [len(seq) for seq in prefill], [seq.block_table for seq in prefill],
                              self.block_size)
        rows = None
        if self.decode_rows is not None:
            rows = self.decode_rows.plan(decode, self._slot, width * self.block_size, self.dtype, self.device)
        seq_query_lens = [(len(seq), 1) for seq in decode] + [(len(s), q) for s, q in zip(prefill, query_lens)]
        return self._to_input(input_ids, positions, slots, tables, [[p] for p in positions[:num_decode]],
                              [[p] for p in positions[:num_decode]], list(range(num_tokens)), [0] * num_tokens, ends,
                              None, seq_query_lens, spans=spans, decode_rows=rows, num_decode=num_decode)

    def _to_input(self, input_ids, positions, slots, tables, query_index, query_positions, token_seq, token_offset,
                  ends, bucket, seq_query_lens, spans=None, decode_rows=None, num_decode=0) -> ModelInput:
        """The step's inputs on the device: every integer field packed into one host buffer, copied over once.

        As a real runner prepares a step: the host writes token ids, positions, slot mapping, block tables,
        query and output indices, per-sequence lengths and the logits rows into one staging buffer, and one
        H2D transfer moves it into a device buffer kept for that layout (the fields' shapes: a static-shape
        platform has a few, one per bucket and number of real sequences). The model reads views of it, made
        once per layout: a view is an offset into the same DRAM, so a step launches nothing but the transfer,
        and the tensors of a `ModelInput` hold their values until the next step with the same layout is
        prepared. The additive mask (model dtype, not an integer) is built and copied only for a platform
        whose attention reads it (``Platform.needs_attn_bias``); a decode step on a platform with
        ``decode_key_mask`` gets the boolean key mask instead (``AttentionMetadata.key_mask``, also given as
        ``attn_bias``: SDPA reads either form, so attention written against the additive mask still works). A
        prefill step with per-sequence ``spans`` (``Platform.per_sequence_attention``) needs no mask at all, nor
        does a decode step with ``decode_rows`` (``Platform.decode_rows``: the rows' plan holds its own). A mixed
        step (``num_decode`` decode rows first, then ``spans``) gets its decode rows' mask as a decode step does."""
        max_query = query_index.shape[1] if isinstance(query_index, torch.Tensor) else len(query_index[0])
        out_index = [s * max_query + o for s, o in zip(_ints(token_seq), _ints(token_offset), strict=True)]
        fields = [("input_ids", input_ids), ("positions", positions), ("slot_mapping", slots),
                  ("block_tables", tables), ("query_index", query_index), ("out_index", out_index)]
        if self.platform.needs_seq_query_lens:
            fields.append(("seq_query_lens", seq_query_lens))
        fields.append(("logits_indices", ends))             # last: its length is the number of real sequences
        flat: list[int] = []
        layout = tuple((name, _append_flat(flat, values)) for name, values in fields)
        views = self._staged(layout, host_long_tensor(flat))
        attn_bias = key_mask = None
        if max_query == 1 and self.platform.decode_key_mask and decode_rows is None:  # one query per sequence
            num_keys = len(tables[0]) * self.block_size
            key_mask = (torch.arange(num_keys).view(1, 1, 1, -1)
                        <= torch.as_tensor(query_positions).view(-1, 1, 1, 1))
            # its additive form, made once per step: SDPA given the boolean mask would make it in every layer
            attn_bias = torch.zeros(key_mask.shape, dtype=self.dtype).masked_fill_(~key_mask, float("-inf"))
            key_mask, attn_bias = key_mask.to(self.device), attn_bias.to(self.device)
        elif self.platform.needs_attn_bias and spans is None and decode_rows is None:
            attn_bias = causal_bias(torch.as_tensor(query_positions), len(tables[0]) * self.block_size,
                                    self.dtype).to(self.device)
        meta = AttentionMetadata(
            slot_mapping=views["slot_mapping"],
            block_tables=views["block_tables"],
            query_index=views["query_index"],
            attn_bias=attn_bias,
            out_index=views["out_index"],
            seq_query_lens=views.get("seq_query_lens"),
            key_mask=key_mask,
            prefill_spans=spans,
            decode_rows=decode_rows,
            num_decode_tokens=num_decode,
        )
        return ModelInput(views["input_ids"], views["positions"], meta, views["logits_indices"], bucket)

    def _staged(self, layout: tuple[tuple[str, tuple[int, ...]], ...], packed: torch.Tensor) -> dict[str, torch.Tensor]:
        """``packed`` copied into the device buffer kept for ``layout`` (made, with its views, on first use);
        the views by field name. Layouts seen least recently are dropped past `STAGING_LAYOUTS`."""
        staged = self._staging.get(layout)
        if staged is None:
            with torch.inference_mode(False):           # a normal tensor: later steps write it outside inference mode
                buffer = torch.empty(packed.shape, dtype=packed.dtype, device=self.device)
                views, offset = {}, 0
                for name, shape in layout:
                    size = math.prod(shape)
                    views[name] = buffer.narrow(0, offset, size).view(shape)
                    offset += size
            staged = self._staging[layout] = (buffer, views)
            while len(self._staging) > STAGING_LAYOUTS:
                self._staging.popitem(last=False)
        else:
            self._staging.move_to_end(layout)
        buffer, views = staged
        buffer.copy_(packed)                                # the step's one H2D transfer
        return views

    # ---- execution ------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, model_input: ModelInput) -> torch.Tensor:
        """Run the model on prepared inputs; return logits [num seqs, vocab] for each sequence's last token."""
        rows = model_input.meta.decode_rows
        if rows is not None:
            rows.store.state = []           # until the step has run, no row is known to hold anything
        hidden = self.platform.run_model(self.model, model_input.input_ids, model_input.positions, model_input.meta)
        if rows is not None:
            rows.store.commit(rows)
        return self.logits(hidden, model_input.logits_indices)

    def logits(self, hidden: torch.Tensor, logits_indices: torch.Tensor) -> torch.Tensor:
        """Each sequence's last hidden state (a device gather of rows ``logits_indices``) through the LM head."""
        return self.model.compute_logits(hidden.index_select(0, logits_indices))

    def run(self, seqs: list[Sequence], is_prefill: bool, num_decode: int | None = None) -> StepResult:
        """One step over ``seqs``: a prefill, a decode, or (``is_prefill`` and ``num_decode`` > 0) a mixed step whose
        first ``num_decode`` sequences decode one token and the rest are prefilled. ``num_decode`` defaults as
        `SchedulerOutput`'s does: every sequence of a decode step, none of a prefill step."""
        start = time.perf_counter()
        if num_decode is None or not is_prefill:
            num_decode = 0 if is_prefill else len(seqs)
        mixed = is_prefill and num_decode > 0
        tokens_per_seq = [1] * num_decode + [len(s) - s.num_computed_tokens for s in seqs[num_decode:]]
        if mixed:
            model_input = self.prepare_mixed(seqs[:num_decode], seqs[num_decode:])
        else:
            model_input = self.prepare_prefill(seqs) if is_prefill else self.prepare_decode(seqs)
        prepared = time.perf_counter()
        on_demand = model_input.bucket is not None and model_input.bucket not in self.warmed_buckets
        if on_demand:
            logger.warning(
                "%s bucket %d was not warmed up; running it on demand (on a compiling platform this step pays "
                "the compile). Call LLM.warmup() first to prepare every bucket.", *model_input.bucket
            )
            self.warmed_buckets.add(model_input.bucket)
        kind = "mixed" if mixed else "prefill" if is_prefill else "decode"
        num_fed = model_input.input_ids.numel()
        with self.platform.device_timer(kind, num_fed, len(seqs)) as device_time:
            logits = self.execute(model_input)
            forwarded = time.perf_counter()
            token_ids = self.sampler(logits, seqs)
            self.platform.synchronize()
        sampled = time.perf_counter()
        num_real = sum(tokens_per_seq)
        return StepResult(
            token_ids=token_ids,
            start=start,
            host_ms=(time.perf_counter() - start) * 1e3,
            device_ms_modeled=device_time.modeled_ms,
            num_tokens=num_real,
            padded_tokens=num_fed - num_real,
            bucket=model_input.bucket,
            on_demand=on_demand,
            tokens_per_seq=tokens_per_seq,
            phases_ms={"prepare inputs": (prepared - start) * 1e3, "forward": (forwarded - prepared) * 1e3,
                       "sample": (sampled - forwarded) * 1e3},
            device_trace=device_time.trace,
            failures=token_ids.failures,
        )

    # ---- warmup ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def warmup(self, show_progress: bool = True) -> list[tuple[tuple[str, int], float, float, float | None]]:
        """Run every prefill and decode bucket once on dummy data (written only to the scratch block).

        Returns (bucket, start perf_counter, host ms measured, device ms modeled) per bucket."""
        if not self.platform.static_shapes:
            return []
        buckets = [("prefill", b) for b in self.platform.prefill_buckets]
        buckets += [("decode", b) for b in self.platform.batch_buckets]
        timings = []
        # on a compiling platform each bucket's first run is its compile (traced, split, compiled, loaded)
        progress = tqdm(buckets, desc=f"warmup ({self.platform.dispatch_mode})", disable=not show_progress)
        for bucket in progress:
            start = time.perf_counter()
            kind, size = bucket
            progress.set_postfix_str(f"{kind} bucket {size}")
            with self.platform.device_timer(kind, size, 1 if kind == "prefill" else size) as device_time:
                self.execute(self._dummy_input(kind, size))
                self.platform.synchronize()
            self.warmed_buckets.add(bucket)
            timings.append((bucket, start, (time.perf_counter() - start) * 1e3, device_time.modeled_ms))
        return timings

    def _dummy_input(self, kind: str, size: int) -> ModelInput:
        """A full bucket of padding: every token writes the scratch block and reads only it."""
        batch, query_len = (1, size) if kind == "prefill" else (size, 1)
        flat = torch.arange(size)
        positions = flat % query_len
        return self._to_input(
            input_ids=[0] * size,
            positions=positions,
            slots=[self.scratch_block * self.block_size] * size,
            tables=[[self.scratch_block] * self.max_blocks_per_seq] * batch,
            query_index=flat.view(batch, query_len),
            query_positions=positions.view(batch, query_len),
            token_seq=flat // query_len,
            token_offset=positions,
            ends=torch.tensor([size - 1]) if kind == "prefill" else flat,
            bucket=(kind, size),
            seq_query_lens=[(query_len, query_len)] * batch,
        )
