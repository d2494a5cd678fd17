"""``tensor.extract_slice``: a static-sized window of a tensor in LX at offsets that may be index values.

A cat along a dim the plan splits or tiles joins its pieces whole in LX, and each core takes its own tile of
the result at its tile's offset (``tensor.extract_slice %cat[0, %d1_i] [10, 64] [1, 1]``). The window is read
in place by the next op, so it is free, as a reshape is; strides other than 1 and a window that runs past
the source are refused by line.
"""

from __future__ import annotations

import math
from typing import Any

from spyre_lab.ktir.errors import KTIRUnsupported
from spyre_lab.ktir.syntax import Op
from spyre_lab.ktir.types import shaped
from spyre_lab.ktir.values import TVal

Core = Any  # spyre_lab.ktir.interpret.Core, which imports this module


def _groups(op: Op) -> list[list[str]]:
    """The three bracketed lists after the source: offsets, sizes, strides (entries as their token text)."""
    groups: list[list[str]] = []
    current: list[str] | None = None
    for t in op.body[1:]:
        if t.text == "[":
            current = []
        elif t.text == "]" and current is not None:
            groups.append(current)
            current = None
        elif current is not None and t.text != ",":
            current.append(t.text)
        elif t.text == ":":
            break
    if len(groups) != 3:
        raise KTIRUnsupported(op.name, op.line, "needs %src[offsets] [sizes] [strides]")
    return groups


def extract_slice(core: Core, op: Op) -> TVal:
    if not op.body or op.body[0].kind != "value":
        raise KTIRUnsupported(op.name, op.line, "needs a source value")
    src = core.get(op.body[0].text, op)
    if not isinstance(src, TVal):
        raise KTIRUnsupported(op.name, op.line, f"{op.body[0].text} is not a tensor")
    offsets_text, sizes_text, strides_text = _groups(op)
    offsets = [core.get(o, op) if o.startswith("%") else _int(o, op) for o in offsets_text]
    sizes, strides = [_int(s, op) for s in sizes_text], [_int(s, op) for s in strides_text]
    if not (len(offsets) == len(sizes) == len(strides) == src.t.dim()):
        raise KTIRUnsupported(op.name, op.line, f"offsets, sizes and strides must each give {src.t.dim()} entries")
    if any(s != 1 for s in strides) or not all(isinstance(o, int) for o in offsets):
        raise KTIRUnsupported(op.name, op.line, "strides other than 1 and non-index offsets are not modeled")
    for dim, (o, s, n) in enumerate(zip(offsets, sizes, src.t.shape)):
        if o < 0 or o + s > n:
            raise KTIRUnsupported(op.name, op.line, f"the window [{o}, {o + s}) of dim {dim} runs past its {n}")
    window = src.t[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]
    shape, _ = shaped(op_result_type(op), op.line)
    if math.prod(shape) != window.numel() or [n for n in shape if n != 1] != [n for n in sizes if n != 1]:
        raise KTIRUnsupported(op.name, op.line, f"result type {list(shape)} does not hold the window {sizes}")
    return TVal(window.reshape(shape).contiguous(), src.deps)


def op_result_type(op: Op) -> str:
    after = [t.text for t in op.body]
    if "to" not in after:
        raise KTIRUnsupported(op.name, op.line, "needs ': source type to result type'")
    return after[after.index("to") + 1]


def _int(text: str, op: Op) -> int:
    try:
        return int(text)
    except ValueError as e:
        raise KTIRUnsupported(op.name, op.line, f"{text!r} is not an integer") from e
