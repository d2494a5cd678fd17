"""The host path of a step: what the model runner hands the model, and what a paged-attention launch writes.

* The runner packs a step's integer inputs into one host buffer and copies it once into a device buffer kept
  per input layout; the model reads views of it. Every field must hold exactly what a field-by-field build
  (one tensor and one copy each, as the runner used to make them) holds.
* A paged-attention launch writes only this step's K/V slots of its layer's cache (``DeviceBuffer.write_rows``);
  the cache and the output must be bit for bit what the whole-cache path (clone, ``index_copy_``, attend,
  write back) gives.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from warning_checks import SPYRE_ENGINE_WARNINGS, only_warnings

from spyre_lab.compiler.options import CompileOptions
from spyre_lab.compiler.paged_attention_numerics import paged_online_attention
from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.layers.attention import causal_bias
from spyre_lab.engine.platforms import paged_kernel
from spyre_lab.engine.platforms.paged_attention_op import KernelAttention, is_paged_attention
from spyre_lab.engine.platforms.spyre import SpyrePlatform
from spyre_lab.engine.sequence import Sequence
from spyre_lab.runtime.tensor import SpyreRangeError, buffer_of, host_view
from spyre_lab.runtime.timeline import recording

BLOCK = 4


def spyre_llm(**platform_options) -> LLM:
    with only_warnings(*SPYRE_ENGINE_WARNINGS):
        return LLM("tiny-granite", platform=SpyrePlatform(prefill_buckets=[24], batch_buckets=[4], **platform_options),
                   max_model_len=24, max_num_seqs=4, block_size=BLOCK, num_kv_blocks=16)


@pytest.fixture(scope="module")
def kernel_on() -> LLM:
    return spyre_llm()


@pytest.fixture(scope="module")
def kernel_off() -> LLM:
    return spyre_llm(compile_options=CompileOptions().without("attention"))


@pytest.fixture(scope="module")
def cpu() -> LLM:
    return LLM("tiny-granite", max_model_len=24, max_num_seqs=4, block_size=BLOCK, num_kv_blocks=16)


def _seqs(decode: bool) -> list[Sequence]:
    """Three sequences with hand-made block tables: 9, 5 and 2 tokens, all computed but the last (decode), or
    a prefill of the first one after 4 cached tokens."""
    seqs = []
    for i, (n, table) in enumerate(((9, [3, 7, 1]), (5, [5, 2]), (2, [6]))):
        seq = Sequence(f"r{i}", list(range(1, n + 1)), SamplingParams())
        seq.block_table = list(table)
        seq.num_computed_tokens = n - 1 if decode else 4
        seqs.append(seq)
    return seqs if decode else seqs[:1]


def _reference(runner, seqs: list[Sequence], decode: bool) -> dict[str, torch.Tensor]:
    """Every input field built on its own, the way the runner built them before it packed them."""
    static, bs = runner.platform.static_shapes, runner.block_size

    def slot(seq, p):
        return seq.block_table[p // bs] * bs + p % bs

    scratch = runner.scratch_block
    if decode:
        batch = runner.platform.batch_buckets[0] if static else len(seqs)
        width = runner.max_blocks_per_seq if static else max(len(s.block_table) for s in seqs)
        pad = batch - len(seqs)
        ids = [s.last_token_id for s in seqs] + [0] * pad
        positions = [len(s) - 1 for s in seqs] + [0] * pad
        slots = [slot(s, len(s) - 1) for s in seqs] + [scratch * bs] * pad
        tables = [s.block_table + [scratch] * (width - len(s.block_table)) for s in seqs] + [[scratch] * width] * pad
        query_index = torch.arange(batch).unsqueeze(1)
        query_positions = torch.tensor(positions).unsqueeze(1)
        out_index = torch.arange(batch)
        ends = torch.arange(len(seqs))
        lens = [(len(s), 1) for s in seqs] + [(0, 0)] * pad
    else:
        (seq,) = seqs
        first, qlen = seq.num_computed_tokens, len(seq) - seq.num_computed_tokens
        tokens = runner.platform.prefill_buckets[0] if static else qlen
        width = runner.max_blocks_per_seq if static else len(seq.block_table)
        pad = tokens - qlen
        ids = seq.token_ids[first:] + [0] * pad
        positions = list(range(first, len(seq))) + [0] * pad
        slots = [slot(seq, p) for p in range(first, len(seq))] + [scratch * bs] * pad
        tables = [seq.block_table + [scratch] * (width - len(seq.block_table))]
        query_index = torch.zeros(1, tokens, dtype=torch.long)
        query_index[0, :qlen] = torch.arange(qlen)
        query_positions = torch.zeros(1, tokens, dtype=torch.long)
        query_positions[0, :qlen] = torch.arange(first, len(seq))
        out_index = torch.tensor(list(range(qlen)) + [0] * pad)
        ends = torch.tensor([qlen - 1])
        lens = [(len(seq), qlen)]
    ref = {"input_ids": torch.tensor(ids), "positions": torch.tensor(positions), "slot_mapping": torch.tensor(slots),
           "block_tables": torch.tensor(tables), "query_index": query_index, "out_index": out_index,
           "logits_indices": ends, "seq_query_lens": torch.tensor(lens)}
    ref["attn_bias"] = causal_bias(query_positions, width * bs, runner.dtype)
    if decode and runner.platform.decode_key_mask:              # the key mask: True where the bias is 0
        ref["key_mask"] = ref["attn_bias"] == 0                 # and the bias itself, made once from it
    return ref


def _fields(model_input) -> dict[str, torch.Tensor | None]:
    meta = model_input.meta
    return {"input_ids": model_input.input_ids, "positions": model_input.positions,
            "slot_mapping": meta.slot_mapping, "block_tables": meta.block_tables, "query_index": meta.query_index,
            "out_index": meta.out_index, "logits_indices": model_input.logits_indices,
            "seq_query_lens": meta.seq_query_lens, "attn_bias": meta.attn_bias, "key_mask": meta.key_mask}


@pytest.mark.parametrize("platform", ["cpu", "kernel_on", "kernel_off"])
@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
def test_the_model_sees_what_a_field_by_field_build_gives(platform, decode, request):
    runner = request.getfixturevalue(platform).llm_engine.runner
    seqs = _seqs(decode)
    model_input = runner.prepare_decode(seqs) if decode else runner.prepare_prefill(seqs)
    reference = _reference(runner, seqs, decode)
    for name, value in _fields(model_input).items():
        if value is None:       # only what the platform's attention reads is built
            assert ((name == "seq_query_lens" and not runner.platform.needs_seq_query_lens)
                    or (name == "attn_bias" and not runner.platform.needs_attn_bias)
                    or (name == "attn_bias" and not decode and model_input.meta.prefill_spans is not None)
                    or (name == "key_mask" and not (decode and runner.platform.decode_key_mask))), name
            continue
        assert value.device.type == runner.device.type, name
        expected = reference[name]
        assert value.dtype == expected.dtype and torch.equal(value.cpu(), expected), name
    assert runner.platform.needs_attn_bias != (platform == "kernel_on")


@pytest.mark.parametrize("platform, transfers", [("kernel_on", 1), ("kernel_off", 2)])
def test_a_step_copies_its_inputs_in_one_transfer(platform, transfers, request):
    """One H2D copy of the packed integers (and one of the mask when the attention reads it); no other launch."""
    runner = request.getfixturevalue(platform).llm_engine.runner
    runner.prepare_decode(_seqs(decode=True))                  # the layout's device buffer made
    with recording() as trace:
        runner.prepare_decode(_seqs(decode=True))
    copies = [e for e in trace.events if e.lane == "pcie"]
    assert [e.args["kind"] for e in copies] == ["H2D"] * transfers
    assert not [e for e in trace.events if e.args.get("kind") == "Compute"]


def test_a_layout_reuses_its_device_buffer(kernel_on):
    """Steps with the same input layout (bucket and number of real sequences) copy into one device buffer
    and hand the model the same views; another layout has its own."""
    runner = kernel_on.llm_engine.runner
    full = runner.prepare_decode([*_seqs(decode=True), _seqs(decode=True)[0]])
    fewer = runner.prepare_decode(_seqs(decode=True)[:2])
    assert fewer.logits_indices.shape == (2,) and full.logits_indices.shape == (4,)
    again = runner.prepare_decode(_seqs(decode=True)[1:3])
    assert again.input_ids is fewer.input_ids and again.meta.block_tables is fewer.meta.block_tables
    assert torch.equal(again.input_ids.cpu(), torch.tensor([5, 2, 0, 0]))        # the new step's values
    assert fewer.input_ids.untyped_storage().data_ptr() != full.input_ids.untyped_storage().data_ptr()


def test_attention_between_pieces_calls_the_ops_function(kernel_on):
    """Between the compiled pieces, the split graph calls each layer's attention function itself (no submodule,
    no custom-op dispatch); the calls are still recognised as attention."""
    with only_warnings(*SPYRE_ENGINE_WARNINGS):
        kernel_on.warmup(show_progress=False)
    graph = kernel_on.llm_engine.platform.split_graphs["decode", 4]
    calls = [n for n in graph.graph.nodes if is_paged_attention(n)]
    assert len(calls) == 4 and all(n.op == "call_function" and callable(n.target) for n in calls)
    assert not [n for n in calls if isinstance(n.target, torch._ops.OpOverloadPacket | torch._ops.OpOverload)]
    children = list(graph.children())
    assert len(children) == 5 and all(type(c).__name__ == "CompiledPiece" for c in children)


# ---- the paged-attention launch's KV write ----------------------------------------------------------------

def _launch_case(seed: int):
    """A cache with content everywhere, a decode of two sequences (10 and 5 keys) and one prefill token."""
    g = torch.Generator().manual_seed(seed)
    bs, kv, group, d, blocks = 4, 2, 2, 32, 12
    k_cache = torch.randn(blocks + 1, bs, kv, d, generator=g).half()
    v_cache = torch.randn(blocks + 1, bs, kv, d, generator=g).half()
    tables = torch.tensor([[3, 7, 1], [5, 2, blocks]])
    lens = torch.tensor([[10, 1], [5, 1]])
    query_index = torch.tensor([[0], [1]])
    slots = torch.tensor([1 * bs + 1, 2 * bs + 0])                 # position 9 of seq 0, position 4 of seq 1
    query = torch.randn(2, kv * group * d, generator=g).half()
    key = torch.randn(2, kv * d, generator=g).half()
    value = torch.randn(2, kv * d, generator=g).half()
    return query, key, value, k_cache, v_cache, slots, tables, query_index, lens, (kv * group, kv, d, 1 / math.sqrt(d))


def _whole_cache_path(query, key, value, k_cache, v_cache, slots, tables, query_index, lens, sizes, current):
    """What the launch computed before it wrote rows: clone each cache, index_copy_ the step's K/V, attend."""
    _heads, kv, d, scale = sizes
    k, v = k_cache.clone(), v_cache.clone()
    k.view(-1, kv, d).index_copy_(0, slots, key.reshape(-1, kv, d))
    v.view(-1, kv, d).index_copy_(0, slots, value.reshape(-1, kv, d))
    out = paged_online_attention(query, k, v, tables, query_index, lens[:, 0], lens[:, 1], kv, scale,
                                 current.chunks, tile_blocks=current.plan.tile_blocks)
    return k, v, out


