"""The four properties of portable layers: compilable, extensible, isolated, portable."""

from __future__ import annotations

import ast
import inspect
import re

import pytest
import torch

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.layers.attention import Attention
from spyre_lab.engine.layers.linear import Linear, RowParallelLinear
from spyre_lab.engine.layers.norm import RMSNorm
from spyre_lab.engine.layers.rotary import RotaryEmbedding
from spyre_lab.engine.models import granite
from spyre_lab.engine.platforms.base import Platform
from spyre_lab.engine.platforms.cpu import CpuPlatform
from spyre_lab.engine.sequence import Sequence

PROMPTS = [[1, 5, 17, 33, 99, 100, 7], [1, 2, 3], [1, 64, 65, 66, 67, 68, 69, 70, 71, 72]]


class WideRMSNorm(RMSNorm):
    """A platform's RMSNorm: counts its calls and normalizes in float64."""

    calls = 0

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        wide = x.double()
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * wide.to(x.dtype)


class TransposedLinear(Linear):
    """Spyre-style linear: computes x @ W^T with W^T materialized once (same parameter, same state dict)."""

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        out = x @ self.weight.t().contiguous()
        return out if self.bias is None else out + self.bias


class ToyPlatform(Platform):
    name = "toy"

    def register_ops(self) -> None:
        self.register_oot("RMSNorm", WideRMSNorm)
        self.register_oot("Linear", TransposedLinear)


def test_decoder_block_compiles_with_fullgraph(hf_granite_dir):
    """Each decoder block (paged attention included) traces as one graph: no graph breaks."""
    engine = LLM(hf_granite_dir, max_model_len=64, block_size=4).llm_engine
    seqs = [Sequence(str(i), p, SamplingParams()) for i, p in enumerate(PROMPTS)]
    for seq in seqs:
        engine.block_manager.allocate(seq)
    model_input = engine.runner.prepare_prefill(seqs)
    layer = engine.model.model.layers[0]
    hidden = torch.randn(model_input.input_ids.numel(), 64)
    cos_sin = engine.model.model.rotary_emb.cos_sin(model_input.positions)
    with torch.no_grad():
        expected = layer(cos_sin, hidden, model_input.meta)
        compiled = torch.compile(layer, fullgraph=True, backend="eager", dynamic=False)
        got = compiled(cos_sin, hidden, model_input.meta)
    torch.testing.assert_close(got, expected)


def test_platform_swaps_rmsnorm_without_touching_model_code(hf_granite_dir):
    WideRMSNorm.calls = 0
    llm = LLM(hf_granite_dir, platform=ToyPlatform(), max_model_len=64)
    model = llm.llm_engine.model
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert norms and all(type(m) is WideRMSNorm for m in norms)
    assert isinstance(model.model.layers[0].self_attn.o_proj, TransposedLinear)
    assert set(model.state_dict()) == set(LLM(hf_granite_dir, max_model_len=64).llm_engine.model.state_dict())
    llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert WideRMSNorm.calls == 3 * (2 * 2 + 1)  # 3 steps x (2 layers x 2 norms + final norm)


def code_identifiers(module) -> set[str]:
    """Names, attributes and non-docstring string constants used by a module's code (imports excluded)."""
    tree = ast.parse(inspect.getsource(module))
    docstrings = {
        id(node.body[0].value) for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) and node.body
        and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found.add(node.value)
    return found


def test_model_code_has_no_platform_checks():
    """Model and layer code never branch on the platform; only platforms/ knows about devices."""
    from spyre_lab.engine.layers import activation, attention, custom_op, linear, norm, rotary

    forbidden = re.compile(r"platform|spyre|cuda|device_type|is_cpu", re.IGNORECASE)
    for module in (granite, activation, attention, linear, norm, rotary):
        offending = {name for name in code_identifiers(module) if forbidden.search(name)}
        assert not offending, f"{module.__name__} mentions {offending}"
    # The one place layers meet platforms: CustomOp construction looks up an override by name.
    assert "_active_overrides" in code_identifiers(custom_op)
    assert not {n for n in code_identifiers(custom_op) if "platform" in n.lower()}


def test_same_model_runs_on_two_platforms_with_matching_outputs(hf_granite_dir):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    cpu = LLM(hf_granite_dir, platform="cpu", max_model_len=64)
    toy = LLM(hf_granite_dir, platform=ToyPlatform(), max_model_len=64)
    cpu_out = cpu.generate(PROMPTS, params, use_tqdm=False)
    toy_out = toy.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in cpu_out] == [o.outputs[0].token_ids for o in toy_out]
    seq = Sequence("x", PROMPTS[2], SamplingParams())
    logits = []
    for llm in (cpu, toy):
        llm.llm_engine.block_manager.allocate(seq)
        logits.append(llm.llm_engine.runner.execute(llm.llm_engine.runner.prepare_prefill([seq])))
        llm.llm_engine.block_manager.free(seq)
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)


def test_override_must_subclass_the_layer():
    class NotANorm(Linear):
        pass

    platform = CpuPlatform()
    platform.register_oot("RMSNorm", NotANorm)
    from spyre_lab.engine.platforms.base import set_current_platform

    with set_current_platform(platform):
        try:
            RMSNorm(8)
        except TypeError as error:
            assert "must subclass RMSNorm" in str(error)
        else:
            raise AssertionError("expected TypeError")
        assert type(RowParallelLinear(4, 4)) is Linear  # other layers unaffected
        assert type(Attention(2, 4, 0.5, 1)) is Attention


