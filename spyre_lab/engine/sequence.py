"""Sequence: one request's tokens, its place in the KV cache and its lifecycle timestamps."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from spyre_lab.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued for prefill (new, or preempted and to be recomputed)
    RUNNING = "running"  # has KV blocks, decodes each step
    FINISHED = "finished"


@dataclass
class DecodeState:
    """How far a sequence's ``output_text`` is decoded (its first ``tokens`` output tokens) and searched for the
    stop strings ``stops`` (its first ``searched`` characters); kept by `engine.detokenizer`."""

    tokens: int = 0
    searched: int = 0
    stops: list[str] | None = None


@dataclass
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = field(default_factory=time.perf_counter)
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # of those, found by prefix caching at the last prefill
    block_hashes: list[int] = field(default_factory=list)  # hash chain of the full, computed blocks
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None  # why a step failed this request (finish_reason "error")
    output_text: str = ""
    num_preemptions: int = 0
    first_token_time: float | None = None
    finished_time: float | None = None
    #: how far ``output_text`` is decoded and searched for stop strings (`detokenizer`)
    decode_state: DecodeState = field(default_factory=DecodeState, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()
        self.output_token_ids.append(token_id)
