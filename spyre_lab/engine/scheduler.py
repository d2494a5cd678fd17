"""Continuous batching: each step is either a prefill of new requests or one decode token for all running ones.

Prefill goes first (new requests join as soon as there is room), bounded by `max_num_seqs` running
requests and `max_num_batched_tokens` per step. When a decode step needs a KV block and none is
free, the most recently started request is *preempted by recompute*: its blocks are freed and it
goes back to the front of the waiting queue with the tokens it has generated so far, to be prefilled
again later (prefix caching usually makes that cheap). Its output is the same as if it had never
been interrupted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from spyre_lab.engine.block_manager import BlockManager
from spyre_lab.engine.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    seqs: list[Sequence]
    is_prefill: bool
    preempted: list[Sequence]


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        one_prefill_per_step: bool = False,
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # Static-shape platforms prefill one request per step (its tokens padded to a bucket).
        self.one_prefill_per_step = one_prefill_per_step
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        prefill = self._schedule_prefill()
        if prefill:
            return SchedulerOutput(prefill, is_prefill=True, preempted=[])
        return self._schedule_decode()

    def _schedule_prefill(self) -> list[Sequence]:
        scheduled: list[Sequence] = []
        num_tokens = 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if scheduled and (self.one_prefill_per_step or num_tokens + len(seq) > self.max_num_batched_tokens):
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
