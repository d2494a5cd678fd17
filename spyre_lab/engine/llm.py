"""LLM: the offline entry point — give it prompts, get completions (vLLM's `LLM` API)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import torch
from tqdm.auto import tqdm

from spyre_lab.engine.llm_engine import LLMEngine, Prompt
from spyre_lab.engine.outputs import CompletionOutput, RequestOutput
from spyre_lab.engine.platforms.base import Platform
from spyre_lab.engine.sampling_params import SamplingParams
from spyre_lab.engine.stats import EngineStats


class LLM:
    """`LLM("tiny-granite")` or `LLM("/path/to/hf_folder", platform="cpu", ...)`.

    Further options go to LLMEngine: max_num_batched_tokens, enable_prefix_caching, static_shapes,
    prefill_buckets, batch_buckets.

    A request that cannot be served (invalid SamplingParams, prompt of max_model_len tokens or more)
    is not raised: `generate` returns it finished with finish_reason "error" and the reason in
    `RequestOutput.error`, and serves the others.
    """

    def __init__(
        self,
        model: str = "tiny-granite",
        platform: str | Platform = "cpu",
        max_num_seqs: int = 16,
        max_model_len: int | None = None,
        block_size: int = 16,
        num_kv_blocks: int | None = None,
        seed: int = 0,
        dtype: torch.dtype | str | None = None,
        **engine_options,
    ) -> None:
        self.llm_engine = LLMEngine(
            model, platform, max_num_seqs=max_num_seqs, max_model_len=max_model_len, block_size=block_size,
            num_kv_blocks=num_kv_blocks, seed=seed, dtype=dtype, **engine_options,
        )
        self._ids = itertools.count()

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
        finished: dict[str, RequestOutput] = {}
        request_ids = self._add(prompts, sampling_params, finished)
        with tqdm(total=len(request_ids), desc="generate", disable=not use_tqdm) as bar:
            bar.update(len(finished))
            while self.llm_engine.has_unfinished_requests():
                for output in self.llm_engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        bar.update(1)
        return [finished[request_id] for request_id in request_ids]

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[RequestOutput]:
        """Yield a RequestOutput each time a request advances (text so far), ending with finished ones."""
        rejected: dict[str, RequestOutput] = {}
        self._add(prompts, sampling_params, rejected)
        yield from rejected.values()
        yield from self.llm_engine.run_to_completion()

    def _add(self, prompts, sampling_params, rejected: dict[str, RequestOutput]) -> list[str]:
        prompts = _as_prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(f"got {len(prompts)} prompts but {len(params_list)} SamplingParams; give one or one "
                                 "per prompt")
        request_ids = []
        for prompt, params in zip(prompts, params_list):
            request_id = str(next(self._ids))
            request_ids.append(request_id)
            try:
                self.llm_engine.add_request(request_id, prompt, params)
            except ValueError as error:
                rejected[request_id] = RequestOutput(
                    request_id, prompt if isinstance(prompt, str) else None,
                    list(prompt) if isinstance(prompt, list) else [],
                    [CompletionOutput(0, "", [], finish_reason="error")], finished=True, error=str(error),
                )
        return request_ids


def _as_prompt_list(prompts) -> list[Prompt]:
    """One prompt (str, token-id list, dict) or a list of them -> a list of prompts."""
    if isinstance(prompts, str | dict):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]
    return prompts
