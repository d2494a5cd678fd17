"""The eager dispatcher: every ATen op on a spyre tensor enters :func:`dispatch`, the PrivateUse1 fallback.

Three roads, chosen per op:

* **The backend's own ops** (allocation, copies across PCIe, ``.item()``, ``resize_``, ``set_``) are in
  :mod:`~spyre_lab.runtime.ops_special`.
* **Views** (any op whose schema returns an alias: view, as_strided, transpose, slice, ...) are
  built by redispatching to the Meta kernel, which makes a new TensorImpl on the *same* storage.
  No data moves; the device payload is shared, as on the card.
* **Everything else** is launched as a one-op program (:mod:`~spyre_lab.runtime.eager_programs`) when it
  is a device op, or runs on the CPU with both PCIe trips on the trace (:mod:`~spyre_lab.runtime.fallback`).

Backward through spyre tensors is refused: this device is inference-only.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch

from spyre_lab.runtime import kernel_table
from spyre_lab.runtime.eager_programs import DEVICE_OPS, launch_eager
from spyre_lab.runtime.errors import SpyreInferenceOnlyError, SpyreUsageError
from spyre_lab.runtime.host_memory_limit import host_out_of_memory
from spyre_lab.runtime.op_schema import is_view, mutated_args
from spyre_lab.runtime.ops_special import SPECIAL
from spyre_lab.runtime.outside_dynamo import outside_dynamo

_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
aten = torch.ops.aten


# --- entry point --------------------------------------------------------------------------------
def dispatch(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """The PrivateUse1 fallback: every ATen op on a spyre tensor lands here."""
    if torch._C._current_graph_task_id() != -1:
        _refuse_backward(op)
    try:
        road = _ROADS.get(op)
        if road is None:
            road = _ROADS[op] = _road(op)
        if road is launch_eager:
            return launch_eager(op, args, kwargs)
        if road is _view:
            return _view(op, args, kwargs)
        return road(*args, **kwargs)
    except (SpyreUsageError, RuntimeError, MemoryError) as e:
        _reraise(op, args, kwargs, e)


def _refuse_backward(op: torch._ops.OpOverload) -> NoReturn:
    raise SpyreInferenceOnlyError(
        f"spyre is an inference-only device: backward() reached {op} on a spyre tensor. Run inference "
        "under torch.inference_mode() / torch.no_grad(), or train on the CPU and move the trained model "
        "with .to('spyre')."
    )


def _reraise(op: torch._ops.OpOverload, args: tuple, kwargs: dict, e: Exception) -> NoReturn:
    """Raise ``e`` as the op's caller should see it: our errors name the op; the host simulating the card running
    out of RAM says so, naming it."""
    if isinstance(e, SpyreUsageError):
        _naming(e, op)
        raise e
    replacement = host_out_of_memory(op, args, kwargs, e)
    if replacement is None:
        raise e
    replacement.spyre_op = f"aten::{op.overloadpacket.__name__}"
    raise replacement from e


_ROADS: dict[torch._ops.OpOverload, Any] = {}
"""Per op, the road :func:`dispatch` takes (worked out at its first call): its special kernel, :func:`_view`, or
:func:`~spyre_lab.runtime.eager_programs.launch_eager`."""


def _road(op: torch._ops.OpOverload) -> Any:
    special = SPECIAL.get(op)
    if special is not None:
        return special
    return _view if is_view(op) else launch_eager


def _naming(error: SpyreUsageError, op: torch._ops.OpOverload) -> None:
    """Our errors name the ATen op they stopped (once: the innermost op is the one that failed)."""
    if not getattr(error, "spyre_op", None) and error.args:
        error.spyre_op = f"aten::{op.overloadpacket.__name__}"
        error.args = (f"{error.spyre_op}: {error.args[0]}", *error.args[1:])


def _refuse_sparse(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    raise SpyreUsageError(
        f"aten::{op.overloadpacket.__name__}: spyre holds only dense (strided) tensors, and this one is sparse; "
        "convert it with .to_dense() before moving it to spyre, or keep sparse work on the CPU"
    )


def _convolution(*args: Any, **kwargs: Any) -> Any:
    """``convolution`` on a PrivateUse1 device calls ``convolution_overrideable``, whose default kernel only
    raises; the CPU implements ``convolution`` with the same schema, so it runs as that op's fallback."""
    return dispatch(aten.convolution.default, *args, **kwargs)


def _structured_functional_ops() -> list[torch._ops.OpOverload]:
    """The functional overloads of device ops that torch would run as ``empty`` + the ``out=`` op.

    A structured op (``add.Tensor``, ``mm``, ``silu``, ...) has a CompositeExplicitAutogradNonFunctional
    kernel that outranks a backend fallback: it allocates the result through the dispatcher and then
    calls ``add.out``, two trips through Python for one op. Registered directly, the op arrives whole:
    one dispatch, and the program allocates its result itself. In-place forms keep torch's composite
    (``add_`` -> ``add.out(out=self)``), so they stay compiled one-op programs writing their input."""
    found = []
    for packet in sorted(DEVICE_OPS):
        for name in getattr(aten, packet).overloads():
            op = getattr(getattr(aten, packet), name)
            if mutated_args(op) or is_view(op) or not _has_kernel(op, "CompositeExplicitAutogradNonFunctional"):
                continue
            if not _has_kernel(op, "PrivateUse1"):
                found.append(op)
    return found


def _has_kernel(op: torch._ops.OpOverload, key: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)
    except RuntimeError:               # a TorchScript-only overload (``add.t``): not a dispatcher op
        return False


def _direct_kernel(op: torch._ops.OpOverload) -> Any:
    """A structured op's own kernel: :func:`dispatch` for ``op`` with its road known ahead (an eager program's
    launch, when the op has no special kernel), so a call looks nothing up."""
    if _road(op) is not launch_eager:
        @outside_dynamo
        def kernel(*args: Any, **kwargs: Any) -> Any:
            return dispatch(op, *args, **kwargs)

        return kernel

    @outside_dynamo
    def launch_kernel(*args: Any, **kwargs: Any) -> Any:
        if torch._C._current_graph_task_id() != -1:
            _refuse_backward(op)
        try:
            return launch_eager(op, args, kwargs)
        except (SpyreUsageError, RuntimeError, MemoryError) as e:
            _reraise(op, args, kwargs, e)

    return launch_kernel


STRUCTURED_DIRECT = _structured_functional_ops()
"""Functional device ops registered as PrivateUse1 kernels of their own (see :func:`_structured_functional_ops`)."""
# Registered when the eager machinery loads, i.e. on the first op on a spyre tensor, which precedes any of these
# (a sparse or convolution call on spyre needs dense spyre tensors made first).
kernel_table.install("first op", kernel_table.first_op_rows(
    _refuse_sparse, _convolution, [(op, _direct_kernel(op)) for op in STRUCTURED_DIRECT]))


def _view(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    if op in (aten.view.dtype, aten.view_as_real.default, aten.view_as_complex.default):
        source = args[0]
        target = args[1] if op is aten.view.dtype else None
        if target is not None and target == source.dtype:
            return aten.alias.default.redispatch(_META, source)
        raise SpyreUsageError(
            f"{op} reinterprets the bits of a spyre tensor, but spyre stores data stickified in its device dtype, "
            "so there are no host bits to reinterpret; do it on the CPU: t.cpu().view(dtype)"
        )
    return op.redispatch(_META, *args, **kwargs)