@pytest.mark.parametrize("seed", [0, 1])
def test_a_launch_writes_only_its_slots_and_matches_the_whole_cache_path(seed):
    case = _launch_case(seed)
    query, key, value, k_cache, v_cache, slots, tables, query_index, lens, sizes = case
    heads, kv, d, scale = sizes
    dev = [t.to("spyre") for t in (query, key, value, k_cache, v_cache, slots, tables, query_index, lens)]
    before = host_view(dev[3])                 # a view of the K cache's host mirror, taken before the launch
    launch = paged_kernel.layer_launch(7, heads, kv, d, scale)
    out = launch(*dev)
    k_ref, v_ref, out_ref = _whole_cache_path(*case[:-1], sizes, launch.spec)
    assert torch.equal(dev[3].cpu(), k_ref) and torch.equal(dev[4].cpu(), v_ref)
    assert torch.equal(out.cpu(), out_ref)
    changed = (dev[3].cpu() != k_cache).flatten(2).any(-1).flatten()      # per cache slot
    assert set(changed.nonzero().flatten().tolist()) <= set(slots.tolist())
    assert torch.equal(before, k_cache)       # a mirror someone may hold is never changed in place


def test_row_writes_keep_updating_the_buffers_own_mirror():
    """The first row write copies the (possibly shared) mirror once; later ones write into that copy, so a
    decode step costs its rows, not the cache; the stickified contents follow every write."""
    cache = torch.zeros(6, 4, 2, 8, dtype=torch.float16).to("spyre")
    buffer = buffer_of(cache)
    window = ((24, 2, 8), (16, 8, 1), 0)
    rows = torch.ones(1, 2, 8, dtype=torch.float16)
    buffer.write_rows(*window, torch.tensor([5]), rows)
    mirror = buffer.host_flat()
    buffer.write_rows(*window, torch.tensor([6]), 2 * rows)
    assert buffer.host_flat() is mirror
    expected = torch.zeros(24, 2, 8, dtype=torch.float16)
    expected[5], expected[6] = 1, 2
    assert torch.equal(cache.cpu().view(24, 2, 8), expected)
    from spyre_lab.device.layout import unstickify
    assert torch.equal(unstickify(buffer.data, buffer.layout).reshape(24, 2, 8), expected)
    fresh = buffer_of(torch.zeros(6, 4, 2, 8, dtype=torch.float16).to("spyre"))
    with torch.inference_mode():                 # an engine step writes rows in inference mode, a user may not
        fresh.write_rows(*window, torch.tensor([7]), 3 * rows)
    fresh.write_rows(*window, torch.tensor([8]), 4 * rows)
    assert torch.equal(fresh.host_flat().view(24, 2, 8)[6:9, 0, 0], torch.tensor([0.0, 3, 4], dtype=torch.float16))


