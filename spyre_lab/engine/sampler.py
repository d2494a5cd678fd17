"""Turn the last-token logits of each sequence into its next token.

Greedy rows (temperature 0) take the argmax. Other rows are scaled by temperature, filtered by
top-k and top-p, and sampled. A request with a `seed` draws from a generator seeded by
(seed, number of tokens generated so far), so its tokens do not depend on which other requests
share the batch, nor on whether it was preempted and recomputed.
"""

from __future__ import annotations

import torch

from spyre_lab.engine.sequence import Sequence


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the top-k and outside the smallest set with probability >= top_p."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        outside = probs.cumsum(-1) - probs >= top_p  # the tokens before this one already reach top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(outside, float("-inf")))
    return logits


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        logits = logits.cpu().float()   # copy the model's dtype (half the bytes of fp32 over PCIe), widen on the host
        next_tokens = logits.argmax(-1).tolist()
        for row, seq in enumerate(seqs):
            params = seq.sampling_params
            if params.greedy:
                continue
            filtered = filter_top_k_top_p(logits[row] / params.temperature, params.top_k, params.top_p)
            probs = filtered.softmax(-1)
            generator = self.generator
            if params.seed is not None:
                generator = torch.Generator().manual_seed(hash((params.seed, len(seq.output_token_ids))) & (2**62 - 1))
            next_tokens[row] = int(torch.multinomial(probs, 1, generator=generator))
        return next_tokens
