"""Platform: what the engine asks of a hardware platform (device, dtypes, layer overrides, shapes).

A platform is the only place that knows about a device. The model code in `engine/models` and
`engine/layers` never asks "which platform am I on?"; instead the platform registers
out-of-tree (OOT) replacements for layers (`register_oot`), and `CustomOp` picks them up when the
model is built under `set_current_platform`. This mirrors vLLM's `Platform` + `CustomOp.register_oot`.
Platforms import layers, never the reverse. How a platform is found by name: `registry.py`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from spyre_lab.engine.layers.custom_op import layer_overrides

if TYPE_CHECKING:
    from torch import nn

def default_prefill_buckets(max_model_len: int, smallest: int = 64) -> tuple[int, ...]:
    """Powers of two from `smallest` up to (and always including) max_model_len."""
    buckets, size = [], smallest
    while size < max_model_len:
        buckets.append(size)
        size *= 2
    buckets.append(max_model_len)
    return tuple(buckets)


def default_batch_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """Powers of two from 1 up to (and always including) max_num_seqs."""
    buckets, size = [], 1
    while size < max_num_seqs:
        buckets.append(size)
        size *= 2
    buckets.append(max_num_seqs)
    return tuple(buckets)


@dataclass
class DeviceTime:
    """Modeled device time of one step, filled in by the platform; None = no device model."""

    modeled_ms: float | None = None
    trace: object | None = None  # the step's modeled events (a device Trace), when the platform records them


class Platform:
    """Base class: a device, the dtypes it runs, its layer overrides and its shape policy.

    `static_shapes=True` means every model call must use a shape that was prepared ahead of time
    (as on Spyre, where each shape is a compiled program): prompts are padded to a prefill bucket,
    decode batches to a batch bucket, and `LLM.warmup()` runs each bucket once up front.
    """

    name: ClassVar[str] = "base"
    device_type: ClassVar[str] = "cpu"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    default_dtype: ClassVar[torch.dtype] = torch.float32
    #: what a model call is, as shown in step stats ("eager", "piecewise-compiled", ...); may differ per instance
    dispatch_mode: str = "eager"
    #: its attention bounds its loops by each sequence's (keys, queries), read from ``AttentionMetadata.seq_query_lens``
    #: (a paged-attention kernel); the model runner builds and copies that tensor only for such a platform
    needs_seq_query_lens: bool = False
    #: its attention reads the additive mask ``AttentionMetadata.attn_bias`` (attention over gathered pages, as in
    #: ``layers.attention``); a platform whose attention bounds its loops by ``seq_query_lens`` instead sets False,
    #: and the model runner neither builds nor copies the mask
    needs_attn_bias: bool = True
    #: its attention takes a decode step's boolean key mask (``AttentionMetadata.key_mask``, keys each sequence's
    #: context covers) instead of the additive mask: ``layers.attention``'s decode path; the model runner then builds
    #: that [B, 1, 1, L] mask for decode steps and no [B, 1, Q, L] float mask
    decode_key_mask: bool = False
    #: its prefill attention reads only the keys each sequence owns when shapes are dynamic
    #: (``layers.attention_spans``): the model runner then builds per-sequence spans and no [B, 1, Q, L] mask
    per_sequence_attention: bool = False
    #: its decode attention keeps each sequence's keys in a row from step to step when shapes are dynamic
    #: (``layers.decode_rows``): the model runner then plans the rows and no block table is gathered
    decode_rows: bool = False

    def __init__(
        self,
        static_shapes: bool = False,
        prefill_buckets: Sequence[int] | None = None,
        batch_buckets: Sequence[int] | None = None,
    ) -> None:
        self.static_shapes = static_shapes
        self.prefill_buckets = tuple(sorted(prefill_buckets)) if prefill_buckets else None
        self.batch_buckets = tuple(sorted(batch_buckets)) if batch_buckets else None
        self.oot_ops: dict[str, type] = {}
        self.register_ops()

    # ---- hooks a platform overrides -------------------------------------------------------
    def register_ops(self) -> None:
        """Register layer replacements with `self.register_oot(...)`. Default: none."""

    def sharded_layers(self, sharded: Mapping[str, type]) -> dict[str, type]:
        """The layers a tensor-parallel rank's model is built with here: the portable sharded forms ``sharded``,
        with this platform's own form of each where it replaces the single-card layer too (a form that keeps the
        platform's form as a base class). Default: ``sharded`` as it is."""
        return dict(sharded)

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Last step of loading (e.g. move to device, compile decoder blocks). Default: identity."""
        return model

    def run_model(self, model: nn.Module, *inputs: object) -> torch.Tensor:
        """One forward of the loaded model on a step's inputs. Default: call it; a compiling platform may call
        its compiled code more directly (`spyre.SpyrePlatform`)."""
        return model(*inputs)

    def modeled_device_ms(self, kind: str, num_tokens: int, batch: int) -> float | None:
        """Modeled device time of one model step, or None when the platform has no device model."""
        return None

    @contextlib.contextmanager
    def device_timer(self, kind: str, num_tokens: int, batch: int) -> Iterator[DeviceTime]:
        """Wraps one model step. The default asks `modeled_device_ms`; a platform with a simulator
        can instead record the step's modeled events and set `modeled_ms` when the block ends."""
        yield DeviceTime(self.modeled_device_ms(kind, num_tokens, batch))

    def synchronize(self) -> None:
        """Wait for queued device work (nothing to wait for on a synchronous platform)."""

    # ---- shared machinery -----------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return torch.device(self.device_type)

    def register_oot(self, op_name: str, op_class: type) -> None:
        """Use `op_class` wherever a model builds the CustomOp named `op_name` on this platform."""
        self.oot_ops[op_name] = op_class

    def check_dtype(self, dtype: torch.dtype) -> None:
        if dtype not in self.supported_dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in self.supported_dtypes)
            raise ValueError(f"platform {self.name!r} does not run dtype {dtype}; choose one of: {names}")

    def configure_buckets(self, max_model_len: int, max_num_seqs: int) -> None:
        """Fill in default buckets and check user-given ones against the engine limits."""
        if self.prefill_buckets is None:
            self.prefill_buckets = default_prefill_buckets(max_model_len)
        if self.batch_buckets is None:
            self.batch_buckets = default_batch_buckets(max_num_seqs)
        if self.prefill_buckets[-1] < max_model_len:
            raise ValueError(
                f"largest prefill bucket {self.prefill_buckets[-1]} < max_model_len {max_model_len}; "
                f"add a bucket of {max_model_len} or lower max_model_len"
            )
        if self.batch_buckets[-1] < max_num_seqs:
            raise ValueError(
                f"largest batch bucket {self.batch_buckets[-1]} < max_num_seqs {max_num_seqs}; "
                f"add a bucket of {max_num_seqs} or lower max_num_seqs"
            )

    def __repr__(self) -> str:
        shapes = "static" if self.static_shapes else "dynamic"
        return f"{type(self).__name__}(name={self.name!r}, shapes={shapes}, oot_ops={sorted(self.oot_ops)})"


# ---- the current platform, seen by CustomOp while a model is being built ----------------------
_current: Platform | None = None


def current_platform() -> Platform | None:
    return _current


@contextlib.contextmanager
def set_current_platform(platform: Platform) -> Iterator[Platform]:
    """Build models inside this block so their CustomOps resolve this platform's overrides."""
    global _current
    previous, _current = _current, platform
    try:
        with layer_overrides(f"platform {platform.name!r}", platform.oot_ops):
            yield platform
    finally:
        _current = previous
