"""spyre_lab.compiler: graph -> Program -- ATen -> LoopIR -> layouts -> fusion -> kernels -> launch order.

``compile_graph(fn, example_inputs)`` is the whole pipeline; it touches no data and no device. The
``torch.compile(backend="spyre")`` glue that launches Programs lives in the runtime
(:mod:`spyre_lab.runtime.dynamo_backend`).
"""

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.explain import explain
from spyre_lab.compiler.options import FUSION_RULES, CompileOptions
from spyre_lab.compiler.program import Program

__all__ = ["FUSION_RULES", "CompileOptions", "Program", "compile_graph", "explain"]
