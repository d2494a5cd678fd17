"""JobPlan: the ordered steps of one launch, as a record a reader can print.

A launch of a program on a card runs, per device kernel, three steps (as torch-spyre's ``SpyreStream::launch``
does): **HostCompute** (the host writes the real DRAM address of every operand slot into a pinned buffer),
**H2D** (that correction blob is copied into the kernel's correction area on the card) and **Compute** (the
kernel's prologue patches its operands and runs); a host kernel (a CPU fallback inside a program) runs as D2H,
HostCompute, H2D. The steps are the same at every launch of a program on a card, so the program's
:class:`~spyre_lab.runtime.launch.correction.CorrectionArea` works them out once and every launch records them
here: ``launch(...)`` returns the :class:`JobPlan` that ran, and ``last_plan().describe()`` lists it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class StepKind(enum.StrEnum):
    H2D = "H2D"
    D2H = "D2H"
    COMPUTE = "Compute"
    HOST_COMPUTE = "HostCompute"


UNIT = {StepKind.H2D: "pcie.h2d", StepKind.D2H: "pcie.d2h", StepKind.COMPUTE: "cores",
        StepKind.HOST_COMPUTE: "host.callback"}
"""The resource each kind of step occupies while it runs."""


@dataclass(frozen=True)
class Step:
    """One entry of a stream's queue: what it is, how long it runs (modeled), the bytes it moves."""

    kind: StepKind
    name: str
    dur_us: float
    nbytes: int = 0
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JobPlan:
    """The ordered steps of one launch; ``nodes`` is what a "rebuild" dispatch reconstructs."""

    name: str
    steps: list[Step]
    nodes: int = 1

    def describe(self) -> str:
        lines = [f"JobPlan {self.name!r}: {len(self.steps)} steps"]
        for i, s in enumerate(self.steps):
            extra = f", {s.nbytes} B" if s.nbytes else ""
            lines.append(f"  {i:2d}. {s.kind.value:<11} {s.name} ({s.dur_us:.2f} us modeled{extra})")
        return "\n".join(lines)


class LastPlan:
    """The JobPlan submitted last in this process (one of the objects :mod:`~spyre_lab.runtime.process_state`
    lists)."""

    def __init__(self) -> None:
        self.plan: JobPlan | None = None

    def reset(self) -> None:
        self.plan = None


LAST_PLAN = LastPlan()


def last_plan() -> JobPlan | None:
    """The JobPlan submitted last (``print(last_plan().describe())`` lists its steps)."""
    return LAST_PLAN.plan
