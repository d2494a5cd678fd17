"""EngineConfig: every engine option in one dataclass, checked in one place (vLLM's EngineArgs, nano-vllm's Config).

``LLM(model, **options)`` and ``LLMEngine(model, **options)`` both build one; so can you, and pass it
whole (``LLMEngine(EngineConfig("tiny-granite", max_model_len=64))``). Checks come in two steps:

1. on construction, each field alone: its type and range (``max_num_seqs=0`` fails here, before any
   model is read);
2. :meth:`EngineConfig.for_model`, once the model's config.json is read: the fields that depend on the
   model (``max_model_len`` against its ``max_position_embeddings``) and on each other (enough KV
   blocks for one full-length sequence, a batch budget that fits a full-length prompt). It returns a
   copy with every ``None`` default filled in, so the engine reads one complete config.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from spyre_lab.engine.models.config import ModelConfig
    from spyre_lab.engine.platforms.base import Platform

DEFAULT_MAX_MODEL_LEN = 2048
"""Used when the model allows more and ``max_model_len`` is not given (keeps the default KV cache small)."""
TENSOR_PARALLEL_PLATFORMS = ("cpu", "spyre")
"""Platforms (by name) a model can be split across cards on: the cpu one over gloo, spyre over spyreccl."""


@dataclass(frozen=True)
class EngineConfig:
    """What an engine serves and how. ``None`` means "derive it": from the model (``max_model_len``), from
    the other fields (``num_kv_blocks``, ``max_num_batched_tokens``) or from the platform (``dtype``,
    ``static_shapes``, the buckets)."""

    model: str | os.PathLike = "tiny-granite"  # an embedded model name or a local Hugging Face folder
    platform: str | Platform = "cpu"  # a registered platform name or a Platform instance
    max_num_seqs: int = 16  # requests batched in one decode step
    max_model_len: int | None = None  # prompt + output tokens of one request (default: the model's, <= 2048)
    block_size: int = 16  # tokens per KV-cache block
    num_kv_blocks: int | None = None  # KV-cache blocks (default: every sequence at full length, as the Spyre plugin)
    max_num_batched_tokens: int | None = None  # tokens in one step (default: max(max_model_len, 2048))
    seed: int = 0  # sampler seed for requests without their own
    dtype: torch.dtype | str | None = None  # weights and activations (default: the platform's)
    enable_prefix_caching: bool = True  # reuse KV blocks of shared prompt prefixes
    static_shapes: bool | None = None  # pad every step to a bucket (default: the platform's)
    prefill_buckets: list[int] | None = None  # token buckets of prefill steps (static shapes)
    batch_buckets: list[int] | None = None  # batch buckets of decode steps (static shapes)
    tensor_parallel_size: int = 1  # cards the model is split across, one worker process each (cpu, spyre)
    distributed_timeout_s: float = 60.0  # longest wait for a rendezvous, a collective or a worker's answer
    # prompts join the running decode rows in one forward pass (vLLM v1's scheduling) instead of steps of their own
    # (default: on where the platform's attention runs them, `model_runner.supports_mixed_steps`: the cpu platform
    # with dynamic shapes on one card; the spyre platform prefills apart, as the real stack does)
    mixed_steps: bool | None = None

    def __post_init__(self) -> None:
        from spyre_lab.engine.platforms.base import Platform

        if not isinstance(self.model, str | os.PathLike):
            raise TypeError(f"model must be an embedded model name such as 'tiny-granite' or the path of a local "
                            f"folder with config.json, got {type(self.model).__name__} {self.model!r}")
        if not isinstance(self.platform, str | Platform):
            raise TypeError(f"platform must be a platform name ('cpu', 'spyre', ...) or a Platform instance, got "
                            f"{type(self.platform).__name__} {self.platform!r}")
        _positive_int("max_num_seqs", self.max_num_seqs)
        _positive_int("block_size", self.block_size)
        _positive_int("num_kv_blocks", self.num_kv_blocks, optional=True)
        _positive_int("max_num_batched_tokens", self.max_num_batched_tokens, optional=True)
        _positive_int("max_model_len", self.max_model_len, optional=True, least=2)
        _positive_int("tensor_parallel_size", self.tensor_parallel_size)
        if self.tensor_parallel_size > 1 and self.platform not in TENSOR_PARALLEL_PLATFORMS:
            raise ValueError(f"tensor_parallel_size={self.tensor_parallel_size} runs on the platforms "
                             f"{TENSOR_PARALLEL_PLATFORMS} (by name), got platform={self.platform!r}; use one of them "
                             "or tensor_parallel_size=1")
        if not isinstance(self.distributed_timeout_s, int | float) or not self.distributed_timeout_s > 0:
            raise ValueError(f"distributed_timeout_s must be a positive number of seconds, got "
                             f"{self.distributed_timeout_s!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise TypeError(f"seed must be an int, got {type(self.seed).__name__} {self.seed!r}")
        for name in ("enable_prefix_caching", "static_shapes", "mixed_steps"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (value is None and name != "enable_prefix_caching"):
                raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
        for name in ("prefill_buckets", "batch_buckets"):
            buckets = getattr(self, name)
            if buckets is None:
                continue
            if isinstance(buckets, int | str) or not all(isinstance(b, int) and b > 0 for b in buckets):
                raise ValueError(f"{name} must be a list of positive ints (e.g. [64, 128]), got {buckets!r}")
            object.__setattr__(self, name, sorted(set(buckets)))
        if self.dtype is not None:
            object.__setattr__(self, "dtype", as_dtype(self.dtype))
        if self.mixed_steps and self.tensor_parallel_size > 1:
            raise ValueError("mixed_steps=True runs on one card; set mixed_steps=False (or leave it None) with "
                             f"tensor_parallel_size={self.tensor_parallel_size}")

    @classmethod
    def from_options(cls, model: Any = "tiny-granite", **options: Any) -> EngineConfig:
        """``EngineConfig`` from keyword options, naming any that do not exist (a typo fails loudly)."""
        if isinstance(model, EngineConfig):
            return model.replace(**options) if options else model
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; the options are {sorted(known - {'model'})}")
        return cls(model, **options)

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    @property
    def platform_options(self) -> dict[str, Any]:
        """The fields a platform name is resolved with (only those given)."""
        options = dict(static_shapes=self.static_shapes, prefill_buckets=self.prefill_buckets,
                       batch_buckets=self.batch_buckets)
        return {k: v for k, v in options.items() if v is not None}

    def for_model(self, model_config: ModelConfig, default_dtype: torch.dtype) -> EngineConfig:
        """This config with every derived field filled in for ``model_config``; a ValueError names the field."""
        limit = model_config.max_position_embeddings
        max_model_len = self.max_model_len or min(limit, DEFAULT_MAX_MODEL_LEN)
        if not 1 < max_model_len <= limit:
            raise ValueError(f"max_model_len must be in [2, {limit}] (the model's max_position_embeddings), "
                             f"got {max_model_len}")
        blocks_per_seq = math.ceil(max_model_len / self.block_size)
        num_kv_blocks = self.num_kv_blocks or self.max_num_seqs * blocks_per_seq
        if num_kv_blocks < blocks_per_seq:
            raise ValueError(f"num_kv_blocks={num_kv_blocks} cannot hold one sequence of max_model_len={max_model_len} "
                             f"({blocks_per_seq} blocks of {self.block_size}); raise num_kv_blocks or lower "
                             "max_model_len")
        max_num_batched_tokens = self.max_num_batched_tokens or max(max_model_len, DEFAULT_MAX_MODEL_LEN)
        if max_num_batched_tokens < max_model_len:
            raise ValueError(f"max_num_batched_tokens={max_num_batched_tokens} < max_model_len={max_model_len}: a "
                             "full-length prompt could never be prefilled (no chunked prefill); raise it")
        _check_tensor_parallel(self.tensor_parallel_size, model_config, self.dtype or default_dtype)
        return self.replace(max_model_len=max_model_len, num_kv_blocks=num_kv_blocks,
                            max_num_batched_tokens=max_num_batched_tokens, dtype=self.dtype or default_dtype)


def _check_tensor_parallel(size: int, model: ModelConfig, dtype: torch.dtype) -> None:
    """The model splits evenly across ``size`` cards and its dtype can be reduced by gloo; a ValueError else."""
    if size == 1:
        return
    if dtype == torch.bfloat16:
        raise ValueError("tensor_parallel_size > 1 reduces activations with gloo, which has no bfloat16 sum; use "
                         "dtype='float32' or 'float16'")
    kv = model.num_key_value_heads
    for name, value in (("num_attention_heads", model.num_attention_heads),
                        ("intermediate_size", model.intermediate_size)):
        if value % size:
            raise ValueError(f"the model's {name}={value} does not split across tensor_parallel_size={size}; "
                             "choose a size that divides it")
    if kv % size and size % kv:
        raise ValueError(f"the model's {kv} KV heads neither split across nor replicate onto tensor_parallel_size="
                         f"{size}; choose a size that divides it or is a multiple of it")


def _positive_int(name: str, value: Any, optional: bool = False, least: int = 1) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int{' or None' if optional else ''}, got {type(value).__name__} {value!r}")
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from a dtype or its name ('float16', 'torch.bfloat16')."""
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'float16' or 'bfloat16'")
    return resolved
