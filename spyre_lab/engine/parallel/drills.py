"""Fault drills: functions to run on the workers (`TensorParallelWorkers.call`) to see how a group fails.

A real card can raise mid-step (a kernel error, a lost buffer) or vanish (the process dies); the engine must
then name the rank and the cause instead of hanging in a collective. These make one rank do that on purpose.
"""

from __future__ import annotations

from typing import Any


class InjectedFault(RuntimeError):
    """Raised by a drill, so an error message shows it was deliberate."""


def fail_next_step(rank: int, runner: Any, target: int, message: str) -> bool:
    """On rank ``target``, make the next decode step raise ``InjectedFault(message)`` before its first collective."""
    if rank == target:
        def broken(seqs: Any) -> Any:
            raise InjectedFault(message)

        runner.prepare_decode = broken
    return rank == target
