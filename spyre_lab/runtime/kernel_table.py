"""Every kernel the spyre backend registers with torch, in one table: which op, which dispatch key, which kernel, why.

Only this module calls ``torch.library``; the kernels themselves live with the idea they serve (the eager
dispatcher, autocast, pinned host memory). The table has two stages, because ``register()`` runs inside
``import torch`` (the ``torch.backends`` entry point) and must stay small:

* :func:`import_rows`, installed by :func:`~spyre_lab.runtime.registration.register`: the one boxed fallback
  every ATen op on a spyre tensor passes through, the direct kernels that keep ops whole or work under a
  ``TorchDispatchMode``, the autocast kernels and the pinned-memory kernels;
* :func:`first_op_rows`, installed when the eager machinery loads (:mod:`~spyre_lab.runtime.ops`, on the first op
  on a spyre tensor): the sparse refusals, ``convolution_overrideable`` and the structured functional ops.

:func:`installed` lists every row installed so far (``print(describe())`` for a table).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import torch

from spyre_lab.runtime import autocast, host_memory

FALLBACK = "(every op)"
"""The ``op`` of a row that registers a backend fallback (a kernel for every op with that dispatch key)."""


class KernelRow(NamedTuple):
    """One registration: ``op`` (an ATen overload, an op name, or :data:`FALLBACK`), its dispatch key, the kernel
    and why it is registered."""

    op: Any
    key: str
    kernel: Callable[..., Any]
    why: str


DIRECT_KERNELS = (torch.ops.aten.native_layer_norm.default, torch.ops.aten.view.dtype, torch.ops.aten.rms_norm.default)
"""Ops the dispatcher would otherwise decompose or run with a composite kernel before the backend
fallback sees them; a direct PrivateUse1 registration keeps them whole, like the real stack's
fused custom ops (a decomposed rms_norm would also round its fp32 intermediates to fp16)."""

TRANSFER_KERNELS = (
    torch.ops.aten.empty_strided.default,
    torch.ops.aten.empty.memory_format,
    torch.ops.aten._copy_from.default,
    torch.ops.aten._copy_from_and_resize.default,
)
"""Allocation and host<->device copies, registered per op as well as through the fallback. torch reaches
them with a TorchDispatchMode still on the stack (``torch.tensor(data, device="spyre")`` builds the real
tensor with modes disabled, then lifts it into the mode): a per-op Python kernel is found again from
there, a Python *fallback* is not (torch stops on an internal assert). This is what lets Dynamo's
FakeTensorMode trace factory calls on the device, such as transformers' ``torch.tensor([], device=...)``."""


def import_rows(dispatch: Callable[..., Any], kernel_for: Callable[[Any], Callable[..., Any]]) -> list[KernelRow]:
    """What ``register()`` installs: ``dispatch`` is the boxed fallback, ``kernel_for(op)`` a direct kernel of ``op``
    that enters it."""
    aten = torch.ops.aten
    rows = [
        KernelRow(FALLBACK, "PrivateUse1", dispatch, "every ATen op on a spyre tensor: the eager dispatcher"),
        KernelRow(FALLBACK, "AutocastPrivateUse1", torch.library.fallthrough_kernel,
                  "autocast passes every op it has no kernel for straight through"),
    ]
    rows += [KernelRow(op, "PrivateUse1", kernel_for(op), "kept whole: no decomposition") for op in DIRECT_KERNELS]
    rows += [KernelRow(op, "PrivateUse1", kernel_for(op), "found under a TorchDispatchMode") for op in TRANSFER_KERNELS]
    rows += [KernelRow(op, autocast.AUTOCAST_KEY, autocast.autocast_kernel(op), "autocast: lower precision op")
             for op in autocast.autocast_ops()]
    rows += [
        KernelRow(aten._pin_memory.default, "CPU", host_memory.pin_memory, "pin_memory() with no CUDA allocator"),
        KernelRow(aten.is_pinned.default, "CPU", host_memory.is_pinned, "is_pinned() of pin_memory()'s copies"),
        KernelRow(aten._to_copy.default, "PrivateUse1", host_memory.to_copy, "copies without a pinned allocator"),
    ]
    return rows


def first_op_rows(refuse_sparse: Callable[..., Any], convolution: Callable[..., Any],
                  structured: Iterable[tuple[Any, Callable[..., Any]]]) -> list[KernelRow]:
    """What the eager dispatcher installs when it loads: its kernels for sparse layouts (a refusal),
    ``convolution_overrideable`` (the CPU's convolution) and each structured functional device op."""
    rows = [KernelRow(FALLBACK, key, refuse_sparse, "sparse spyre tensors are refused")
            for key in ("SparsePrivateUse1", "SparseCsrPrivateUse1")]
    rows.append(KernelRow("convolution_overrideable", "PrivateUse1", convolution,
                          "the default kernel only raises: run convolution"))
    rows += [KernelRow(op, "PrivateUse1", kernel, "a structured op arrives whole, not as empty + out=")
             for op, kernel in structured]
    return rows


_INSTALLED: dict[str, tuple[list[torch.library.Library], list[KernelRow]]] = {}


def install(stage: str, rows: Sequence[KernelRow]) -> None:
    """Register ``rows`` with torch as ``stage`` (``"import"`` or ``"first op"``; once each): fallbacks in the
    global namespace ``_``, op kernels in ``aten``. The libraries are kept for the life of the process, as the
    registrations are."""
    if stage in _INSTALLED:
        return
    fallbacks = torch.library.Library("_", "IMPL")
    kernels = torch.library.Library("aten", "IMPL")
    for row in rows:
        if row.op == FALLBACK:
            fallbacks.fallback(row.kernel, row.key)
        else:
            kernels.impl(row.op, row.kernel, row.key)
    _INSTALLED[stage] = ([fallbacks, kernels], list(rows))


def installed() -> list[KernelRow]:
    """Every row registered with torch so far, in order."""
    return [row for _, rows in _INSTALLED.values() for row in rows]


def is_installed(stage: str) -> bool:
    return stage in _INSTALLED


def describe() -> str:
    """The installed table, one line per row: op, dispatch key, kernel, why."""
    return "\n".join(f"{r.op!s:<48} {r.key:<20} {getattr(r.kernel, '__name__', type(r.kernel).__name__):<28} "
                     f"{r.why}" for r in installed())
