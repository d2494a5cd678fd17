"""spyre_lab.compiler: ``torch.compile(backend="spyre")`` -- ATen -> LoopIR -> fusion -> layouts -> kernels -> Program.

Importing this package registers the "spyre" backend with Dynamo (the ``torch_dynamo_backends``
entry point does the same lazily).
"""

from spyre_lab.compiler.backend import compile_graph, register, spyre_backend
from spyre_lab.compiler.explain import explain
from spyre_lab.compiler.options import FUSION_RULES, CompileOptions
from spyre_lab.compiler.program import Program

register()

__all__ = ["FUSION_RULES", "CompileOptions", "Program", "compile_graph", "explain", "spyre_backend"]
