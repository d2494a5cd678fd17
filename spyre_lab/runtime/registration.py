"""Make ``torch.device("spyre")`` exist: the PrivateUse1 backend, its device module, guard and hooks.

``register()`` is idempotent and cheap: it renames PrivateUse1 to "spyre", generates the tensor /
module / storage methods (``x.spyre()``, ``x.is_spyre``, ``module.spyre()``), installs
``torch.spyre`` and the Python device guard and hooks, and registers ONE boxed fallback kernel for
the PrivateUse1 dispatch key (:func:`spyre_lab.runtime.ops.dispatch`), through which every ATen op
on a spyre tensor passes, with the other kernels of the first stage of the one table of torch registrations
(:mod:`~spyre_lab.runtime.kernel_table`: direct kernels, fp16 autocast, pinned host memory). It also installs
what keeps ordinary PyTorch habits working next to the device: the ``torch.accelerator`` / ``torch.Generator`` /
``torch.load`` routes (``generic_api``), and the storage methods that would otherwise need a C++ allocator
(``storages``: ``clone``, hence ``copy.deepcopy``).

It runs on ``import torch`` through the ``torch.backends`` entry point (:func:`spyre_lab.runtime._autoload`).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from spyre_lab.runtime import generic_api, kernel_table, storages
from spyre_lab.runtime.outside_dynamo import outside_dynamo

BACKEND = "spyre"


class SpyreHooks(torch._C._acc.PrivateUse1Hooks):
    """What ATen asks the backend about itself."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class SpyreDeviceGuard(torch._C._acc.DeviceGuard):
    """The Python device guard (torch 2.13 calls only ``type_`` from Python; the index lives in torch.spyre)."""

    def type_(self) -> torch._C._autograd.DeviceType:
        return torch._C._autograd.DeviceType.PrivateUse1


def _device_module() -> types.ModuleType:
    from spyre_lab.runtime import device_module

    return device_module


def is_registered() -> bool:
    return kernel_table.is_installed("import")


def register() -> None:
    """Register the spyre backend with torch (safe to call more than once)."""
    if is_registered():
        return
    if torch._C._get_privateuse1_backend_name() != BACKEND:
        torch.utils.rename_privateuse1_backend(BACKEND)
    if not hasattr(torch.Tensor, "is_spyre"):
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    if getattr(torch, BACKEND, None) is None:
        torch._register_device_module(BACKEND, _device_module())
    torch._C._acc.register_python_privateuseone_hook(SpyreHooks())
    torch._C._acc.register_python_privateuseone_device_guard(SpyreDeviceGuard())

    kernel_table.install("import", kernel_table.import_rows(_dispatch, _kernel_for))
    storages.install()
    generic_api.install()


@outside_dynamo   # the driver is never traced: a graph break must not compile the runtime
def _dispatch(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """The registered kernel: loads the eager-op machinery on the first spyre op, not on import torch."""
    from spyre_lab.runtime.ops import dispatch

    return dispatch(op, *args, **kwargs)


def _kernel_for(op: torch._ops.OpOverload) -> Callable[..., Any]:
    @outside_dynamo
    def kernel(*args: Any, **kwargs: Any) -> Any:
        return _dispatch(op, *args, **kwargs)

    return kernel
