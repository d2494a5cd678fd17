"""The dtype policy of checkpoint tensors: what a weight may be loaded from, and into what.

Every parameter is held in the engine's dtype (``llm.config.dtype``: the platform's default, float16 on
the spyre platform, unless ``dtype=`` says otherwise). A checkpoint tensor is converted to it on the host
before it goes to the device, so the rule is the loader's, not the device's:

* a floating tensor of any width (float64, float32, bfloat16, float16) is rounded to the engine's dtype;
* a finite value beyond that dtype's range (|x| > 65504 for float16) would become inf, so it raises
  :class:`WeightDtypeError` naming the tensor, its largest value and the fix, as the spyre device itself
  does for such a write (``SpyreRangeError``); so does a tensor that already holds NaN or inf;
* an integer, bool or complex tensor is refused: an int8 weight is a quantized checkpoint (it needs its
  scales), a bool or complex one was saved by mistake, and casting either gives a different model.
"""

from __future__ import annotations

import torch

from spyre_lab.engine.errors import ModelLoadError


class WeightDtypeError(ModelLoadError):
    """A checkpoint tensor the engine's dtype policy refuses (wrong kind of dtype, or values out of range)."""


def cast_weight(name: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` (checkpoint tensor ``name``) in ``dtype``, on the host; a WeightDtypeError if the policy refuses."""
    if not tensor.dtype.is_floating_point:
        kind = "a quantized weight" if tensor.dtype in (torch.int8, torch.uint8) else "not floating point"
        raise WeightDtypeError(
            f"tensor {name!r} is {tensor.dtype} ({kind}); the engine loads floating-point checkpoints (float64, "
            f"float32, bfloat16, float16), rounded to {dtype}. Save the model in a floating dtype first (for a "
            "quantized model: dequantize it, e.g. with its scales, then save_pretrained)"
        )
    finite = torch.isfinite(tensor)
    if not bool(finite.all()):
        raise WeightDtypeError(
            f"tensor {name!r} ({tensor.dtype}) holds {int((~finite).sum())} NaN or inf value(s); the checkpoint is "
            "damaged or was saved after a diverged training step: save it again from a good model"
        )
    cast = tensor.to(dtype)
    if not bool(torch.isfinite(cast).all()):
        largest = float(tensor.abs().max())
        limit = torch.finfo(dtype).max
        raise WeightDtypeError(
            f"tensor {name!r} ({tensor.dtype}) holds values up to {largest:.4g}, beyond the range of {dtype} (max "
            f"{limit:g}), the dtype this engine runs in: they would become inf. Run in a wider dtype (e.g. "
            "LLM(..., platform='cpu', dtype='float32')) or rescale the weights into range; the spyre platform "
            "computes in float16 only"
        )
    return cast
