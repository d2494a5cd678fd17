"""Make the embedded `tiny-granite` model: a small Granite trained briefly on synthetic text.

    .venv/bin/python scripts/make_tiny_granite.py            # writes spyre_lab/engine/models/tiny_granite/

The text is generated here (counting, one-digit sums, letter runs, a few facts), so the model's
greedy completions are checkable by eye: "count from 5 to 12:" -> " 5 6 7 8 9 10 11 12",
"The answer is" -> " 42.".
Everything is seeded; on one CPU thread training takes a few minutes. Training uses the
Hugging Face implementation (a reference we did not write), and the result is saved with
`save_pretrained`, so the shipped folder is an ordinary Hugging Face checkpoint plus our
character-level tokenizer.json. Needs the `dev` extra (transformers).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import string
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import GraniteConfig, GraniteForCausalLM

from spyre_lab.engine.tokenizer import CharTokenizer

OUT = Path(__file__).resolve().parents[1] / "spyre_lab" / "engine" / "models" / "tiny_granite"
CHARS = string.ascii_lowercase + string.digits + " .:+=,"
FACTS = [
    "the sky is blue.",
    "grass is green.",
    "snow is white.",
    "spyre has 32 cores.",
    "a kv block holds 16 tokens.",
    "prefill reads the whole prompt.",
    "decode makes one token per step.",
    "the answer is 42.",
]


def sample_text(rng: random.Random) -> str:
    """One training line from one of five templates."""
    kind = rng.randrange(5)
    if kind == 0:
        start = rng.randrange(0, 40)
        end = start + rng.randrange(3, 12)
        return f"count from {start} to {end}: " + " ".join(str(i) for i in range(start, end + 1))
    if kind == 1:
        start = rng.randrange(5, 40)
        end = start - rng.randrange(3, min(start, 10) + 1)
        return f"count down from {start} to {end}: " + " ".join(str(i) for i in range(start, end - 1, -1))
    if kind == 2:
        a, b = rng.randrange(10), rng.randrange(10)
        return f"{a} + {b} = {a + b}"
    if kind == 3:
        first = rng.randrange(20)
        last = first + rng.randrange(3, 26 - first) if first < 23 else 25
        return f"letters from {string.ascii_lowercase[first]} to {string.ascii_lowercase[last]}: " + " ".join(
            string.ascii_lowercase[first : last + 1]
        )
    return rng.choice(FACTS)


def make_batch(rng: random.Random, tokenizer: CharTokenizer, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [[*tokenizer.encode(sample_text(rng)), tokenizer.eos_token_id] for _ in range(batch_size)]
    width = max(map(len, rows))
    ids = torch.full((batch_size, width), tokenizer.pad_token_id)
    labels = torch.full((batch_size, width), -100)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, : len(row)] = torch.tensor(row)
    return ids, labels


def build_config(tokenizer: CharTokenizer) -> GraniteConfig:
    # Granite's four multipliers are set away from their neutral values so the engine must apply them.
    return GraniteConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        embedding_multiplier=4.0,
        residual_multiplier=0.5,
        attention_multiplier=0.125,
        logits_scaling=2.0,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def train(steps: int, batch_size: int, seed: int, threads: int) -> tuple[GraniteForCausalLM, CharTokenizer]:
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    rng = random.Random(seed)
    tokenizer = CharTokenizer(CHARS, lowercase=True)
    model = GraniteForCausalLM(build_config(tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)
    schedule = lambda step: min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        ids, labels = make_batch(rng, tokenizer, batch_size)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  {time.perf_counter() - start:6.1f} s", flush=True)
    return model.eval(), tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    model, tokenizer = train(args.steps, args.batch_size, args.seed, args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    (args.out / "generation_config.json").unlink(missing_ok=True)
    tokenizer.save(args.out / "tokenizer.json")
    for prompt in ["count from 5 to 12:", "3 + 4 =", "letters from c to h:", "spyre has", "The answer is"]:
        ids = torch.tensor([tokenizer.encode(prompt)])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
        print(f"{prompt!r} -> {tokenizer.decode(out[0, ids.shape[1]:].tolist())!r}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
