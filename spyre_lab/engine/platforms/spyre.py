"""The spyre platform: the model runs on torch.device("spyre") from spyre_lab.runtime, in fp16.

Importing this module imports the runtime; if that fails, only this platform is unavailable
(`resolve_platform("spyre")` reports why). Like the Spyre vLLM plugin it uses static shapes:
prompts padded to prefill buckets and decode batches to batch buckets, all run once by
`LLM.warmup()`. Scheduler, block tables, slot mapping and sampling stay on the host; weights,
KV cache and activations live on the device.

Each step's modeled time is the span of the modeled events the runtime records while the step
runs (host program correction, PCIe copies, kernels). Every aten op currently runs as its own
one-op program ("eager-ops"); compiling whole decoder blocks with `torch.compile(backend="spyre")`
is the next step for this platform.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import ClassVar

import torch

from spyre_lab.engine.platforms.base import DeviceTime, Platform
from spyre_lab.runtime.streams import recording, synchronize


class SpyrePlatform(Platform):
    name: ClassVar[str] = "spyre"
    device_type: ClassVar[str] = "spyre"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float16,)
    default_dtype: ClassVar[torch.dtype] = torch.float16
    dispatch_mode: ClassVar[str] = "eager-ops"

    def __init__(
        self,
        static_shapes: bool = True,
        prefill_buckets: Sequence[int] | None = None,
        batch_buckets: Sequence[int] | None = None,
    ) -> None:
        super().__init__(static_shapes, prefill_buckets, batch_buckets)

    @contextlib.contextmanager
    def device_timer(self, kind: str, num_tokens: int, batch: int) -> Iterator[DeviceTime]:
        timing = DeviceTime()
        with recording() as trace:
            yield timing
        timing.modeled_ms = trace.duration_us / 1e3 if len(trace) else 0.0

    def synchronize(self) -> None:
        synchronize()
