"""Optional: spyre_lab's KTIR run by IBM's ktir-cpu interpreter (a checkout named by KTIR_CPU_PATH; Python >= 3.12)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from spyre_lab.ktir.examples import path

KTIR_CPU = os.environ.get("KTIR_CPU_PATH")
pytestmark = pytest.mark.skipif(not KTIR_CPU, reason="KTIR_CPU_PATH does not point to a ktir-cpu checkout")


def test_vector_add_agrees_with_ktir_cpu() -> None:
    sys.path.insert(0, KTIR_CPU)
    from ktir_cpu import KTIRInterpreter

    import spyre_lab.ktir as ktir

    x = np.random.default_rng(0).standard_normal(8192).astype(np.float16)
    y = np.random.default_rng(1).standard_normal(8192).astype(np.float16)
    interp = KTIRInterpreter()
    interp.load(str(path("vector_add")))
    theirs = interp.execute_function("vector_add", x_ptr=x, y_ptr=y, out_ptr=np.zeros(8192, np.float16))["out_ptr"]
    ours = ktir.load(path("vector_add")).main.run(x, y, np.zeros(8192, np.float16)).outputs["out_ptr"]
    torch.testing.assert_close(torch.from_numpy(np.asarray(theirs)), ours)
