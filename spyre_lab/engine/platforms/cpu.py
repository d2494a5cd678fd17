"""The cpu platform: plain torch on the host, every layer in its `forward_native` form.

It is the reference every other platform is compared with. `static_shapes=True` turns on the
bucketed-shape policy the spyre platform needs, so that policy can be learned and tested here.
"""

from __future__ import annotations

from typing import ClassVar

from spyre_lab.engine.platforms.base import Platform


class CpuPlatform(Platform):
    name: ClassVar[str] = "cpu"
    device_type: ClassVar[str] = "cpu"
    dispatch_mode: str = "eager"
    decode_key_mask: bool = True
    per_sequence_attention: bool = True
    decode_rows: bool = True
