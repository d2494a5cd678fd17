"""Continuous batching: each step prefills new requests, decodes one token for every running one, or (mixed steps)
both at once.

Without mixed steps, prefill goes first (new requests join as soon as there is room), bounded by `max_num_seqs` running
requests and `max_num_batched_tokens` per step. When a decode step needs a KV block and none is
free, the most recently started request is *preempted by recompute*: its blocks are freed and it
goes back to the front of the waiting queue with the tokens it has generated so far, to be prefilled
again later (prefix caching usually makes that cheap). Its output is the same as if it had never
been interrupted.

With ``mixed_steps`` (vLLM v1's scheduler; `EngineConfig.mixed_steps`), one step does both: every running request
gets its decode token first (preempting as above when a block is missing), then waiting requests are admitted into
the same step while ``max_num_seqs`` and the token budget ``max_num_batched_tokens`` (decode tokens included) allow.
Their prompts run in the same forward pass as the decode rows, so a prompt no longer stops every running request
for a step of its own. A step that preempted admits nobody (the freed blocks go to the requests still running).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from spyre_lab.engine.block_manager import BlockManager
from spyre_lab.engine.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    """One step's batch. ``seqs[:num_decode]`` decode one token each; the rest are prefilled (their uncomputed
    tokens). ``num_decode`` defaults to every sequence of a decode step and none of a prefill step."""

    seqs: list[Sequence]
    is_prefill: bool  # some sequence of the step is prefilled (a prefill or a mixed step)
    preempted: list[Sequence]
    num_decode: int | None = None

    def __post_init__(self) -> None:
        if self.num_decode is None:
            self.num_decode = 0 if self.is_prefill else len(self.seqs)

    @property
    def kind(self) -> str:
        """``"prefill"``, ``"decode"`` or ``"mixed"`` (decode rows and prefilled prompts in one forward pass)."""
        if not self.is_prefill:
            return "decode"
        return "mixed" if self.num_decode else "prefill"


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        one_prefill_per_step: bool = False,
        mixed_steps: bool = False,
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # Static-shape platforms prefill one request per step (its tokens padded to a bucket).
        self.one_prefill_per_step = one_prefill_per_step
        if mixed_steps and one_prefill_per_step:
            raise ValueError("mixed steps batch prompts with decode rows; a static-shape platform prefills one "
                             "request per step: turn one of them off")
        self.mixed_steps = mixed_steps
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        if self.mixed_steps:
            return self._schedule_mixed()
        prefill = self._schedule_prefill()
        if prefill:
            return SchedulerOutput(prefill, is_prefill=True, preempted=[])
        return self._schedule_decode()

    def _schedule_mixed(self) -> SchedulerOutput:
        """Every running request's decode token, then as many waiting prompts as the budgets let in."""
        decode = self._schedule_decode()
        if decode.preempted:
            return decode
        prefill = self._schedule_prefill(budget=self.max_num_batched_tokens - len(decode.seqs),
                                         first_may_exceed=False)
        if not prefill:
            return decode
        return SchedulerOutput(decode.seqs + prefill, is_prefill=True, preempted=[], num_decode=len(decode.seqs))

    def _schedule_prefill(self, budget: int | None = None, first_may_exceed: bool = True) -> list[Sequence]:
        """Admit waiting requests in order while ``max_num_seqs`` and the token ``budget`` allow (a prefill step
        of its own always takes its first request: ``max_num_batched_tokens`` holds a full-length prompt)."""
        budget = self.max_num_batched_tokens if budget is None else budget
        scheduled: list[Sequence] = []
        num_tokens = 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if (scheduled or not first_may_exceed) and (
                    self.one_prefill_per_step or num_tokens + len(seq) - seq.num_computed_tokens > budget):
                break
            if not self.block_manager.can_allocate(seq):
                break
            self.block_manager.allocate(seq)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(seq)
            num_tokens += len(seq) - seq.num_computed_tokens
        return scheduled

    def _schedule_decode(self) -> SchedulerOutput:
        scheduled: list[Sequence] = []
        preempted: list[Sequence] = []
        while self.running:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                victim = self.running.pop() if self.running else seq
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                self.block_manager.append_slot(seq)
                scheduled.append(seq)
        self.running.extend(scheduled)
        return SchedulerOutput(scheduled, is_prefill=False, preempted=preempted)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire `seq` (finished or aborted) wherever it is and give its blocks back."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.block_table:
            self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