class CountingRotary(RotaryEmbedding):
    """A platform's RoPE that counts how often the angles are gathered and how often a layer rotates."""

    gathers = rotations = 0

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        type(self).gathers += 1
        return super().cos_sin(positions)

    def forward_oot(self, cos_sin, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        type(self).rotations += 1
        return self.forward_native(cos_sin, query, key)


class CountingRotaryPlatform(Platform):
    name = "counting-rotary"

    def register_ops(self) -> None:
        self.register_oot("RotaryEmbedding", CountingRotary)


def test_rotary_angles_are_gathered_once_per_step_and_shared_by_every_layer(hf_granite_dir):
    CountingRotary.gathers = CountingRotary.rotations = 0
    llm = LLM(hf_granite_dir, platform=CountingRotaryPlatform(), max_model_len=64)
    model = llm.llm_engine.model
    rotaries = {id(m) for m in model.modules() if isinstance(m, RotaryEmbedding)}
    assert rotaries == {id(model.model.rotary_emb)}
    assert all(layer.self_attn.rotary_emb is model.model.rotary_emb for layer in model.model.layers)
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    reference = LLM(hf_granite_dir, max_model_len=64).generate(
        [PROMPTS[0]], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert out[0].outputs[0].token_ids == reference[0].outputs[0].token_ids
    assert CountingRotary.gathers == 3  # 3 steps, one gather each
    assert CountingRotary.rotations == 3 * 2  # 3 steps x 2 layers


def test_rotary_matches_rotating_each_head_by_its_position_angle():
    rope = RotaryEmbedding(head_dim=8, max_position=16, base=100.0)
    positions = torch.tensor([0, 5, 15])
    query, key = torch.randn(3, 2 * 8), torch.randn(3, 1 * 8)
    got_q, got_k = rope(rope.cos_sin(positions), query, key)
    assert got_q.shape == query.shape and got_k.shape == key.shape
    inv_freq = 1.0 / (100.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    angle = positions.double()[:, None, None] * inv_freq  # [T, 1, d/2]
    for x, got in ((query, got_q), (key, got_k)):
        x1, x2 = x.double().view(3, -1, 8).chunk(2, dim=-1)
        expected = torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], dim=-1)
        torch.testing.assert_close(got, expected.view(3, -1).float(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_q[0], query[0])  # position 0: no rotation


def test_rotary_table_in_blocks_equals_the_whole_table_at_once():
    from spyre_lab.engine.layers.rotary import POSITIONS_PER_BLOCK, rotary_table

    head_dim, positions, base = 64, 2 * POSITIONS_PER_BLOCK + 77, 10_000_000.0   # a partial last block
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.outer(torch.arange(positions, dtype=torch.float64), inv_freq)
    whole = torch.cat([freqs.cos(), freqs.sin()], dim=-1).float()
    assert torch.equal(rotary_table(head_dim, positions, base), whole)            # bit for bit


def test_rotary_built_on_meta_computes_no_table():
    with torch.device("meta"):
        rope = RotaryEmbedding(head_dim=128, max_position=131_072, base=10_000_000.0)
    assert rope.cos_sin_cache.device.type == "meta" and rope.cos_sin_cache.shape == (131_072, 128)
    assert rope.cos_sin_cache.dtype == torch.get_default_dtype()
    cpu = RotaryEmbedding(head_dim=128, max_position=16, base=10_000_000.0)
    assert cpu.cos_sin_cache.device.type == "cpu" and cpu.cos_sin_cache.abs().max() <= 1.0


def test_rotating_adjacent_q_and_k_in_one_pass_equals_two_rotations():
    """q and k sliced from one fused qkv rotate in one pass; the values are those of rotating each alone."""
    from spyre_lab.engine.layers.rotary import _adjacent

    rope = RotaryEmbedding(32, 64)
    qkv = torch.randn(7, (4 + 2 + 2) * 32, generator=torch.Generator().manual_seed(0))
    q, k, _ = qkv.split([128, 64, 64], dim=-1)
    cos_sin = rope.cos_sin(torch.arange(7))
    assert _adjacent(q, k) and not _adjacent(q, k.clone()) and not _adjacent(k, q)
    joint = rope(cos_sin, q, k)
    apart = rope(cos_sin, q.clone(), k.clone())                  # not adjacent: one rotation each
    assert all(torch.equal(a, b) for a, b in zip(joint, apart, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_host_rmsnorm_equals_the_fused_op(dtype):
    # the host path (addmv, rsqrt, two scalings) in place of F.rms_norm: the same values but for the sum's order
    torch.manual_seed(0)
    norm = RMSNorm(96, eps=1e-5).to(dtype)
    torch.nn.init.normal_(norm.weight)
    for rows in (1, 7, 300):
        x = torch.randn(rows, 96, dtype=dtype) * 3
        expected = torch.nn.functional.rms_norm(x, (96,), norm.weight, 1e-5)
        got = norm(x)
        assert got.dtype == dtype and got.shape == x.shape
        torch.testing.assert_close(got, expected, rtol=1e-6 if dtype is torch.float32 else 1e-12, atol=0)
    assert torch.equal(norm(torch.zeros(2, 96, dtype=dtype)), torch.zeros(2, 96, dtype=dtype))   # eps keeps 0 -> 0
