"""The spyre platform: tiny-granite on torch.device("spyre") in fp16, static shapes, modeled step time.

Default mode ("piecewise-compiled"): the model is compiled per bucket and split at attention; the
pieces are device Programs shared by identical decoder blocks, linear weights are stored transposed,
and paged attention runs between the pieces as eager device ops. ``compile_blocks=False`` keeps the
op-by-op mode ("eager-ops").
"""

from __future__ import annotations

import pytest
import torch
from warning_checks import only_warnings

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.platforms.registry import available_platforms, resolve_platform
from spyre_lab.engine.platforms.spyre import SpyrePlatform
from spyre_lab.engine.sampling_params import SamplingParams as Params
from spyre_lab.engine.sequence import Sequence

EXPECTED_WARNINGS = (
    r"spyre: aten\.embedding runs on the host CPU",            # the embedding gather, as in torch-spyre
    # eager-ops mode (every op its own launch): the portable layers' mask check and advanced indexing run on the
    # host, and RMSNorm's x.float() is a tensor of its own, stored as fp16 by the dtype policy
    r"aten::(isneginf|index|index_put_?|_index_put_impl_) has no spyre kernel",
    r"spyre stores torch\.float32 tensors as float16",
)


GREEDY = SamplingParams(temperature=0, max_tokens=8)
PROMPTS = {"3 + 4 =": " 7", "count from 5 to 12:": " 5 6 7 8"}  # known completions (the second cut at 8 tokens)
SMALL = dict(max_model_len=32, max_num_seqs=2, prefill_buckets=[32], batch_buckets=[2])


def spyre_llm(warmup: bool = True, **platform_options) -> LLM:
    with only_warnings(*EXPECTED_WARNINGS):  # CPU-fallback notices for ops the runtime has no kernel for
        llm = LLM("tiny-granite", platform=SpyrePlatform(prefill_buckets=SMALL["prefill_buckets"],
                                                          batch_buckets=SMALL["batch_buckets"], **platform_options),
                  max_model_len=SMALL["max_model_len"], max_num_seqs=SMALL["max_num_seqs"])
        if warmup:
            llm.warmup(show_progress=False)
    return llm


@pytest.fixture(scope="module")
def compiled() -> LLM:
    return spyre_llm()


@pytest.fixture(scope="module")
def cpu_fp16() -> LLM:
    return LLM("tiny-granite", dtype=torch.float16, max_model_len=SMALL["max_model_len"])


def test_spyre_platform_is_discovered():
    assert "spyre" in available_platforms()
    platform = resolve_platform("spyre")
    assert isinstance(platform, SpyrePlatform) and platform.dispatch_mode == "piecewise-compiled"


def test_compiled_blocks_give_the_cpu_platforms_greedy_tokens(compiled, cpu_fp16):
    assert next(compiled.llm_engine.model.parameters()).device.type == "spyre"
    with only_warnings(*EXPECTED_WARNINGS):
        outs = compiled.generate(list(PROMPTS), GREEDY, use_tqdm=False)
    reference = cpu_fp16.generate(list(PROMPTS), GREEDY, use_tqdm=False)
    assert [o.outputs[0].text for o in outs] == [r.outputs[0].text for r in reference] == list(PROMPTS.values())
    rows = [r for r in compiled.stats.to_rows() if not r["kind"].startswith("warmup")]
    assert rows and all(r["device_ms_modeled"] > 0 and r["dispatch"] == "piecewise-compiled" for r in rows)
    assert {r["token_bucket"] for r in rows if r["kind"] == "prefill"} == {32}


def test_prefill_logits_match_cpu_within_fp16_tolerance(compiled, cpu_fp16):
    """Same prompt, same fp16 weights: logits agree to 5e-2 absolute (fp16 rounds at ~1e-3 relative per op,
    and the device computes matmuls tile by tile in another order than the CPU)."""
    logits = []
    for llm in (compiled, cpu_fp16):
        engine = llm.llm_engine
        seq = Sequence("logits", engine.tokenizer.encode("count from 5 to 12:"), Params(temperature=0))
        engine.block_manager.allocate(seq)
        try:
            with only_warnings(*EXPECTED_WARNINGS):
                logits.append(engine.runner.execute(engine.runner.prepare_prefill([seq])).float().cpu())
        finally:
            engine.block_manager.free(seq)
    torch.testing.assert_close(logits[0], logits[1], atol=5e-2, rtol=0)
    assert logits[0].argmax(-1).tolist() == logits[1].argmax(-1).tolist()


