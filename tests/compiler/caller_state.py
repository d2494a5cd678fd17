"""Everything a caller can see of one call, recorded the same way for eager and compiled runs.

Not only the values: the inputs after the call (in-place updates), each output's device and dtype, which outputs
are the very same object as an input or another output, and what happens when the caller then writes to the
outputs (a view of an input changes the input; a returned constant must not change the next call's result).
``assert_same_state`` compares two such records.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten


def _snapshot(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().clone()


def _touch(t: torch.Tensor) -> None:
    """Write to an output in place, the way a caller updating a returned state tensor would."""
    if t.dtype == torch.bool:
        t.logical_not_()
    else:
        t.add_(1)


@dataclass
class CallState:
    outputs: list[object]                   # per leaf: a CPU snapshot of a tensor, or the Python value
    devices: list[str | None]
    dtypes: list[torch.dtype | None]
    identity: list[tuple[str, int] | None]  # per output: ("input", i) / ("output", j) it *is*, else None
    inputs_after: list[torch.Tensor]
    touched: list[int]                      # outputs the caller could write to in place
    inputs_after_touch: list[torch.Tensor]
    second_outputs: list[object]
    error: BaseException | None = None


def observe(fn: Callable, make_inputs: Callable[[], Sequence[torch.Tensor]],
            touch: Sequence[int] | None = None) -> CallState:
    """Call ``fn`` on fresh inputs, write to its outputs, call it again on the same inputs; record all of it.
    ``touch``: which outputs to write to (default: every tensor output that accepts it)."""
    inputs = list(make_inputs())
    first, _ = tree_flatten(fn(*inputs))
    devices = [str(o.device) if isinstance(o, torch.Tensor) else None for o in first]
    dtypes = [o.dtype if isinstance(o, torch.Tensor) else None for o in first]
    identity = []
    for i, o in enumerate(first):
        same_input = next((("input", k) for k, x in enumerate(inputs) if o is x), None)
        same_output = next((("output", j) for j, p in enumerate(first[:i]) if o is p), None)
        identity.append(same_input or same_output)
    outputs = [_snapshot(o) if isinstance(o, torch.Tensor) else o for o in first]
    inputs_after = [_snapshot(x) for x in inputs]
    touched = []
    for i, o in enumerate(first):
        if not isinstance(o, torch.Tensor) or (touch is not None and i not in touch):
            continue
        try:
            _touch(o)
        except RuntimeError:          # an expanded view, an integer output of a float op...: not writable
            if touch is not None:
                raise
            continue
        touched.append(i)
    inputs_after_touch = [_snapshot(x) for x in inputs]
    second, _ = tree_flatten(fn(*inputs))
    second_outputs = [_snapshot(o) if isinstance(o, torch.Tensor) else o for o in second]
    return CallState(outputs, devices, dtypes, identity, inputs_after, touched, inputs_after_touch, second_outputs)


def _close(got: object, want: object, what: str, atol: float) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{what}: {type(got).__name__}, eager gives a tensor"
        assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, eager {tuple(want.shape)}"
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, eager {want.dtype}"
        if want.dtype.is_floating_point:
            scale = max(1.0, want.float().abs().nan_to_num(0, 0, 0).max().item()) if want.numel() else 1.0
            torch.testing.assert_close(got.float(), want.float(), atol=atol * scale, rtol=atol, equal_nan=True,
                                       msg=lambda m: f"{what}: {m}")
        else:
            assert torch.equal(got, want), f"{what}: {got} != eager {want}"
    else:
        assert got == want, f"{what}: {got!r} != eager {want!r}"


def assert_same_state(got: CallState, want: CallState, atol: float = 2e-2, devices: bool = True) -> None:
    """``got`` (compiled) shows the caller what ``want`` (eager) shows: values (fp16 tolerance), devices, dtypes,
    object identity, in-place updates of inputs, aliasing seen through writes, fresh outputs on the next call."""
    assert len(got.outputs) == len(want.outputs), f"{len(got.outputs)} outputs, eager {len(want.outputs)}"
    for i, (g, w) in enumerate(zip(got.outputs, want.outputs)):
        _close(g, w, f"output {i}", atol)
    if devices:
        assert got.devices == want.devices, f"output devices {got.devices}, eager {want.devices}"
    assert got.dtypes == want.dtypes, f"output dtypes {got.dtypes}, eager {want.dtypes}"
    assert got.identity == want.identity, f"outputs that are inputs/other outputs {got.identity}, eager {want.identity}"
    for k, (g, w) in enumerate(zip(got.inputs_after, want.inputs_after)):
        _close(g, w, f"input {k} after the call", atol)
    assert got.touched == want.touched, f"writable outputs {got.touched}, eager {want.touched}"
    for k, (g, w) in enumerate(zip(got.inputs_after_touch, want.inputs_after_touch)):
        _close(g, w, f"input {k} after writing to the outputs (aliasing)", atol)
    for i, (g, w) in enumerate(zip(got.second_outputs, want.second_outputs)):
        _close(g, w, f"output {i} of the second call (after writing to the first call's)", atol)


ALLOWED_WARNINGS = (
    r"runs on the host",                         # a compiled op lowered to a host fallback
    r"has no spyre kernel; it runs as a CPU fallback",
    r"shares that memory; a spyre Program reads its inputs as separate tensors",
    r"spyre stores torch\.\w+ tensors as float16",
    r"Graph break",
)
"""The warnings a program may give: host and CPU fallbacks, the eager run of an aliased update, the storage policy."""


def observe_checked(fn: Callable, make_inputs: Callable[[], Sequence[torch.Tensor]],
                    touch: Sequence[int] | None = None) -> CallState:
    """:func:`observe`, with every warning it gives checked against ``ALLOWED_WARNINGS``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = observe(fn, make_inputs, touch)
    for w in caught:
        assert any(re.search(p, str(w.message)) for p in ALLOWED_WARNINGS), f"unexpected warning: {w.message}"
    return state
