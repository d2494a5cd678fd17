"""FusionView with a KTIR tab: each kernel's LoopIR nodes next to the KTIR the compiler writes for it.

The tab is one of FusionView's ``text_panels``, so it is redrawn on every rule change: untick a fusion rule
and the tab shows the kernels that rule no longer merges, each as its own ``func.func``. A kernel the writer
does not cover shows why (the exporter's named refusal) in place of its text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from spyre_lab.viz.fusion import FusionView

KTIR_TAB = "LoopIR | KTIR"


def ktir_panel(program: Any) -> str:
    """The text of the KTIR tab for ``program`` (a compiled Program; a saved program holds no LoopIR)."""
    from spyre_lab.compiler.explain import ktir_section
    from spyre_lab.compiler.program import Program
    from spyre_lab.ktir.export import program_to_ktir

    if not isinstance(program, Program):
        return ("A saved program keeps no LoopIR nodes, so its kernels cannot be written as KTIR here: open the "
                "compiled Program (or the function and its inputs) instead.")
    texts = program_to_ktir(program)
    written = sum(isinstance(t, str) for t in texts.values())
    return f"{written} of {len(texts)} device kernels written as KTIR.\n\n{ktir_section(program)}"


def fusion_with_ktir(source: Any, example_inputs: Sequence[Any] | None = None, fn: Callable | None = None,
                     mode: str | None = None) -> FusionView:
    """A FusionView of ``source`` (what FusionView takes) whose tab under the figure is the KTIR of every kernel."""
    return FusionView(source, example_inputs, fn, mode, text_panels={KTIR_TAB: ktir_panel})
