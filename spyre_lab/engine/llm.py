"""LLM: the offline entry point — give it prompts, get completions (vLLM's `LLM` API)."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from tqdm.auto import tqdm

from spyre_lab.engine.config import EngineConfig
from spyre_lab.engine.llm_engine import LLMEngine, Prompt, RequestError
from spyre_lab.engine.outputs import CompletionOutput, RequestOutput
from spyre_lab.engine.prompts import array_token_ids, is_array, is_token_id, refuse_bytes
from spyre_lab.engine.sampling_params import SamplingParams
from spyre_lab.engine.stats import EngineStats


class LLM:
    """`LLM("tiny-granite")` or `LLM("/path/to/hf_folder", platform="cpu", max_model_len=512, ...)`.

    The options are the fields of :class:`~spyre_lab.engine.config.EngineConfig` (platform, max_num_seqs,
    max_model_len, block_size, num_kv_blocks, max_num_batched_tokens, seed, dtype, enable_prefix_caching,
    static_shapes, prefill_buckets, batch_buckets, tensor_parallel_size, distributed_timeout_s, mixed_steps);
    `LLM(config)` takes a whole EngineConfig. With ``tensor_parallel_size > 1`` it starts worker processes: `close()`
    it (or use it in a ``with`` block) to stop them.

    A request that cannot be served (invalid SamplingParams, prompt of max_model_len tokens or more)
    is not raised: `generate` returns it finished with finish_reason "error" and the reason in
    `RequestOutput.error`, and serves the others; so is a request that fails inside a step. Arguments of
    the wrong type (`generate(5)`, `generate(b"abc")`) raise TypeError.

    Prompts: a str, a list of token ids (a 1-D integer numpy array or torch tensor counts as one), a dict with
    "prompt" or "prompt_token_ids", or a list of these (a 2-D integer array: one prompt per row).

    `generate` and `stream` serve one caller at a time (each collects the outputs of every request the engine
    steps); a second thread calling in while one runs gets a RuntimeError. To serve from several threads, add
    and abort requests on `llm.llm_engine` (thread-safe) and step it from one thread.
    """

    def __init__(self, model: str | os.PathLike | EngineConfig = "tiny-granite", **options: Any) -> None:
        self.llm_engine = LLMEngine(EngineConfig.from_options(model, **options))
        self._ids = itertools.count()
        self._serving = threading.Lock()  # held while generate() or stream() steps the engine

    def close(self) -> None:
        """Stop the tensor-parallel workers (``tensor_parallel_size > 1``) and leave their process group."""
        self.llm_engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def config(self) -> EngineConfig:
        """The engine's config, every default filled in for the model."""
        return self.llm_engine.config

    @property
    def stats(self) -> EngineStats:
        return self.llm_engine.stats

    @property
    def tokenizer(self):
        return self.llm_engine.tokenizer

    def warmup(self, show_progress: bool = True) -> None:
        self.llm_engine.warmup(show_progress)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Complete every prompt; outputs come back in prompt order."""
        with self._serve():
            finished: dict[str, RequestOutput] = {}
            request_ids = self._add(prompts, sampling_params, finished)
            try:
                with tqdm(total=len(request_ids), desc="generate", disable=not use_tqdm) as bar:
                    bar.update(len(finished))
                    while self.llm_engine.has_unfinished_requests():
                        for output in self.llm_engine.step():
                            if output.finished:
                                finished[output.request_id] = output
                                bar.update(1)
            finally:
                self._abort_unfinished(request_ids, finished)
            return [finished[request_id] for request_id in request_ids]

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[RequestOutput]:
        """Yield a RequestOutput each time a request advances (text so far), ending with finished ones."""
        with self._serve():
            rejected: dict[str, RequestOutput] = {}
            request_ids = self._add(prompts, sampling_params, rejected)
            try:
                yield from rejected.values()
                yield from self.llm_engine.run_to_completion()
            finally:  # a consumer that stops early (or an error) leaves nothing running in the engine
                self._abort_unfinished(request_ids, {})

    @contextlib.contextmanager
    def _serve(self) -> Iterator[None]:
        """Hold the serving lock; a RuntimeError naming the fix when another thread holds it."""
        if not self._serving.acquire(blocking=False):
            raise RuntimeError("LLM.generate/stream is already running in another thread (it collects the outputs "
                               "of every request the engine steps); call it from one thread at a time, or add and "
                               "abort requests on llm.llm_engine from any thread while one thread calls step()")
        try:
            yield
        finally:
            self._serving.release()

    def _abort_unfinished(self, request_ids: list[str], finished: dict[str, RequestOutput]) -> None:
        """Abort what an interrupted generate/stream left in the engine, so the next call does not run it."""
        for request_id in request_ids:
            if request_id not in finished:
                self.llm_engine.abort_request(request_id)

    def _add(self, prompts, sampling_params, rejected: dict[str, RequestOutput]) -> list[str]:
        prompts = _as_prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        elif isinstance(sampling_params, Sequence) and not isinstance(sampling_params, str):
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(f"got {len(prompts)} prompts but {len(params_list)} SamplingParams; give one or one "
                                 "per prompt")
        else:
            raise TypeError(f"sampling_params must be a SamplingParams, a list of them (one per prompt) or None, got "
                            f"{type(sampling_params).__name__} {sampling_params!r}")
        request_ids = []
        for prompt, params in zip(prompts, params_list):
            request_id = str(next(self._ids))
            request_ids.append(request_id)
            try:
                self.llm_engine.add_request(request_id, prompt, params)
            except RequestError as error:
                rejected[request_id] = RequestOutput(
                    request_id, error.prompt if error.prompt is not None else prompt if isinstance(prompt, str)
                    else None, error.prompt_token_ids, [CompletionOutput(0, "", [], finish_reason="error")],
                    finished=True, error=str(error), decoded_prompt=error.decoded_prompt,
                )
        return request_ids


def _as_prompt_list(prompts: Any) -> list[Prompt]:
    """One prompt (str, token-id list, dict) or a list of them -> a list of prompts; anything else is a TypeError.

    An integer array (numpy or torch) is token ids: 1-D is one prompt, 2-D one prompt per row (not one prompt
    per element, as iterating it would give). Bytes are refused: iterating them gives ints, which would pass
    for token ids."""
    if isinstance(prompts, str | dict):
        return [prompts]
    refuse_bytes(prompts)
    if is_array(prompts):
        rows = array_token_ids(prompts, "prompts", max_dims=2)
        return rows if rows and isinstance(rows[0], list) else [rows]
    if not isinstance(prompts, Iterable):
        raise TypeError(f"prompts must be a str, a list of token ids, a dict with 'prompt' or 'prompt_token_ids', or "
                        f"a list of these; got {type(prompts).__name__} {prompts!r}")
    prompts = list(prompts)
    if prompts and all(is_token_id(t) for t in prompts):
        return [[int(t) for t in prompts]]
    return prompts
