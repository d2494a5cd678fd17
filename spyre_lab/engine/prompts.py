"""What counts as a prompt of token ids, shared by `LLM.generate` (a batch of prompts) and `LLMEngine` (one).

Token ids are Python ints or numpy integers, in a list or tuple, or an integer numpy array / torch tensor
(1-D: one prompt; `LLM.generate` also takes 2-D: one prompt per row). Bytes are refused with a TypeError:
iterating ``b"abc"`` gives the ints 97, 98, 99, which would otherwise pass for token ids.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

try:
    import numpy as np
except ImportError:  # numpy is optional for the engine
    np = None


def refuse_bytes(value: Any) -> None:
    """TypeError for bytes-like prompts, naming the fix (decode them to text first)."""
    if isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"a prompt must be text (str) or token ids, got {type(value).__name__} {bytes(value)[:40]!r}; "
                        "decode bytes to text first (e.g. prompt.decode('utf-8'))")


def is_array(value: Any) -> bool:
    return isinstance(value, torch.Tensor) or (np is not None and isinstance(value, np.ndarray))


def is_token_id(value: Any) -> bool:
    """A Python or numpy integer (not a bool): what a list of token ids holds."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and not is_array(value) \
        and not (np is not None and isinstance(value, np.bool_))


def array_token_ids(array: Any, what: str, max_dims: int = 1) -> list:
    """The token ids of an integer numpy array or torch tensor (nested lists for 2-D); TypeError otherwise."""
    dtype = array.dtype
    integral = (not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool) \
        if isinstance(array, torch.Tensor) else np.issubdtype(dtype, np.integer)
    if not integral or not 1 <= array.ndim <= max_dims:
        shapes = "1-D" if max_dims == 1 else "1-D (one prompt) or 2-D (one prompt per row)"
        raise TypeError(f"{what} as an array must be a {shapes} array of integer token ids, got a "
                        f"{array.ndim}-D {type(array).__name__} of {dtype}")
    return array.tolist()
