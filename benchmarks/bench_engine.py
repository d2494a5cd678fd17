"""Engine throughput on the cpu platform (host wall-clock, measured) and the spyre platform (host measured,
device modeled).

    .venv/bin/python benchmarks/bench_engine.py [--threads 1] [--repeats 5] [SECTION ...]   (--help lists them)

1. tokens/s of `LLM.generate` vs transformers `generate()` on the shipped tiny-granite, batch 1 and 16.
2. Overhead of the portable layers (CustomOp dispatch, fused-weight linears) vs a hand-written
   native model (plain nn.Linear / nn.RMSNorm / inline RoPE, same weights, same paged attention
   math, same engine), geomean over three model sizes. The published bar for hardware-agnostic
   layers is "within 3.4% of native".
3. The spyre platform on the known tiny-granite prompts, eager-ops vs piecewise-compiled: warmup
   seconds, host ms per decode step (and as a ratio to the cpu platform's step in the same run), modeled
   TTFT / TPOT, whether the greedy tokens equal the cpu
   platform's, and the kernels of one compiled decoder block.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F
from sections import chosen, parser
from torch import nn

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.layers.attention import AttentionMetadata
from spyre_lab.engine.loader import resolve_model_path
from spyre_lab.engine.models.config import ModelConfig
from spyre_lab.engine.sequence import Sequence


# ---- a hand-written model with the same parameter names, no CustomOp layers ------------------------
class NativeLayer(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.c = c
        self.input_layernorm = nn.RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size, c.rms_norm_eps)
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.self_attn = nn.Module()
        self.self_attn.qkv_proj = nn.Linear(c.hidden_size, q + 2 * kv, bias=False)
        self.self_attn.o_proj = nn.Linear(q, c.hidden_size, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.sizes = [q, kv, kv]
        self.k_cache = self.v_cache = torch.empty(0)

    def forward(self, hidden, cos, sin, meta: AttentionMetadata):
        c, t = self.c, hidden.shape[0]
        q, k, v = self.self_attn.qkv_proj(self.input_layernorm(hidden)).split(self.sizes, dim=-1)
        q, k = rope(q.view(t, -1, c.head_dim), cos, sin), rope(k.view(t, -1, c.head_dim), cos, sin)
        self.k_cache.view(-1, c.num_key_value_heads, c.head_dim).index_copy_(0, meta.slot_mapping, k)
        self.v_cache.view(-1, c.num_key_value_heads, c.head_dim).index_copy_(0, meta.slot_mapping, v.view_as(k))
        keys = self.k_cache[meta.block_tables].flatten(1, 2).transpose(1, 2)
        values = self.v_cache[meta.block_tables].flatten(1, 2).transpose(1, 2)
        queries = q[meta.query_index].transpose(1, 2)
        attn = F.scaled_dot_product_attention(queries, keys, values, attn_mask=meta.attn_bias,
                                              scale=c.attention_scale, enable_gqa=True)
        attn = attn.transpose(1, 2).reshape(-1, q.shape[-2] * c.head_dim)[meta.out_index]
        hidden = hidden + self.self_attn.o_proj(attn) * c.residual_multiplier
        gate, up = self.mlp.gate_up_proj(self.post_attention_layernorm(hidden)).chunk(2, dim=-1)
        return hidden + self.mlp.down_proj(F.silu(gate) * up) * c.residual_multiplier


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class NativeGranite(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.config = c
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.model.layers = nn.ModuleList(NativeLayer(c) for _ in range(c.num_hidden_layers))
        self.model.norm = nn.RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        freqs = torch.outer(torch.arange(c.max_position_embeddings, dtype=torch.float64), inv_freq).float()
        self.cos, self.sin = freqs.cos(), freqs.sin()

    def forward(self, input_ids, positions, meta):
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        hidden = self.model.embed_tokens(input_ids) * self.config.embedding_multiplier
        for layer in self.model.layers:
            hidden = layer(hidden, cos, sin, meta)
        return self.model.norm(hidden)

    def compute_logits(self, hidden):
        return self.lm_head(hidden) / self.config.logits_scaling


def use_native_model(llm: LLM) -> None:
    """Swap the engine's model for the native one (same weights, same KV-cache tensors)."""
    engine = llm.llm_engine
    native = NativeGranite(engine.model_config)
    native.load_state_dict(engine.model.state_dict(), strict=True)
    for layer, (k, v) in zip(native.model.layers, engine.runner.kv_caches):
        layer.k_cache, layer.v_cache = k, v
    engine.model = engine.runner.model = native.eval()


# ---- measurements -------------------------------------------------------------------------------------
def engine_tokens_per_s(llm: LLM, prompts, new_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outs) / elapsed


def hf_tokens_per_s(model, prompts, new_tokens: int) -> float:
    ids = torch.tensor(prompts)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    elapsed = time.perf_counter() - start
    return (out.shape[1] - ids.shape[1]) * ids.shape[0] / elapsed


