"""The mlp fusion rule is cost-based: the fused kernel is kept only where its modeled time is the shortest."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from warning_checks import only_warnings

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.compiler.explain import explain_program
from spyre_lab.compiler.ir import MatMul
from spyre_lab.compiler.options import FUSION_RULES, CompileOptions


def mlp(x, wg, wu, wd):
    return (F.silu(x @ wg) * (x @ wu)) @ wd


def inputs(m: int, h: int = 4096, i: int = 12800) -> list[torch.Tensor]:
    return [torch.empty(s, dtype=torch.float16, device="meta") for s in [(m, h), (h, i), (h, i), (i, h)]]


def choice(program) -> tuple[dict[str, float], str]:
    (text,) = [k.decision for k in program.kernels if k.decision]
    times = {name: float(us) for name, us in re.findall(r"(fused without down|fused|separate) (\d+) us", text)}
    return times, text.split("-> ")[1].split(" (")[0]


@pytest.mark.parametrize("m", [8, 1024])
def test_mlp_fusion_follows_the_modeled_times(m):
    with only_warnings():
        program = compile_graph(mlp, inputs(m))
        separate = compile_graph(mlp, inputs(m), CompileOptions(fusion=frozenset(FUSION_RULES) - {"mlp"}))
    times, picked = choice(program)
    assert set(times) == {"fused", "fused without down", "separate"}
    assert times[picked] == min(times.values())
    # the numbers are the kernels' own modeled times: what was compiled, and what the other rules compile
    assert program.modeled_time_us("analytic") == pytest.approx(times[picked], abs=0.5)
    assert separate.modeled_time_us("analytic") == pytest.approx(times["separate"], abs=0.5)
    fused = [k for k in program.kernels if k.rule == "mlp"]
    matmuls = [sum(isinstance(n, MatMul) for n in k.nodes) for k in fused]
    assert matmuls == {"fused": [3], "fused without down": [2], "separate": []}[picked]
    assert f"fusion choice: {program.kernels[0].decision}" in explain_program(program)


def test_small_m_fuses_everything_and_large_m_does_not():
    """At M=8 one fused kernel reads each weight once; at M=1024 LX caps the rows per tile and the fused
    kernel re-reads its weights per row tile, so the modeled times rank the options the other way round."""
    with only_warnings():
        small, _ = choice(compile_graph(mlp, inputs(8)))
        large, _ = choice(compile_graph(mlp, inputs(1024)))
    assert small["fused"] < small["separate"]
    assert large["fused"] > min(large["separate"], large["fused without down"])


def test_the_estimated_mlp_plan_is_the_launch(monkeypatch):
    from spyre_lab.compiler import cache, codegen

    planned_rules = []
    real = codegen.generate_kernel

    def counting(kernel, *args, **kwargs):
        planned_rules.append(kernel.rule)
        return real(kernel, *args, **kwargs)

    monkeypatch.setattr(codegen, "generate_kernel", counting)
    cache.clear()
    with only_warnings():
        program = compile_graph(mlp, inputs(8, 1024, 2816))
    assert planned_rules.count("mlp") == 2          # fused, fused without down: each planned once
    (kernel,), (launch,) = program.kernels, program.launches
    assert kernel.rule == "mlp" and launch.name == kernel.name == launch.tile_kernel.name
    fresh = real(kernel, program.buffers, program.cfg, program.options)
    assert fresh.simulate().time_us == launch.simulate().time_us