def test_identical_blocks_share_one_program_per_bucket(compiled):
    platform = compiled.llm_engine.platform
    layers = compiled.llm_engine.model_config.num_hidden_layers
    assert sorted(platform.compile_stats) == [("decode", 2), ("prefill", 32)]  # one Dynamo graph per bucket
    for bucket, stats in platform.compile_stats.items():
        pieces = platform.compiled_pieces[bucket]
        # embed..qkv of block 0 | o_proj..qkv of the next block (x layers-1) | o_proj..final norm
        assert stats["pieces"] == len(pieces) == layers + 1
        middle = [piece.program for piece in pieces[1:-1]]
        assert all(program is middle[0] for program in middle)
        assert stats["compiles"] == 3 and stats["hits"] == layers - 2


def test_explain_finds_the_compiled_pieces_of_the_model(compiled):
    import spyre_lab

    text = str(spyre_lab.explain(compiled.llm_engine.model))
    layers = compiled.llm_engine.model_config.num_hidden_layers
    assert text.count("Program ") == 2 * (layers + 1)  # every piece of both buckets
    assert "silu -> mul" in text  # SiluAndMul's two ops in one kernel (alone or as the gate_up matmul's epilogue)


def weight_restickifies(pieces) -> int:
    """Restickify kernels whose source is a graph input (the weights; activations are intermediates)."""
    return sum(r.source in piece.program.inputs for piece in pieces for r in piece.program.restickifies)


def test_transposed_weights_remove_the_weight_restickify_kernels(compiled):
    plain = spyre_llm(transpose_weights=False).llm_engine.platform.compiled_pieces["decode", 2]
    assert weight_restickifies(plain) >= 4 * (len(plain) - 2)  # every middle piece: o_proj, gate_up, down, qkv
    assert weight_restickifies(compiled.llm_engine.platform.compiled_pieces["decode", 2]) == 0
    names = dict(compiled.llm_engine.model.named_parameters())
    assert "model.layers.0.self_attn.qkv_proj.weight_t" in names and "model.layers.0.self_attn.qkv_proj.weight" \
        not in names
    assert names["model.layers.0.mlp.down_proj.weight_t"].shape == (256, 128)  # [in, out]


def test_compile_options_reach_the_spyre_backend(compiled):
    unfused = spyre_llm(compile_options={"fusion": False}).llm_engine.platform.compiled_pieces["decode", 2]
    fused = compiled.llm_engine.platform.compiled_pieces["decode", 2]
    assert unfused[1].program.options.fusion == frozenset()
    assert len(unfused[1].program.launches) > len(fused[1].program.launches)


def test_eager_ops_mode_is_kept_for_comparison():
    llm = spyre_llm(compile_blocks=False)
    with only_warnings(*EXPECTED_WARNINGS):
        out = llm.generate(["3 + 4 ="], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0]
    assert out.outputs[0].text == " 7"
    rows = [r for r in llm.stats.to_rows() if not r["kind"].startswith("warmup")]
    assert rows and all(r["dispatch"] == "eager-ops" for r in rows)


def test_a_bucket_skipped_by_warmup_compiles_on_its_first_step(caplog):
    llm = spyre_llm(warmup=False)
    with only_warnings(*EXPECTED_WARNINGS):
        out = llm.generate(["3 + 4 ="], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0]
    assert out.outputs[0].text == " 7"
    dispatch = [r["dispatch"] for r in llm.stats.to_rows()]
    assert dispatch[:2] == ["piecewise-compiled+on-demand"] * 2 and set(dispatch[2:]) == {"piecewise-compiled"}
    assert sorted(llm.llm_engine.platform.compile_stats) == [("decode", 2), ("prefill", 32)]
    assert "was not warmed up" in caplog.text


def test_compiled_blocks_need_static_shapes():
    with pytest.raises(ValueError, match="compile_blocks=True needs static_shapes=True"):
        SpyrePlatform(static_shapes=False)
    assert SpyrePlatform(static_shapes=False, compile_blocks=False).dispatch_mode == "eager-ops"


def test_dynamo_recompile_limit_is_raised_only_while_a_step_runs(compiled):
    """Every bucket of every compiled model needs room in Dynamo's cache; the user's limit is back after."""
    before = torch._dynamo.config.recompile_limit
    platform = compiled.llm_engine.platform
    with platform.device_timer("decode", 2, 2):
        during = torch._dynamo.config.recompile_limit
    compiled.generate(["3 + 4 ="], GREEDY, use_tqdm=False)
    assert during >= before + platform.num_buckets
    assert torch._dynamo.config.recompile_limit == before
