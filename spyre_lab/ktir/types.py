"""KTIR types (``tensor<1x64xf16>``, ``memref<...>``, ``!ktdp.access_tile<8x32xindex>``, ``f16``) -> shape, dtype."""

from __future__ import annotations

import re

import torch

from spyre_lab.compiler.ktir_writer import NAMES, type_text
from spyre_lab.ktir.errors import KTIRUnsupported

DTYPES: dict[str, torch.dtype] = {
    "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64,
    "i1": torch.bool, "i8": torch.int8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64,
    "index": torch.int64,
}
__all__ = ["DTYPES", "NAMES", "scalar", "shaped", "type_text"]


def shaped(text: str, line: int) -> tuple[tuple[int, ...], torch.dtype]:
    """``tensor<4x64xf16>`` / ``memref<...>`` / ``!ktdp.access_tile<...>`` -> ((4, 64), float16)."""
    if "<" not in text:
        return (), scalar(text, line)
    inner = text[text.index("<") + 1:text.rindex(">")]
    body = inner.split(",")[0].strip()
    m = re.fullmatch(r"((?:[0-9?]+x)*)([a-z0-9]+)", body)
    if m is None:
        raise KTIRUnsupported(text, line, "only plain static shapes are modeled")
    parts = [p for p in m.group(1).split("x") if p]
    if "?" in parts:
        raise KTIRUnsupported(text, line, "dynamic sizes (?) are not modeled; give static sizes")
    return tuple(int(p) for p in parts), scalar(m.group(2), line)


def scalar(text: str, line: int) -> torch.dtype:
    if text not in DTYPES:
        raise KTIRUnsupported(text, line, f"element types are {sorted(DTYPES)}")
    return DTYPES[text]

