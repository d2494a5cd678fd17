"""LLMEngine: the step loop. add_request -> step() ... -> finished RequestOutputs.

One `step()` = schedule (prefill, decode, or both in one mixed step) -> run the model once -> append one token to every
scheduled request -> check stop conditions -> free what finished. Everything a request goes through
is recorded in `stats` (host times measured, device times modeled by the platform).

A failure inside a step fails only the requests it concerns: a row the sampler cannot sample fails
that request, a forward pass that raises fails the requests of that batch. Each ends with
finish_reason "error" and the reason in `RequestOutput.error`, its KV blocks are freed, and the
engine goes on serving the others.

Threads: `add_request`, `abort_request` and `step` take one lock, so requests may be added and
aborted from other threads while one thread steps (as a server does). An abort that arrives during a
step waits for that step to end, then applies.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from spyre_lab.engine.block_manager import BlockManager
from spyre_lab.engine.config import EngineConfig
from spyre_lab.engine.detokenizer import find_stop, update_text
from spyre_lab.engine.loader import load_model, read_config, resolve_model_path
from spyre_lab.engine.model_runner import ModelRunner, StepResult, supports_mixed_steps
from spyre_lab.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from spyre_lab.engine.parallel.launcher import TensorParallelError, TensorParallelRunner, TensorParallelWorkers
from spyre_lab.engine.platforms.registry import resolve_platform
from spyre_lab.engine.prompts import array_token_ids, is_array, is_token_id, refuse_bytes
from spyre_lab.engine.sampling_params import SamplingParams
from spyre_lab.engine.scheduler import Scheduler
from spyre_lab.engine.sequence import Sequence
from spyre_lab.engine.stats import EngineStats, RequestStats, StepStats
from spyre_lab.engine.tokenizer import load_tokenizer
from spyre_lab.heap import freeze_startup_heap

logger = logging.getLogger(__name__)

Prompt = str | list[int] | dict


class RequestError(ValueError):
    """A request the engine cannot serve, with what is known of its prompt (for the finished "error" output)."""

    def __init__(self, message: str, prompt: str | None = None, prompt_token_ids: list[int] | None = None,
                 decoded_prompt: str | None = None) -> None:
        super().__init__(message)
        self.prompt, self.prompt_token_ids, self.decoded_prompt = prompt, list(prompt_token_ids or []), decoded_prompt


class LLMEngine:
    """Step-level engine. `add_request` raises ValueError for a request it cannot serve (bad sampling
    parameters, prompt too long, unknown token ids); nothing else is ever dropped: every accepted
    request ends with finish_reason "stop", "length", "abort" or (a failure inside a step, the reason in
    `RequestOutput.error`) "error" in some `step()`'s outputs.

    `add_request`, `abort_request`, `step` and `warmup` are safe to call from several threads (one lock).

    `LLMEngine(model, **options)` with the options of :class:`EngineConfig`, or `LLMEngine(config)`.
    `self.config` is that config with every default filled in for the model.
    """

    freeze_heap_after_warmup = True
    """Freeze the startup heap after a warmup (:func:`spyre_lab.heap.freeze_startup_heap`); set False to leave the
    GC alone."""

    def __init__(self, model: str | os.PathLike | EngineConfig = "tiny-granite", **options: Any) -> None:
        config = EngineConfig.from_options(model, **options)
        self.platform = resolve_platform(config.platform, **config.platform_options)
        self.model_path = resolve_model_path(config.model)
        self.model_config = read_config(self.model_path)
        self.config = config = config.for_model(self.model_config, self.platform.default_dtype)
        self.dtype = config.dtype
        self.platform.check_dtype(self.dtype)
        self.max_model_len = config.max_model_len
        if self.platform.static_shapes:
            self.platform.configure_buckets(config.max_model_len, config.max_num_seqs)

        self.tensor_parallel: TensorParallelWorkers | None = None
        if config.tensor_parallel_size > 1:
            self.tensor_parallel = TensorParallelWorkers(config, config.distributed_timeout_s)
        try:
            self._build(config)
        except BaseException:
            self.shutdown()
            raise

    def _build(self, config: EngineConfig) -> None:
        """Model, tokenizer, scheduler and runner; with tensor parallelism, rank 0's shard of each weight."""
        group = self.tensor_parallel.group if self.tensor_parallel else None
        self.model = load_model(self.model_path, self.platform, self.dtype, group)
        eos = (self.model_config.eos_token_ids or (None,))[0]
        self.tokenizer = load_tokenizer(self.model_path, self.model_config.bos_token_id, eos)
        self.eos_token_ids = set(self.model_config.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)

        self.block_manager = BlockManager(config.num_kv_blocks, config.block_size, config.enable_prefix_caching)
        self.mixed_steps = self._mixed_steps(config)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   one_prefill_per_step=self.platform.static_shapes, mixed_steps=self.mixed_steps)
        self.runner = ModelRunner(self.model, self.platform, config.block_size, config.num_kv_blocks,
                                  config.max_model_len, self.dtype, config.seed)
        if self.tensor_parallel is not None:
            self.tensor_parallel.wait_ready(config.distributed_timeout_s)
            self.runner = TensorParallelRunner(self.runner, self.tensor_parallel)
        self.stats = EngineStats()
        self._created = time.perf_counter()
        self.requests: dict[str, Sequence] = {}
        self._prompts: dict[str, tuple[str | None, str | None]] = {}  # request id -> (text, decoded prompt)
        self._aborted: list[RequestOutput] = []
        self._lock = threading.RLock()  # one step, add or abort at a time

    def _mixed_steps(self, config: EngineConfig) -> bool:
        """``config.mixed_steps``, or (None) whether this platform runs them on one card; a ValueError when asked for
        on a platform that cannot."""
        capable = supports_mixed_steps(self.platform)
        if config.mixed_steps is None:
            return capable and config.tensor_parallel_size == 1
        if config.mixed_steps and not capable:
            raise ValueError(f"mixed_steps=True needs a platform whose attention runs prompts and decode rows in one "
                             f"pass (dynamic shapes, per-sequence attention), and {self.platform!r} does not; set "
                             "mixed_steps=False")
        return config.mixed_steps

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers and leave their group (nothing to do on one card); idempotent."""
        if getattr(self, "tensor_parallel", None) is not None:
            self.tensor_parallel.close()

    # ---- requests -------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None) -> None:
        """Queue a request; raise RequestError (a ValueError naming the problem) if it cannot be served."""
        text, token_ids = None, []
        try:
            text, token_ids = self._tokenize(prompt)
            with self._lock:
                self._check_request(request_id, token_ids, params)
                seq = Sequence(request_id, token_ids, params if params is not None else SamplingParams())
                self.requests[request_id] = seq
                self._prompts[request_id] = (text, self.decode_prompt(token_ids))
                self.scheduler.add(seq)
        except ValueError as error:
            raise RequestError(str(error), text, token_ids, self.decode_prompt(token_ids)) from error

    def _check_request(self, request_id: str, token_ids: list[int], params: SamplingParams | None) -> None:
        if params is not None and not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        if params is not None:
            params.validate()  # built valid, but a field may have been changed since
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not token_ids:
            raise ValueError("prompt is empty; give at least one token")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens but max_model_len is {self.max_model_len}; shorten the prompt "
                "or raise max_model_len"
            )
        bad = [t for t in token_ids if not 0 <= t < self.model_config.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.model_config.vocab_size})")

    def decode_prompt(self, token_ids: list[int]) -> str | None:
        """The prompt as the model receives it: its token ids decoded, special and unknown tokens shown."""
        if self.tokenizer is None or not token_ids:
            return None
        valid = [t for t in token_ids if 0 <= t < self.model_config.vocab_size]
        return self.tokenizer.decode(valid, skip_special_tokens=False)

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                prompt = list(prompt["prompt_token_ids"])
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError('a dict prompt needs "prompt" or "prompt_token_ids"')
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"{self.model_path} has no tokenizer.json; pass prompts as lists of token ids")
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, list | tuple) and all(is_token_id(t) for t in prompt):
            return None, [int(t) for t in prompt]
        try:
            refuse_bytes(prompt)
            if is_array(prompt):
                return None, array_token_ids(prompt, "a prompt")
        except TypeError as error:
            raise ValueError(str(error)) from None
        raise ValueError(f"a prompt must be a str, a list of token ids or a dict, got {type(prompt).__name__}")

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now; its final output (finish_reason "abort") comes from the next step()."""
        with self._lock:
            seq = self.requests.get(request_id)
            if seq is None or seq.is_finished:
                return False
            self.scheduler.finish(seq, "abort")
            self._retire(seq)
            self._aborted.append(self._output(seq))
            return True

    def reset_prefix_cache(self) -> int:
        """Forget the cached prefixes of every free block (vLLM's ``reset_prefix_cache``), so the next requests
        start cold, as on a fresh engine; blocks that running requests hold keep theirs. Returns the blocks cleared."""
        with self._lock:
            manager, cleared = self.block_manager, 0
            for block in manager.blocks:
                if block.ref_count == 0 and block.hash is not None:
                    manager.cached_blocks.pop(block.hash, None)
                    block.hash, block.token_ids = None, ()
                    cleared += 1
            return cleared

    def has_unfinished_requests(self) -> bool:
        with self._lock:
            return self.scheduler.has_unfinished() or bool(self._aborted)

    def get_num_unfinished_requests(self) -> int:
        with self._lock:
            return len(self.scheduler.waiting) + len(self.scheduler.running)

    # ---- the step ---------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; return an output for every request it advanced, finished, failed or aborted."""
        with self._lock:
            return self._step()

    def _step(self) -> list[RequestOutput]:
        outputs, self._aborted = self._aborted, []
        if not self.scheduler.has_unfinished():
            return outputs
        scheduled_at = time.perf_counter()
        scheduled = self.scheduler.schedule()
        schedule_ms = (time.perf_counter() - scheduled_at) * 1e3
        if not scheduled.seqs:  # everything running was preempted; the next step prefills again
            return outputs
        try:
            result = self.runner.run(scheduled.seqs, scheduled.is_prefill, scheduled.num_decode)
        except TensorParallelError:  # a card is gone: no later step can run, so the caller must know now
            raise
        except Exception as error:  # the forward pass concerns every request of the batch, and only those
            logger.exception("a %s step of %d request(s) failed; they finish with finish_reason 'error'",
                             scheduled.kind, len(scheduled.seqs))
            why = f"the model step failed: {type(error).__name__}: {error}"
            return outputs + [self._fail(seq, why) for seq in scheduled.seqs]
        kv = self.block_manager.snapshot(list(self.scheduler.running))
        for row, (seq, token_id) in enumerate(zip(scheduled.seqs, result.token_ids)):
            failure = result.failures.get(row)
            if failure is None:
                try:
                    self._advance(seq, token_id)
                except Exception as error:  # one request's bookkeeping must not stop the others
                    logger.exception("request %r failed after its step", seq.request_id)
                    failure = f"{type(error).__name__}: {error}"
            if failure is not None:
                outputs.append(self._fail(seq, failure))
                continue
            if seq.is_finished:
                self._retire(seq)
            outputs.append(self._output(seq))
        row = self._record_step(scheduled.kind, scheduled.seqs, result, len(scheduled.preempted))
        self.stats.record_detail(row.step, schedule_ms, scheduled.seqs, scheduled.preempted,
                                 result, kv, scheduled.is_prefill, num_decode=scheduled.num_decode)
        return outputs

    def _advance(self, seq: Sequence, token_id: int) -> None:
        """``seq`` computed its tokens and sampled ``token_id``: commit its full blocks, append, check the stops."""
        seq.num_computed_tokens = len(seq)
        self.block_manager.commit(seq)
        seq.append_token(token_id)
        self._check_stop(seq, token_id)

    def _fail(self, seq: Sequence, why: str) -> RequestOutput:
        """Finish ``seq`` with finish_reason "error" (``why`` in its output's ``error``) and free its blocks."""
        if not seq.is_finished:
            seq.error = why
            self.scheduler.finish(seq, "error")
            self._retire(seq)
        return self._output(seq)

    def _check_stop(self, seq: Sequence, token_id: int) -> None:
        params = seq.sampling_params
        if self.tokenizer is not None:
            update_text(self.tokenizer, seq)           # as decoding all output tokens, one token's work
        if not params.ignore_eos and token_id in self.eos_token_ids:
            return self.scheduler.finish(seq, "stop")
        if token_id in params.stop_token_ids:
            seq.stop_reason = token_id
            return self.scheduler.finish(seq, "stop")
        found = find_stop(seq) if params.stop else None    # the first stop string in the text, searched anew only
        if found is not None:                              # where new text could complete one
            cut, seq.stop_reason = found
            seq.output_text = seq.output_text[:cut]
            return self.scheduler.finish(seq, "stop")
        if len(seq.output_token_ids) >= params.max_tokens or len(seq) >= self.max_model_len:
            return self.scheduler.finish(seq, "length")
        return None

    def _retire(self, seq: Sequence) -> None:
        seq.finished_time = time.perf_counter()
        metrics = self._metrics(seq)
        self.stats.requests.append(RequestStats(
            seq.request_id, len(seq.prompt_token_ids), len(seq.output_token_ids), seq.finish_reason,
            metrics.ttft_ms, metrics.tpot_ms, metrics.e2e_ms, seq.num_preemptions, seq.num_cached_tokens,
        ))
        del self.requests[seq.request_id]

    def _metrics(self, seq: Sequence) -> RequestMetrics:
        ms = lambda a, b: None if a is None or b is None else (b - a) * 1e3
        n = len(seq.output_token_ids)
        decode_ms = ms(seq.first_token_time, seq.finished_time)
        return RequestMetrics(
            ttft_ms=ms(seq.arrival_time, seq.first_token_time),
            tpot_ms=decode_ms / (n - 1) if decode_ms is not None and n > 1 else None,
            e2e_ms=ms(seq.arrival_time, seq.finished_time),
            num_preemptions=seq.num_preemptions,
            num_cached_tokens=seq.num_cached_tokens,
        )

    def _output(self, seq: Sequence) -> RequestOutput:
        completion = CompletionOutput(0, seq.output_text, list(seq.output_token_ids), seq.finish_reason,
                                      seq.stop_reason)
        prompts = self._prompts.pop if seq.is_finished else self._prompts.get
        prompt, decoded = prompts(seq.request_id, None) or (None, None)
        return RequestOutput(seq.request_id, prompt, list(seq.prompt_token_ids), [completion], seq.is_finished,
                             self._metrics(seq), error=seq.error, decoded_prompt=decoded)

    def _record_step(self, kind: str, seqs: list[Sequence], result: StepResult, num_preempted: int) -> StepStats:
        bucket = result.bucket
        row = StepStats(
            step=self.stats.next_step,
            kind=kind,
            num_seqs=len(seqs),
            batch_bucket=bucket[1] if bucket and bucket[0] == "decode" else None,
            token_bucket=bucket[1] if bucket and bucket[0] == "prefill" else None,
            num_tokens=result.num_tokens,
            padded_tokens=result.padded_tokens,
            host_ms=result.host_ms,
            device_ms_modeled=result.device_ms_modeled,
            kv_blocks_used=self.block_manager.num_used_blocks,
            dispatch=self.platform.dispatch_mode + ("+on-demand" if result.on_demand else ""),
            num_preempted=num_preempted,
            start_ms=(result.start - self._created) * 1e3,
        )
        self.stats.steps.append(row)
        return row

    def warmup(self, show_progress: bool = True) -> None:
        """Run every shape bucket once (static-shape platforms); a no-op with dynamic shapes. After a warmup
        that compiled something, the startup heap is frozen (:func:`spyre_lab.heap.freeze_startup_heap`)."""
        with self._lock:
            self._warmup(show_progress)

    def _warmup(self, show_progress: bool) -> None:
        warmed = False
        for (kind, size), start, host_ms, device_ms in self.runner.warmup(show_progress):
            warmed = True
            self.stats.steps.append(StepStats(
                self.stats.next_step, f"warmup-{kind}", 0, size if kind == "decode" else None,
                size if kind == "prefill" else None, 0, size, host_ms, device_ms,
                self.block_manager.num_used_blocks, self.platform.dispatch_mode,
                start_ms=(start - self._created) * 1e3,
            ))
        if warmed and self.freeze_heap_after_warmup:
            freeze_startup_heap()

    def run_to_completion(self) -> Iterable[RequestOutput]:
        """Step until every request is done, yielding each step's outputs as they come (streaming)."""
        while self.has_unfinished_requests():
            yield from self.step()

