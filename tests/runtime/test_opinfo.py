"""Conformance: PyTorch's OpInfo samples for every op spyre claims, spyre vs CPU at fp16.

Each sample runs on the CPU (the reference) and on spyre. A sample passes when the values match
within fp16 tolerances; it may instead fail with a clear error (counted, allowed up to 5%); it
must never produce a different value. Samples the CPU itself rejects are not counted.
The default run covers a fast subset; ``-m slow`` runs every sample of every claimed op.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_map

CLAIMED = frozenset({
    "add", "sub", "rsub", "mul", "div", "neg", "abs", "reciprocal", "pow", "sqrt", "rsqrt", "exp", "log", "tanh",
    "sigmoid", "nn.functional.relu", "nn.functional.silu", "nn.functional.gelu", "erf", "maximum", "minimum",
    "clamp", "clamp_min", "clamp_max", "ceil", "floor", "sign", "square", "nn.functional.hardtanh",
    "nn.functional.leaky_relu", "nn.functional.elu", "nn.functional.softplus", "nn.functional.mish", "lerp",
    "eq", "ne", "lt", "le", "gt", "ge", "where", "masked_fill", "logical_not", "logical_and", "logical_or",
    "bitwise_and", "bitwise_not", "clone", "fill", "zero_", "cat", "index_select", "index_copy", "sum", "mean",
    "amax", "amin",
    "max", "min", "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.rms_norm", "var", "std",
    "prod", "all", "any", "mm", "bmm", "addmm", "baddbmm", "dot", "mv", "matmul", "nn.functional.linear",
})
"""OpInfo names whose ATen kernels spyre runs as device ops (see spyre_lab.runtime.eager_programs.DEVICE_OPS)."""

# fp16 tolerances: two units in the last place relative (fp16 eps = 2**-10), and 1e-3 absolute near zero.
# Compiled kernels round once from fp32 where the CPU op may round per step, so results can differ by an ulp.
FP16_RTOL = 2 * 2**-10
FP16_ATOL = 1e-3

FAST = ("add", "mul", "softmax", "mm", "where", "sum", "nn.functional.layer_norm", "cat")


@dataclass
class Tally:
    passed: int = 0
    clear_errors: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    per_op: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return self.passed + len(self.clear_errors) + len(self.wrong)


def _to_spyre(x):
    return x.to("spyre") if isinstance(x, torch.Tensor) else x


def _to_cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


def _claimed_opinfos(names):
    return [op for op in op_db if op.name in names and torch.float16 in op.supported_dtypes("cpu")]


def run_conformance(names, max_samples: int | None = None) -> Tally:
    tally = Tally()
    for op in _claimed_opinfos(names):
        samples = list(op.sample_inputs("cpu", torch.float16, requires_grad=False))[:max_samples]
        for k, sample in enumerate(samples):
            label = f"{op.name}.{op.variant_test_name or 'default'}[{k}]"
            try:
                expected = op(sample.input, *sample.args, **sample.kwargs)
            except Exception:
                continue  # the CPU rejects it too: not a spyre sample
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    got = op(_to_spyre(sample.input), *tree_map(_to_spyre, sample.args),
                             **tree_map(_to_spyre, sample.kwargs))
                    got = tree_map(_to_cpu, got)
            except Exception as exc:
                tally.clear_errors.append(f"{label}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                continue
            try:
                torch.testing.assert_close(got, expected, equal_nan=True, atol=FP16_ATOL, rtol=FP16_RTOL)
            except AssertionError as exc:
                tally.wrong.append(f"{label}: {str(exc).splitlines()[0][:160]}")
                continue
            tally.passed += 1
            tally.per_op[op.name] += 1
    return tally


def _report(tally: Tally) -> str:
    lines = [f"{tally.passed}/{tally.total} samples pass, {len(tally.clear_errors)} clear errors, "
             f"{len(tally.wrong)} wrong values"]
    lines += ["error: " + e for e in tally.clear_errors[:20]] + ["WRONG: " + w for w in tally.wrong[:20]]
    return "\n".join(lines)


def test_fast_subset_matches_cpu():
    tally = run_conformance(FAST, max_samples=4)
    assert tally.total >= 25, _report(tally)
    assert not tally.wrong, _report(tally)
    assert tally.passed >= 0.95 * tally.total, _report(tally)


@pytest.mark.slow
def test_every_sample_of_every_claimed_op():
    tally = run_conformance(CLAIMED)
    print(_report(tally))
    assert not tally.wrong, _report(tally)
    assert tally.passed >= 0.95 * tally.total, _report(tally)


def test_every_claimed_name_is_an_opinfo_that_runs_at_fp16():
    found = {op.name for op in _claimed_opinfos(CLAIMED)}
    assert len(found) >= 0.9 * len(CLAIMED), sorted(CLAIMED - found)