def test_row_writes_narrow_and_check_like_any_write():
    with only_warnings(*SPYRE_ENGINE_WARNINGS):
        wide = torch.zeros(4, 3).to("spyre")                      # float32 on the host, stored as fp16
    buffer_of(wide).write_rows((4, 3), (3, 1), 0, torch.tensor([2]), torch.full((1, 3), 1 / 3))
    assert torch.equal(wide.cpu()[2], torch.full((3,), 1 / 3).half().float())
    with pytest.raises(SpyreRangeError, match="do not fit float16"):
        buffer_of(wide).write_rows((4, 3), (3, 1), 0, torch.tensor([0]), torch.full((1, 3), 1e6))
    ints = torch.zeros(4, dtype=torch.long).to("spyre")
    with pytest.raises(ValueError, match="int32"):
        buffer_of(ints).write_rows((4,), (1,), 0, torch.tensor([1]), torch.tensor([2**40]))


def test_served_tokens_equal_the_cpu_platforms(kernel_on, cpu):
    prompts = ["count from 5 to 12:", "3 + 4 ="]
    greedy = SamplingParams(temperature=0, max_tokens=12)
    cpu16 = LLM("tiny-granite", dtype=torch.float16, max_model_len=24, block_size=BLOCK, num_kv_blocks=16)
    with only_warnings(*SPYRE_ENGINE_WARNINGS):
        ours = [o.outputs[0].token_ids for o in kernel_on.generate(prompts, greedy, use_tqdm=False)]
    assert ours == [o.outputs[0].token_ids for o in cpu16.generate(prompts, greedy, use_tqdm=False)]
    assert KernelAttention in {type(m) for m in kernel_on.llm_engine.model.modules()}


