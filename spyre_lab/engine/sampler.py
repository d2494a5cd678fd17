"""Turn the last-token logits of each sequence into its next token.

Greedy rows (temperature 0) take the argmax. Other rows are scaled by temperature, filtered by
top-k and top-p, and sampled. A request with a `seed` draws from a generator seeded by
(seed, number of tokens generated so far), so its tokens do not depend on which other requests
share the batch, nor on whether it was preempted and recomputed.

Each row is sampled on its own: a row that cannot be sampled (NaN logits from the model, a
sampling value changed to something invalid after the request was accepted) fails only that
request (the returned :class:`SampledTokens` has None in its row and the reason in ``failures``),
never the others of the batch.
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


def scale_by_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature`` shifted so the largest is 0 first: a small temperature then sends the others
    to -inf (the argmax keeps all the probability) instead of every logit to +-inf and the softmax to NaN."""
    return (logits - logits.max()) / temperature


class SampledTokens(list):
    """The next token of every row (a list of ints), None in a row that could not be sampled; ``failures`` maps
    each such row to the reason (for that request's "error" output)."""

    def __init__(self, tokens: list[int | None], failures: dict[int, str]) -> None:
        super().__init__(tokens)
        self.failures = failures


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SampledTokens:
        """The next token of every row; a row that cannot be sampled is None, its reason in ``.failures``."""
        logits = logits.cpu().float()   # copy the model's dtype (half the bytes of fp32 over PCIe), widen on the host
        next_tokens: list[int | None] = logits.argmax(-1).tolist()
        failures: dict[int, str] = {}
        nan = torch.isnan(logits)
        if nan.any():                   # one reduction for the batch; the rows only when some row has a NaN
            for row in nan.any(-1).nonzero().flatten().tolist():
                failures[row] = ("the model produced NaN logits for this request (a numerical failure in the "
                                 "forward pass)")
                next_tokens[row] = None
        for row, seq in enumerate(seqs):
            if row in failures or seq.sampling_params.greedy:
                continue
            try:
                seq.sampling_params.validate()  # accepted valid, but the caller's object may have changed since
            except ValueError as error:
                failures[row] = f"its sampling params became invalid while it ran: {error}"
                next_tokens[row] = None
                continue
            try:
                next_tokens[row] = self._sample_row(logits[row], seq)
            except (RuntimeError, ValueError, TypeError, OverflowError, ZeroDivisionError) as error:
                failures[row] = f"sampling failed with {seq.sampling_params}: {type(error).__name__}: {error}"
                next_tokens[row] = None
        return SampledTokens(next_tokens, failures)

    def _sample_row(self, logits: torch.Tensor, seq: Sequence) -> int:
        params = seq.sampling_params
        filtered = filter_top_k_top_p(scale_by_temperature(logits, params.temperature), params.top_k, params.top_p)
        probs = filtered.softmax(-1)
        generator = self.generator
        if params.seed is not None:
            generator = torch.Generator().manual_seed(hash((params.seed, len(seq.output_token_ids))) & (2**62 - 1))
        return int(torch.multinomial(probs, 1, generator=generator))
