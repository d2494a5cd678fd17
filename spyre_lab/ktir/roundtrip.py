"""Export every kernel of a compiled Program to KTIR, read it back, and hold the two side by side.

For each planned kernel: the KTIR text (``KernelSpec.to_ktir``), the kernel re-imported and run on the
values the compiled program feeds it (each LoopIR node's own torch computation gives them), its outputs
against the node computations', and its modeled time against the compiled kernel's in both timing modes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from spyre_lab.compiler.kernel_spec import KernelSpec
from spyre_lab.compiler.ktir_errors import KTIRUnsupported
from spyre_lab.compiler.program import Program
from spyre_lab.device.isa import CoreOps, OpKind, TileProgram
from spyre_lab.device.sim import simulate
from spyre_lab.ktir.module import load
from spyre_lab.ktir.sticks import from_sticks, to_sticks


@dataclass
class KernelRoundTrip:
    kernel: str
    rule: str
    text: str | None                 # the KTIR, or None when the kernel is not written out
    reason: str = ""                 # why not (the KTIRUnsupported message)
    max_abs_error: float = 0.0       # imported KTIR's outputs vs the compiled kernel's node computations
    compiled_us: dict[str, float] | None = None
    ktir_us: dict[str, float] | None = None
    ktir_private_us: dict[str, float] | None = None
    """The imported kernel's time with every core loading its own copy, when the compiled plan claims no DRAM
    broadcast but the imported one does (fused attention: the cores of one head read the same K/V tiles at the
    same step, which the reader shares and the compiler's attention plan does not); else None."""

    @property
    def exported(self) -> bool:
        return self.text is not None


def round_trip(program: Program, inputs: Sequence[torch.Tensor], modes: Sequence[str] = ("analytic", "event"),
               only: Callable[[KernelSpec], bool] | None = None) -> list[KernelRoundTrip]:
    """One record per device kernel of ``program`` run on ``inputs`` (host fallbacks are skipped; with ``only``,
    so is every kernel it rejects, though its values are still computed for the kernels after it)."""
    env: dict[str, torch.Tensor] = dict(zip(program.inputs, inputs))
    env.update(program.constants)
    records = []
    for launch, kernel in zip(program.launches, program.kernels):
        before = dict(env)
        for node in kernel.nodes:
            env[node.output] = node.compute(*[env[b] for b in node.inputs])
        if not isinstance(launch, KernelSpec) or (only is not None and not only(launch)):
            continue
        try:
            text = launch.to_ktir(kernel.nodes)
        except KTIRUnsupported as e:
            records.append(KernelRoundTrip(launch.name, launch.rule, None, str(e)))
            continue
        fn = load(text).main
        # every argument in the device's stick layout, as the exported memory views' strides describe it
        dense = [before[b] if b in before else torch.zeros(program.buffers[b].shape, dtype=program.buffers[b].dtype)
                 for b in launch.address_slots]
        args = [to_sticks(t, launch.cfg.stick_bytes) for t in dense]
        result = fn.run(*args, cfg=launch.cfg)
        err = 0.0
        for (arg, _), b in zip(fn.args, launch.address_slots):
            if b in before:
                continue
            got = from_sticks(result.outputs[arg[1:]], tuple(program.buffers[b].shape)).reshape(env[b].shape).float()
            err = max(err, float((got - env[b].float()).abs().max()) if got.numel() else 0.0)
        private = None
        if launch.rule == "attention" and _shares(result.program) and not _shares(launch.tile_kernel):
            alone = without_broadcasts(result.program, launch.cfg.cores)
            private = {m: simulate(alone, launch.cfg, mode=m, trace=False).time_us for m in modes}
        records.append(KernelRoundTrip(
            launch.name, launch.rule, text, max_abs_error=err,
            compiled_us={m: launch.simulate(m).time_us for m in modes},
            ktir_us={m: simulate(result.program, launch.cfg, mode=m, trace=False).time_us for m in modes},
            ktir_private_us=private))
    return records


def _shares(program: TileProgram) -> bool:
    return any(op.kind is OpKind.LOAD and op.share > 1 for p in program.programs for op in p.ops)


def without_broadcasts(program: TileProgram, cores: int) -> TileProgram:
    """``program`` with every load its core's own (share 1): what it costs when no DRAM broadcast is claimed."""
    progs = [CoreOps([replace(op, share=1) if op.kind is OpKind.LOAD else op for op in p.ops])
             for p in program.programs]
    return TileProgram.from_programs(program.name, progs, cores)