# ---- the kernel's numerics, with the exactly known terms of the first tile left out ---------------------------

def _every_tile_updated(query, k_cache, v_cache, tables, query_index, seq_lens, query_lens, kv, scale, chunks,
                        tile_blocks):
    """`paged_online_attention` as first written: each chunk starts from (max -inf, sum 0, accumulator 0) and every
    tile goes through the full online update; keys past a query or past the context are masked separately."""
    from spyre_lab.compiler.paged_attention_numerics import _online_step, context_blocks, merge_partials

    tokens_all, bs, d = query.shape[0], k_cache.shape[1], k_cache.shape[3]
    heads = query.shape[-1] // d
    group = heads // kv
    out = torch.zeros(tokens_all, heads * d, dtype=query.dtype)
    q_all = query.reshape(tokens_all, kv, group, d)
    for b in range(tables.shape[0]):
        seq_len, qlen = int(seq_lens[b]), int(query_lens[b])
        if qlen <= 0 or seq_len <= 0:
            continue
        tokens = query_index[b, :qlen]
        q = q_all[tokens].permute(1, 0, 2, 3).reshape(kv, qlen * group, d).float()
        q_pos = (seq_len - qlen + torch.arange(qlen)).repeat_interleave(group).view(1, -1, 1)
        nblocks = context_blocks(seq_len, bs)
        bounds = [0, *[c for c in (chunks[b] if chunks else ()) if 0 < c < nblocks], nblocks]
        parts = []
        for j0, j1 in itertools.pairwise(bounds):
            m, l_sum, acc = torch.full((kv, qlen * group, 1), -math.inf), torch.zeros(kv, qlen * group, 1), \
                torch.zeros(kv, qlen * group, d)
            for t0 in range(j0, j1, tile_blocks):
                blocks = tables[b, t0:min(j1, t0 + tile_blocks)]
                k = k_cache[blocks].flatten(0, 1).transpose(0, 1).float()
                v = v_cache[blocks].flatten(0, 1).transpose(0, 1)
                k_pos = (t0 * bs + torch.arange(k.shape[1])).view(1, 1, -1)
                s = torch.matmul(q, k.transpose(1, 2)) * scale
                s = s.masked_fill((k_pos > q_pos) | (k_pos >= seq_len), -math.inf)
                m, l_sum, acc = _online_step(m, l_sum, acc, s, v)
            parts.append((m, l_sum, acc))
        m, l_sum, acc = parts[-1]
        for part in reversed(parts[:-1]):
            m, l_sum, acc = merge_partials(part, (m, l_sum, acc))
        o = torch.where(l_sum == 0, 0.0, acc / torch.where(l_sum == 0, 1.0, l_sum))
        out[tokens] = o.view(kv, qlen, group, d).permute(1, 0, 2, 3).reshape(qlen, heads * d).to(out.dtype)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_kernel_numerics_equal_the_every_tile_update_bit_for_bit(seed):
    """Same bits (signed zeros included) as the plain online update, with split-KV chunks, multi-block tiles,
    sequences without queries, and values with signed zeros."""
    g = torch.Generator().manual_seed(seed)
    bs, kv, group, d, blocks, width = (1, 2, 4, 16)[seed % 4], 1 + seed % 2, 2, 16, 12, 5
    k_cache = torch.randn(blocks + 1, bs, kv, d, generator=g).half()
    v_cache = torch.randn(blocks + 1, bs, kv, d, generator=g).half()
    v_cache[v_cache.abs() < 0.4] = -0.0
    seqs = [(width * bs, 3), (bs + 1, 1), (0, 0), (2 * bs, 2), (3 * bs, 1)]      # the last: no key to mask
    tables = torch.randint(0, blocks, (len(seqs), width), generator=g)
    rows, flat = [], 0
    for _, q in seqs:
        rows.append(list(range(flat, flat + q)) + [0] * (3 - q))
        flat += q
    query = (4 * torch.randn(flat, kv * group * d, generator=g)).half()
    lens = torch.tensor(seqs)
    for chunks, tile_blocks in ((None, 1), ([[2], [1], [], [1], [2]], 2), ([[1, 3], [], [], [], []], 8)):
        args = (query, k_cache, v_cache, tables, torch.tensor(rows), lens[:, 0], lens[:, 1], kv, 0.3, chunks)
        ours = paged_online_attention(*args, tile_blocks=tile_blocks)
        assert torch.equal(ours.view(torch.int16), _every_tile_updated(*args, tile_blocks).view(torch.int16))


