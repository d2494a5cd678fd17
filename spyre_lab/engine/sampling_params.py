"""SamplingParams: how to pick each next token and when to stop (vLLM's names and meanings)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MIN_TEMPERATURE = 1 / 3.4028234663852886e38
"""The smallest non-zero temperature: below it ``1 / temperature`` overflows float32, the dtype the sampler scales
logits in (and a float32 temperature of 0 would divide by zero). Use 0 for greedy decoding."""


@dataclass
class SamplingParams:
    """temperature 0 is greedy; top_k -1 (or 0) and top_p 1 disable those filters.

    `seed` makes this request's sampling reproducible no matter how it is batched or preempted.
    `stop` strings end generation and are cut from the text; `stop_token_ids` end it too;
    `ignore_eos` keeps going past the model's end-of-sequence token.

    Invalid values raise ValueError when the object is built, as in vLLM; the engine checks again when a
    request is added (a field changed afterwards), and `LLM.generate` reports that request as finished
    with finish_reason "error" instead of raising.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if isinstance(self.stop_token_ids, int):
            self.stop_token_ids = [self.stop_token_ids]
        if not isinstance(self.stop, list | tuple | None):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the bad field and its allowed range."""
        if not (_is_number(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature {self.temperature!r} is so small that 1/temperature overflows float32 (the "
                             "sampler's dtype); use temperature=0 for greedy decoding or at least "
                             f"{MIN_TEMPERATURE:.3g}")
        if not (_is_number(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] (1 = disabled), got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled), 0 (disabled) or a positive int, got {self.top_k!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        if any(not _is_int(t) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    """A finite real number (NaN and inf would pass a range check like ``>= 0`` or silently fail it)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