def forward_us(llm: LLM, model_input, calls: int = 50) -> float:
    """Mean microseconds of one model forward + logits on a fixed decode batch (no scheduling)."""
    runner = llm.llm_engine.runner
    start = time.perf_counter()
    for _ in range(calls):
        runner.execute(model_input)
    return (time.perf_counter() - start) / calls * 1e6


def decode_input(llm: LLM, batch: int):
    """A decode step for `batch` sequences of 17 tokens, built by the engine's own runner."""
    engine = llm.llm_engine
    seqs = [Sequence(str(i), [1, *range(10 + i, 26 + i)], SamplingParams()) for i in range(batch)]
    for seq in seqs:
        engine.block_manager.allocate(seq)
        seq.num_computed_tokens = len(seq) - 1
    model_input = engine.runner.prepare_decode(seqs)
    for seq in seqs:
        engine.block_manager.free(seq)
    return model_input


def bench_vs_transformers(repeats: int, new_tokens: int) -> None:
    """tokens/s of LLM.generate vs transformers generate() on tiny-granite, batch 1 and 16."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path("tiny-granite")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM("tiny-granite", max_model_len=128, max_num_seqs=16, enable_prefix_caching=False)
    tokenizer = llm.tokenizer
    print(f"\n[1] tiny-granite, greedy, {new_tokens} new tokens, prompt 16 tokens (host wall-clock, best of {repeats})")
    print(f"{'batch':>6} {'spyre_lab cpu tok/s':>20} {'transformers tok/s':>19} {'ratio':>6}")
    for batch in (1, 16):
        prompts = [tokenizer.encode(f"count from {i} to {i + 9}")[:16] for i in range(batch)]
        ours = max(engine_tokens_per_s(llm, prompts, new_tokens) for _ in range(repeats))
        theirs = max(hf_tokens_per_s(hf, prompts, new_tokens) for _ in range(repeats))
        print(f"{batch:>6} {ours:>20.1f} {theirs:>19.1f} {ours / theirs:>6.2f}")


SIZES = {  # hidden, layers, heads, kv heads, intermediate
    "small": (64, 2, 4, 2, 128),
    "medium": (256, 4, 8, 4, 512),
    "large": (512, 8, 8, 4, 1408),
}


def bench_portable_overhead(repeats: int, new_tokens: int, batch: int) -> None:
    """Portable layers vs a hand-written native model: tokens/s and forward time, three model sizes."""
    from transformers import GraniteConfig, GraniteForCausalLM

    print(f"\n[2] portable layers vs hand-written native model, batch {batch}, {new_tokens} new tokens "
          f"(host wall-clock, best of {repeats}, runs interleaved)")
    print("  engine: best tokens/s of each; forward: medians over interleaved pairs of 20-call blocks;"
          " which model runs first alternates")
    print(f"{'size':>7} {'params':>8} {'portable tok/s':>15} {'native tok/s':>13} {'overhead':>9}"
          f" {'portable fwd us':>16} {'native fwd us':>14} {'fwd overhead':>13}")
    ratios, forward_ratios = [], []
    for name, (hidden, layers, heads, kv_heads, inter) in SIZES.items():
        with tempfile.TemporaryDirectory() as folder:
            torch.manual_seed(0)
            config = GraniteConfig(vocab_size=256, hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=inter,
                                   max_position_embeddings=256, embedding_multiplier=4.0, residual_multiplier=0.5,
                                   attention_multiplier=0.125, logits_scaling=2.0)
            model = GraniteForCausalLM(config)
            params = sum(p.numel() for p in model.parameters())
            model.save_pretrained(folder)
            options = dict(max_model_len=128, max_num_seqs=batch, enable_prefix_caching=False)
            portable, native = LLM(folder, **options), LLM(folder, **options)
        use_native_model(native)
        prompts = [[1, *range(10 + i, 26 + i)] for i in range(batch)]
        check = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        same = [o.outputs[0].token_ids for o in portable.generate(prompts, check, use_tqdm=False)] == [
            o.outputs[0].token_ids for o in native.generate(prompts, check, use_tqdm=False)]
        portable_best = native_best = 0.0
        for i in range(repeats):
            order = (portable, native) if i % 2 == 0 else (native, portable)
            speeds = {id(llm): engine_tokens_per_s(llm, prompts, new_tokens) for llm in order}
            portable_best = max(portable_best, speeds[id(portable)])
            native_best = max(native_best, speeds[id(native)])
        ratio = native_best / portable_best
        ratios.append(ratio)
        model_input = decode_input(portable, batch)
        pairs = []  # forward only; adjacent pairs see the same machine load, so compare within a pair
        for i in range(6 * repeats):
            order = (portable, native) if i % 2 == 0 else (native, portable)
            us = {id(llm): forward_us(llm, model_input, 20) for llm in order}
            pairs.append((us[id(portable)], us[id(native)]))
        portable_us = statistics.median(p for p, _ in pairs)
        native_us = statistics.median(n for _, n in pairs)
        forward_ratio = statistics.median(p / n for p, n in pairs)
        forward_ratios.append(forward_ratio)
        print(f"{name:>7} {params / 1e6:>7.2f}M {portable_best:>15.1f} {native_best:>13.1f} {ratio - 1:>+9.1%}"
              f" {portable_us:>16.1f} {native_us:>14.1f} {forward_ratio - 1:>+13.1%}"
              f"{'' if same else '  (outputs differ!)'}")
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    forward_geomean = math.exp(sum(map(math.log, forward_ratios)) / len(forward_ratios))
    print(f"geomean overhead of portable layers: engine tokens/s {geomean - 1:+.1%}, "
          f"model forward {forward_geomean - 1:+.1%} (published bar: within 3.4% of native)")


KNOWN_PROMPTS = ["count from 5 to 12:", "count down from 20 to 14:", "3 + 4 =", "letters from c to h:", "spyre has",
                 "the answer is"]


def bench_spyre_platform(max_model_len: int = 64) -> None:
    """Known tiny-granite prompts on the spyre platform, op by op vs piecewise-compiled, one request at a time."""
    import warnings

    from spyre_lab.engine.platforms.spyre import SpyrePlatform

    print(f"\n[3] spyre platform, tiny-granite, known prompts one at a time (prefill bucket {max_model_len}, batch 1)")
    print("  host ms: measured wall-clock; device ms: modeled by the runtime's recording of each step")
    greedy = SamplingParams(temperature=0, max_tokens=max_model_len)
    cpu_llm = LLM("tiny-granite", dtype=torch.float16, max_model_len=max_model_len)
    reference = [o.outputs[0].text for o in cpu_llm.generate(KNOWN_PROMPTS, greedy, use_tqdm=False)]
    cpu_host_ms = statistics.median(r["host_ms"] for r in cpu_llm.stats.to_rows() if r["kind"] == "decode")
    print(f"  cpu platform, same prompts, this run: {cpu_host_ms:.2f} host ms per decode step (the x cpu column)")
    print(f"{'dispatch':>19} {'warmup s':>9} {'host ms/decode':>15} {'x cpu':>6} {'TTFT ms (mod.)':>15}"
          f" {'TPOT ms (mod.)':>15} {'same tokens as cpu':>19}")
    for compile_blocks in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            platform = SpyrePlatform(prefill_buckets=[max_model_len], batch_buckets=[1], compile_blocks=compile_blocks)
            llm = LLM("tiny-granite", platform=platform, max_model_len=max_model_len, max_num_seqs=1)
            start = time.perf_counter()
            llm.warmup(show_progress=False)
            warmup_s = time.perf_counter() - start
            texts = [llm.generate([p], greedy, use_tqdm=False)[0].outputs[0].text for p in KNOWN_PROMPTS]
        rows = [r for r in llm.stats.to_rows() if not r["kind"].startswith("warmup")]
        decode = [r for r in rows if r["kind"] == "decode"]
        host_ms = statistics.median(r["host_ms"] for r in decode)
        ttft = statistics.mean(r["device_ms_modeled"] for r in rows if r["kind"] == "prefill")
        tpot = statistics.mean(r["device_ms_modeled"] for r in decode)
        print(f"{platform.dispatch_mode:>19} {warmup_s:>9.2f} {host_ms:>15.1f} {host_ms / cpu_host_ms:>6.1f}"
              f" {ttft:>15.3f} {tpot:>15.3f}"
              f" {texts == reference!s:>19}")
        if compile_blocks:
            pieces = platform.compiled_pieces["decode", 1]
            block = pieces[1].program
            host = sum(type(launch).__name__ == "HostFallback" for launch in block.launches)
            stats = platform.compile_stats["decode", 1]
            print(f"  decoder block (decode bucket): {len(block.launches) - host} device kernels + {host} host "
                  f"fallbacks in its compiled piece, + the paged-attention device ops; {stats['pieces']} pieces per "
                  f"bucket -> {stats['compiles']} compiles, {stats['hits']} program-cache hits")


SECTIONS = {"transformers": bench_vs_transformers, "portable": bench_portable_overhead,
            "spyre": bench_spyre_platform}


def main(argv: list[str]) -> None:
    p = parser(__doc__, SECTIONS)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--repeats", type=int, default=9, help="runs per measurement; the best counts (default 9)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    p.add_argument("--batch", type=int, default=8, help="batch for the portable-vs-native comparison (default 8)")
    args = p.parse_args(argv)
    names = chosen(args.sections, SECTIONS)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} cpu(s) visible")
    if "transformers" in names:
        bench_vs_transformers(args.repeats, args.new_tokens)
    if "portable" in names:
        bench_portable_overhead(args.repeats, args.new_tokens, args.batch)
    if "spyre" in names:
        bench_spyre_platform()


if __name__ == "__main__":
    main(sys.argv[1:])