# ---- step records -----------------------------------------------------------------------------------------

def test_step_records_keep_the_device_lanes_and_only_the_latest_traces(kernel_on):
    """A step record's trace is the step's events without the per-core lanes (picked out when first read), and
    only the most recent ``max_device_traces`` steps keep theirs."""
    from types import SimpleNamespace

    from spyre_lab.engine.stats import EngineStats

    engine = kernel_on.llm_engine
    saved, engine.stats = engine.stats, EngineStats(max_device_traces=3)
    try:
        with only_warnings(*SPYRE_ENGINE_WARNINGS):
            kernel_on.generate(["3 + 4 ="], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                               use_tqdm=False)
        details = engine.stats.details
        assert [n for n, d in details.items() if d.device_trace is not None] == sorted(details)[-3:]
        last = details[max(details)].device_trace
        assert len(last) and not [e for e in last if e.lane.startswith("core")]
        assert {e.lane for e in last} >= {"host", "pcie"}
    finally:
        engine.stats = saved
    x = torch.ones(64, 64, dtype=torch.float16).to("spyre")
    with recording() as trace:
        (x @ x).cpu()
    stats = EngineStats()
    detail = stats.record_detail(0, 0.0, [], [], SimpleNamespace(device_trace=trace), None, False)
    assert [e for e in trace if e.lane.startswith("core")]
    assert detail.device_trace.events == trace.kept(lambda lane: not lane.startswith("core")).events
    assert detail.device_trace.duration_us == trace.kept(lambda lane: not lane.startswith("core")).duration_us
