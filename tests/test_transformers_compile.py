"""Unmodified transformers models under ``torch.compile(backend="spyre")`` on the spyre device.

Each model is built from a tiny config with seeded random weights, cast with ``.half().to("spyre")``
and compiled as a whole; nothing in transformers is patched. References run on the CPU:

* logits: the fp32 CPU model on the same fp16-rounded weights. Weights are drawn with std 0.2 so the
  logits are O(1) (up to ~5) and the tolerance means something relative to them. The device stores every
  buffer in fp16 between kernels (relative rounding 2**-11 ~ 4.9e-4 per store, 3.9e-3 absolute at 5)
  and accumulates in fp32; measured: at most 3.9e-3 (llama) and 1.5e-3 (granite), i.e. the final fp16
  rounding. Tolerance atol = rtol = 1e-2 (|err| <= 0.01 + 0.01 * |logit|) keeps >10x headroom and still
  catches any wrong op, which moves logits by O(1).
* tokens: greedy ``generate()`` must give exactly the CPU fp32 model's tokens.
* static cache: after ``generate()`` with a ``StaticCache`` the cache the compiled model updated in
  place must hold what the CPU model wrote (its length counter and every key/value row).
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from warning_checks import only_warnings

transformers = pytest.importorskip("transformers")

import spyre_lab.compiler  # noqa: E402, F401  (registers the backend from a source checkout)
from spyre_lab.runtime.dynamo_backend import compiled_graphs_for  # noqa: E402

TOL = {"atol": 1e-2, "rtol": 1e-2}
NEW_TOKENS = 3
PROMPT = torch.tensor([[3, 17, 42, 9, 77, 5]])

COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=32, pad_token_id=0,
              eos_token_id=None,  # no end-of-sequence token: every run generates all NEW_TOKENS
              initializer_range=0.2)  # O(1) logits, so the tolerance below is tight relative to them
CONFIGS = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON)),
    # Granite's multipliers make it a different function from Llama on the same weights
    "granite": lambda: transformers.GraniteForCausalLM(transformers.GraniteConfig(
        **COMMON, embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.25, logits_scaling=2.0)),
}

EXPECTED_WARNINGS = (
    r"runs on the host CPU \(Fallback\)",          # embedding gather, sin/cos of the rotary tables
    r"spyre stores torch\.float32 tensors as float16",  # the rotary tables are computed in fp32
    r"has no tile plan and will not be timed",      # concatenation onto the empty dynamic cache (size-0 operand)
    r"CPU fallback",                                # generate()'s own eager ops between steps (argmax, isin, ...)
    r"`past_key_values` is deprecated",             # transformers' own FutureWarning for the static-cache call
)


@pytest.fixture
def expected_warnings_only() -> Iterator[None]:
    """Every warning the test gives must be one of the documented fallbacks; anything else fails the test."""
    with only_warnings(*EXPECTED_WARNINGS):
        yield


def test_fake_tensor_mode_builds_device_constants():
    """The root cause: Dynamo runs ``torch.tensor(data, device="spyre")`` inside FakeTensorMode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        empty = torch.tensor([], dtype=torch.float16, device="spyre")
        data = torch.tensor([[1.0, 2.0]], dtype=torch.float16, device="spyre")
    assert (empty.device.type, tuple(empty.shape)) == ("spyre", (0,))
    assert (data.device.type, tuple(data.shape), data.dtype) == ("spyre", (1, 2), torch.float16)


def test_device_literals_in_a_compiled_graph_match_eager(expected_warnings_only):
    def f(x):
        positions = torch.arange(x.shape[-1], device=x.device).to(x.dtype)
        return x * positions + torch.tensor([0.5], dtype=x.dtype, device=x.device)

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)).half().to("spyre")
    got = torch.compile(f, backend="spyre")(x)
    assert got.device.type == "spyre"
    torch.testing.assert_close(got.cpu(), f(x).cpu(), **TOL)


def _models(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(CPU fp32 reference, fp16 model on spyre) with the same fp16-rounded weights."""
    torch.manual_seed(0)
    model = CONFIGS[name]().eval()
    reference = model.half().float()                       # fp32 reference on the rounded weights
    return reference, copy.deepcopy(reference).half().to("spyre")


def _compiled_forward(device_model: torch.nn.Module) -> torch.nn.Module:
    """``generate()`` calls the module itself, so it runs compiled once ``forward`` is (transformers' own recipe)."""
    if not hasattr(device_model.forward, "_torchdynamo_orig_callable"):
        device_model.forward = torch.compile(device_model.forward, backend="spyre")
    return device_model


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def models(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        return _models(request.param)


@torch.no_grad()
def test_compiled_forward_matches_cpu_fp32_logits(models, expected_warnings_only):
    reference, device_model = models
    expected = reference(PROMPT).logits
    got = torch.compile(device_model, backend="spyre")(PROMPT.to("spyre")).logits
    assert got.device.type == "spyre" and got.dtype == torch.float16
    torch.testing.assert_close(got.cpu().float(), expected, **TOL)


@torch.no_grad()
def test_compiled_generate_with_the_dynamic_cache_gives_the_cpu_tokens(models, expected_warnings_only):
    reference, device_model = models
    settings = dict(max_new_tokens=NEW_TOKENS, do_sample=False)
    expected = reference.generate(PROMPT, **settings)
    got = _compiled_forward(device_model).generate(PROMPT.to("spyre"), **settings)
    assert got.device.type == "spyre" and compiled_graphs_for(device_model), "generate() ran the compiled forward"
    assert got.cpu().tolist() == expected.tolist()


@torch.no_grad()
def test_compiled_generate_updates_a_static_cache_in_place(models, expected_warnings_only):
    reference, device_model = models
    settings = dict(max_new_tokens=NEW_TOKENS, do_sample=False)
    cache_len = PROMPT.shape[1] + NEW_TOKENS + 2
    cpu_cache = transformers.StaticCache(config=reference.config, max_cache_len=cache_len)
    device_cache = transformers.StaticCache(config=reference.config, max_cache_len=cache_len)
    expected = reference.generate(PROMPT, past_key_values=cpu_cache, **settings)
    got = _compiled_forward(device_model).generate(PROMPT.to("spyre"), past_key_values=device_cache, **settings)
    assert compiled_graphs_for(device_model)
    assert got.cpu().tolist() == expected.tolist()
    for cpu_layer, device_layer in zip(cpu_cache.layers, device_cache.layers, strict=True):
        # the compiled decode steps write their key/value row and advance the counter in place
        assert int(device_layer.cumulative_length.cpu()) == int(cpu_layer.cumulative_length)
        assert device_layer.keys.device.type == "spyre"
        torch.testing.assert_close(device_layer.keys.cpu().float(), cpu_layer.keys.float(), **TOL)
        torch.testing.assert_close(device_layer.values.cpu().float(), cpu_layer.values.float(), **TOL)
