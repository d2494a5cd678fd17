"""The names a launch goes through: what it runs (:class:`LaunchKernel`) and what it accepts (:class:`LaunchProgram`).

* a :class:`LaunchProgram` is what gets launched: a name, its :class:`LaunchKernel` s in order, the node count a
  "rebuild" reconstructs, and the in-place updates it must land. A compiler ``Program`` becomes one as a
  :class:`~spyre_lab.runtime.programs.LoadedProgram` (its kernels are ``LoadedKernel`` s); an eager op is an
  :class:`~spyre_lab.runtime.eager_programs.EagerProgram`; a hand-made program needs only those four attributes,
  with :class:`LoadedFunction` s for kernels that compute with a plain function;
* :class:`Operands` is what a kernel's prologue hands its body: each operand found through its patched address.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from spyre_lab.compiler.access import Read
from spyre_lab.device.trace import Trace
from spyre_lab.runtime.tensor import DeviceBuffer, owns_its_memory

Window = tuple[DeviceBuffer, tuple[int, ...], tuple[int, ...], int]
"""An operand as a kernel sees it: the live buffer at its patched address, and its size, stride and offset."""


class Operands:
    """What a kernel's prologue hands its body: operands found through their patched addresses.

    Each slot is a (buffer, size, stride, offset) window; ``operands[slot]`` reads it as a host
    tensor and ``operands.write(slot, values)`` writes it back into the buffer's DRAM payload.
    """

    def __init__(self, windows: Mapping[str, Window]) -> None:
        self._windows = windows if type(windows) is dict else dict(windows)   # the launch hands over its own dict

    def __getitem__(self, slot: str) -> torch.Tensor:
        buffer, size, stride, offset = self._windows[slot]
        return buffer.read_window(size, stride, offset)

    def read_into(self, env: dict[str, torch.Tensor], slots: Sequence[str]) -> None:
        """``env[slot] = self[slot]`` for each of ``slots``, in one call (a kernel reads all its inputs at once)."""
        windows = self._windows
        for slot in slots:
            buffer, size, stride, offset = windows[slot]
            env[slot] = buffer.read_window(size, stride, offset)

    def write(self, slot: str, values: torch.Tensor) -> None:
        """A kernel hands over what it writes: a result that owns its memory becomes the buffer's contents as it
        is; anything that shares memory (a view of an operand) is copied."""
        buffer, size, stride, offset = self._windows[slot]
        buffer.write_window(size, stride, offset, values, adopt=owns_its_memory(values))

    def window(self, slot: str) -> Window:
        """The (buffer, size, stride, offset) the prologue resolved for ``slot``: for a kernel that writes only
        part of an operand's buffer (``DeviceBuffer.write_rows``)."""
        return self._windows[slot]

    def __contains__(self, slot: str) -> bool:
        return slot in self._windows


class LaunchKernel(Protocol):
    """What a launch runs: its operands by symbolic slot, its modeled time and where that comes from,
    whether it runs on the host (a CPU fallback inside a program), and the computation itself."""

    @property
    def name(self) -> str: ...
    @property
    def address_slots(self) -> Sequence[str]: ...
    @property
    def output_slots(self) -> Sequence[str]: ...
    @property
    def time_us(self) -> float: ...
    @property
    def timing(self) -> str: ...
    @property
    def sim_trace(self) -> Trace | None: ...
    @property
    def args(self) -> Mapping[str, Any]: ...
    @property
    def host(self) -> bool: ...

    def run(self, operands: Operands) -> None: ...


class LaunchProgram(Protocol):
    """What :func:`launch` accepts: a name, kernels in launch order, the node count a "rebuild" dispatch
    reconstructs, and the in-place updates (input slot <- compiler ``Read`` of a value) to land."""

    @property
    def name(self) -> str: ...
    @property
    def kernels(self) -> Sequence[LaunchKernel]: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def mutations(self) -> Sequence[tuple[str, Read]]: ...


@dataclass
class LoadedFunction:
    """A kernel from a plain function, ready to launch (eager ops' and hand-made programs' kernels):
    ``compute(operands)`` reads ``operands[slot]`` and writes outputs.

    ``time_us`` is its modeled device time; ``sim_trace`` (optional) holds per-core events relative to
    the kernel start, placed on the launch trace when the kernel runs. ``timing`` says where the time
    comes from (``"simulated"``, ``"roofline"``, ...), so a trace never passes one off as the other.
    """

    name: str
    address_slots: list[str]
    compute: Callable[[Operands], None]
    time_us: float
    timing: str = "given"
    sim_trace: Trace | None = None
    args: dict[str, Any] = field(default_factory=dict)
    host: bool = False

    @property
    def output_slots(self) -> list[str]:
        return list(self.address_slots)

    def run(self, operands: Operands) -> None:
        self.compute(operands)
