"""The spyre platform's paged attention as one launch per layer (`paged_kernel`), and its off switch.

With the ``attention`` fusion rule on (the default), each layer's attention is one device launch named
"paged attention L<i>" that writes this step's K/V into the cache in place and attends through the block
tables; with the rule off, the eager device ops of `grouped_paged_attention` run as before.
"""

from __future__ import annotations

import math

import pytest
import torch
from warning_checks import SPYRE_ENGINE_WARNINGS, only_warnings

from spyre_lab.compiler.options import CompileOptions
from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.layers.attention import AttentionMetadata, causal_bias
from spyre_lab.engine.platforms import paged_kernel
from spyre_lab.engine.platforms.paged_attention_op import grouped_paged_attention
from spyre_lab.engine.platforms.spyre import SpyrePlatform
from spyre_lab.runtime.launch import timing_only
from spyre_lab.runtime.timeline import recording

GREEDY = SamplingParams(temperature=0, max_tokens=8)
PROMPTS = ["3 + 4 =", "count from 5 to 12:"]
LAYERS = 4                                            # tiny-granite's decoder layers


def spyre_llm(**platform_options) -> LLM:
    with only_warnings(*SPYRE_ENGINE_WARNINGS):  # CPU-fallback notices for ops the runtime has no kernel for
        # buckets no other test file uses (so the program cache's counts other tests read stay theirs); decode runs
        # with padded batch rows (bucket 3 for at most 2 sequences)
        llm = LLM("tiny-granite", platform=SpyrePlatform(prefill_buckets=[40], batch_buckets=[3], **platform_options),
                  max_model_len=40, max_num_seqs=2)
        llm.warmup(show_progress=False)
    return llm


@pytest.fixture(scope="module")
def kernel_on() -> LLM:
    return spyre_llm()


@pytest.fixture(scope="module")
def kernel_off() -> LLM:
    return spyre_llm(compile_options=CompileOptions().without("attention"))


@pytest.fixture(scope="module")
def reference() -> list[str]:
    cpu = LLM("tiny-granite", dtype=torch.float16, max_model_len=32)
    return [o.outputs[0].text for o in cpu.generate(PROMPTS, GREEDY, use_tqdm=False)]


def _generate(llm: LLM) -> list[str]:
    with only_warnings(*SPYRE_ENGINE_WARNINGS):
        return [o.outputs[0].text for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def _computes(llm: LLM, kind: str) -> list[list[str]]:
    """Per step of ``kind``, the names of the device launches its trace recorded."""
    return [[e.name for e in d.device_trace.events if e.args.get("kind") == "Compute"] for d in _details(llm, kind)]


def _details(llm: LLM, kind: str) -> list:
    details = llm.stats.details
    return [details[s.step] for s in llm.stats.steps
            if s.kind == kind and s.step in details and details[s.step].device_trace is not None]


def test_the_switch_follows_the_attention_rule():
    assert SpyrePlatform().paged_kernel
    assert not SpyrePlatform(compile_options=CompileOptions().without("attention")).paged_kernel
    assert not SpyrePlatform(compile_options={"fusion": False}).paged_kernel
    assert not SpyrePlatform(compile_blocks=False).paged_kernel


def test_greedy_tokens_equal_the_cpu_platforms_with_the_kernel_on_and_off(kernel_on, kernel_off, reference):
    assert _generate(kernel_on) == reference
    assert _generate(kernel_off) == reference


def test_one_attention_launch_per_layer_per_step(kernel_on, kernel_off):
    if not _computes(kernel_on, "decode"):
        _generate(kernel_on)
    if not _computes(kernel_off, "decode"):
        _generate(kernel_off)
    for kind in ("prefill", "decode"):
        for names in _computes(kernel_on, kind):
            attention = [n for n in names if n.startswith("paged attention")]
            assert attention == [f"paged attention L{i}" for i in range(LAYERS)]
            assert not any(n == "aten::index_copy" or "softmax" in n for n in names)   # no eager attention ops
    for names in _computes(kernel_off, "decode"):
        assert not any(n.startswith("paged attention") for n in names)
        assert sum(n == "aten::index_copy" for n in names) == 2 * LAYERS      # the old eager ops, K and V writes
        assert sum("softmax" in n for n in names) == LAYERS
    on, off = _computes(kernel_on, "decode")[-1], _computes(kernel_off, "decode")[-1]
    assert len(off) - len(on) >= 10 * LAYERS            # ~11 eager attention ops per layer became one launch


def test_the_launch_shows_its_name_and_args_in_the_step_trace(kernel_on):
    if not _computes(kernel_on, "decode"):
        _generate(kernel_on)
    step = _details(kernel_on, "decode")[-1]
    events = [e for e in step.device_trace.events if e.name == "paged attention L3" and e.args.get("kind") == "Compute"]
    assert len(events) == 1
    args = events[0].args
    assert args["blocks_read"] >= 1 and args["kv_bytes"] > 0 and args["bottleneck"] in ("memory", "compute")
    assert "simulated" in args["timing"] and events[0].dur_us > 0
    text = kernel_on.llm_engine.platform.explain_attention()
    assert all(f"paged attention L{i}:" in text for i in range(LAYERS)) and "cache blocks read" in text
    import spyre_lab

    whole = spyre_lab.explain(kernel_on.llm_engine.model)     # the compiled pieces, then the paged-attention family
    assert "Paged-attention kernels (compiler.paged_attention)" in whole
    assert all(f"paged attention L{i}:" in whole for i in range(LAYERS)) and whole.index("Program ") < whole.index(
        "Paged-attention kernels")
    from spyre_lab.viz.step_lanes import layer_of_kernels

    kernels = [e for e in step.device_trace.events if e.args.get("kind") == "Compute"]
    assert max(layer_of_kernels(kernels)) == LAYERS           # the timeline's layer lanes start at each kernel


# --- one launch against the eager ops, on the card ----------------------------------------------------------

def _case(seed: int = 0, bs: int = 4, kv: int = 2, group: int = 2, d: int = 64):
    """Two sequences (a decode over 9 cached tokens, a 3-token prefill after 2 cached) and a padded row."""
    g = torch.Generator().manual_seed(seed)
    seqs = [(10, 1), (5, 3), (1, 1)]                    # (keys covered, this step's queries); the last: padding
    blocks = 12
    tables = torch.tensor([[3, 7, 1], [5, 2, blocks], [blocks, blocks, blocks]])
    k_cache = torch.randn(blocks + 1, bs, kv, d, generator=g).half()
    v_cache = torch.randn(blocks + 1, bs, kv, d, generator=g).half()
    tokens, max_q = 5, 3
    query_index = torch.tensor([[0, 0, 0], [1, 2, 3], [4, 0, 0]])
    positions = torch.tensor([[9, 0, 0], [2, 3, 4], [0, 0, 0]])
    slots = torch.tensor([int(tables[b, p // bs]) * bs + p % bs for b, row in enumerate(positions.tolist())
                          for p in row[:seqs[b][1]]])
    out_index = torch.tensor([0 * max_q, 1 * max_q, 1 * max_q + 1, 1 * max_q + 2, 2 * max_q])
    meta = AttentionMetadata(slots, tables, query_index, causal_bias(positions, tables.shape[1] * bs, torch.float16),
                             out_index, torch.tensor(seqs))
    query = torch.randn(tokens, kv * group * d, generator=g).half()
    key = torch.randn(tokens, kv * d, generator=g).half()
    value = torch.randn(tokens, kv * d, generator=g).half()
    return query, key, value, k_cache, v_cache, meta, (kv * group, kv, d, 1 / math.sqrt(d))


def _to(meta: AttentionMetadata, device: str) -> AttentionMetadata:
    return AttentionMetadata(*(t.to(device) for t in (meta.slot_mapping, meta.block_tables, meta.query_index,
                                                       meta.attn_bias, meta.out_index, meta.seq_query_lens)))


def _kernel(query, key, value, k_cache, v_cache, meta, sizes, layer=3):
    heads, kv, d, scale = sizes
    return torch.ops.spyre_engine.paged_attention_kernel(query, key, value, k_cache, v_cache, meta.slot_mapping,
                                                         meta.block_tables, meta.query_index, meta.seq_query_lens,
                                                         heads, kv, d, scale, layer)


def test_kv_caches_after_a_launch_equal_the_eager_paths():
    query, key, value, k_cache, v_cache, meta, sizes = _case()
    dev = [t.to("spyre") for t in (query, key, value)]
    k_ours, v_ours, k_eager, v_eager = (t.to("spyre") for t in (k_cache, v_cache, k_cache, v_cache))
    smeta = _to(meta, "spyre")
    with recording() as trace:
        ours = _kernel(*dev, k_ours, v_ours, smeta, sizes)
    launches = [e for e in trace.events if e.args.get("kind") == "Compute"]
    assert [e.name for e in launches] == ["paged attention L3"]             # one launch, no write-back copies
    assert not [e for e in trace.events if e.lane.startswith("pcie") and e.args.get("bytes", 0) >= k_cache.numel()]
    eager = grouped_paged_attention(*dev, k_eager, v_eager, smeta, *sizes)
    assert torch.equal(k_ours.cpu(), k_eager.cpu()) and torch.equal(v_ours.cpu(), v_eager.cpu())
    assert not torch.equal(k_ours.cpu(), k_cache)                            # the write landed in place
    real = [0, 1, 2, 3]                                                     # the padded row's token differs by design
    torch.testing.assert_close(ours.cpu()[real].float(), eager.cpu()[real].float(), atol=2e-2, rtol=2e-2)


def test_cpu_tensors_run_the_same_numerics_without_a_launch():
    query, key, value, k_cache, v_cache, meta, sizes = _case(seed=1)
    k2, v2 = k_cache.clone(), v_cache.clone()
    ours = _kernel(query, key, value, k_cache, v_cache, meta, sizes)
    eager = grouped_paged_attention(query, key, value, k2, v2, meta, *sizes)
    assert torch.equal(k_cache, k2)
    torch.testing.assert_close(ours[:4].float(), eager[:4].float(), atol=2e-2, rtol=2e-2)


def test_timing_only_times_the_launch_and_skips_its_numerics():
    query, key, value, k_cache, v_cache, meta, sizes = _case(seed=2)
    dev = [t.to("spyre") for t in (query, key, value, k_cache, v_cache)]
    smeta = _to(meta, "spyre")
    with timing_only(), recording() as trace:
        _kernel(*dev, smeta, sizes, layer=0)
    (event,) = [e for e in trace.events if e.args.get("kind") == "Compute"]
    assert event.name == "paged attention L0" and event.dur_us > 0
    assert event.args["blocks_read"] == (3 + 1 + 0) * 2       # cached blocks: ceil(9/4), ceil(2/4), none; x 2 heads
    assert torch.equal(dev[3].cpu(), k_cache)                  # numerics skipped: the cache is as it was


def test_launch_shapes_are_simulated_once():
    query, key, value, k_cache, v_cache, meta, sizes = _case(seed=3)
    dev = [t.to("spyre") for t in (query, key, value, k_cache, v_cache)]
    smeta = _to(meta, "spyre")
    _kernel(*dev, smeta, sizes, layer=1)
    before = paged_kernel.cache_info()["shapes"]
    for layer in range(4):
        _kernel(*dev, smeta, sizes, layer=layer)
    assert paged_kernel.cache_info()["shapes"] == before


def test_padding_rows_of_a_decode_batch_attend_to_nothing(kernel_on):
    """The decode bucket (3) holds at most 2 sequences: the model runner gives the padding row no keys and no
    queries, so the kernel's launch shape reads no block for it (the eager path attends it to the scratch block)."""
    from spyre_lab.engine.platforms import paged_kernel
    from spyre_lab.engine.platforms.paged_attention_op import KernelAttention

    with only_warnings(*SPYRE_ENGINE_WARNINGS):
        kernel_on.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    attn = next(m for m in kernel_on.llm_engine.model.modules() if isinstance(m, KernelAttention))
    launch = paged_kernel.layer_launch(attn.layer_index, attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.scale)
    seqs = launch.spec.shape.seqs             # its last launch: this run's last decode step
    assert len(seqs) == 3 and seqs[1:] == ((0, 0), (0, 0)) and seqs[0][1] == 1


def test_a_launch_with_an_operand_off_the_card_names_it():
    """A paged-attention launch with one operand off the card, or a slot unbound, is refused by the checking launch
    with an error naming the operand and the fix."""
    query, key, value, k_cache, v_cache, meta, sizes = _case(seed=5)
    dev = [t.to("spyre") for t in (query, key, value, k_cache, v_cache)]
    smeta = _to(meta, "spyre")
    launch = paged_kernel.layer_launch(2, *sizes)
    _kernel(*dev, smeta, sizes, layer=2)
    spec = launch.spec
    bindings = {"query": dev[0], "key": dev[1], "value": dev[2], "k_cache": dev[3], "v_cache": dev[4],
                "slot_mapping": smeta.slot_mapping, "block_tables": smeta.block_tables,
                "query_index": smeta.query_index, "seq_query_lens": smeta.seq_query_lens,
                "out": torch.empty(query.shape[0], sizes[0] * sizes[2], dtype=query.dtype).to("spyre")}
    with pytest.raises(ValueError, match=r"'key': 'cpu'.*\.to\('spyre:0'\)"):
        launch.loaded.launch(spec, {**bindings, "key": key})
    with pytest.raises(KeyError, match="slot_mapping"):
        launch.loaded.launch(spec, {k: v for k, v in bindings.items() if k != "slot_mapping"})
