"""Conformance: every op of PyTorch's OpInfo database that runs in fp16 on the CPU, spyre vs CPU.

Each op runs its first few samples on the CPU (the reference) and on spyre, whichever road spyre
takes (a device program, the CPU fallback, or a mix when a composite op decomposes). A sample
passes when spyre's values match the CPU's within fp16 tolerances or, where fp16 rounding differs
(spyre rounds once from fp32 where the CPU op may round per step, or the other way round), when
spyre's result is no further from an fp32 reference than the CPU's fp16 result is. Otherwise it
must fail with a clear error: one of spyre's own errors, naming the ATen op it stopped. A wrong
value is never allowed. Samples the CPU itself rejects are not counted. In-place variants run on
one sample per op, and the updated input is compared too.

Run with ``-s`` to see the counts (ops, samples, device vs fallback, errors by kind).
"""

from __future__ import annotations

import itertools
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_map

from spyre_lab.runtime.eager_programs import DEVICE_OPS
from spyre_lab.runtime.errors import SpyreUsageError
from spyre_lab.runtime.timeline import recording

SAMPLES_PER_OP = 3

# fp16 tolerances: two units in the last place relative (fp16 eps = 2**-10), and 1e-3 absolute near zero.
FP16_RTOL = 2 * 2**-10
FP16_ATOL = 1e-3

UNSPECIFIED_VALUES = frozenset({"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
                                "empty_permuted"})
"""Ops whose values are uninitialised memory: only shape, dtype and device are compared."""

CPU_ARGUMENTS = frozenset({"tensor_split"})
"""Ops whose OpInfo passes a CPU tensor argument that torch requires on the CPU (as with CUDA)."""

EXPECTED_WARNING = re.compile(r"aten::(\w+) has no spyre kernel( \(called from [^)]*\))?; it runs as a CPU fallback|"
                              r"spyre stores torch\.\w+ "
                              r"tensors as float16|spyre: no compiled one-op program for aten::\w+|spyre: the compiled "
                              r"program for aten::\w+ disagrees|An output with one "
                              r"or more elements was resized since it had shape \[\]|"
                              r"^var\(\): degrees of freedom is <= 0")
"""What spyre may print beyond the CPU's own warnings: a CPU fallback notice, the fp16-storage notice, a
one-op compile gap, torch's notice from the CPU ``mse_loss.out`` / ``smooth_l1_loss.out`` kernels,
which the fallback runs because torch routes a PrivateUse1 loss through its out= form, and torch's "degrees of
freedom" notice for a std over an empty tensor, which the compiled one-op program (std decomposed into var) gives
once under var()'s name where the CPU says std()."""

FP16_OPS = [op for op in op_db if torch.float16 in op.supported_dtypes("cpu")]


@dataclass
class Tally:
    ops: set[tuple[str, str]] = field(default_factory=set)     # OpInfo (name, variant)
    passed: int = 0
    roads: Counter = field(default_factory=Counter)
    in_place: int = 0
    errors: Counter = field(default_factory=Counter)
    clear_errors: list[str] = field(default_factory=list)
    unclear_errors: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    fallback_ops: set[str] = field(default_factory=set)

    @property
    def samples(self) -> int:
        return self.passed + len(self.clear_errors) + len(self.unclear_errors) + len(self.wrong)

    def report(self) -> str:
        lines = [f"{len(self.ops)} ops, {self.samples} samples ({self.in_place} in-place): {self.passed} pass "
                 f"({dict(self.roads)}), {len(self.clear_errors)} clear errors {dict(self.errors)}, "
                 f"{len(self.unclear_errors)} unclear errors, {len(self.wrong)} wrong values"]
        lines += ["error: " + e for e in self.clear_errors]
        lines += ["UNCLEAR: " + e for e in self.unclear_errors] + ["WRONG: " + w for w in self.wrong]
        return "\n".join(lines)


def _copy(x, device: str = "spyre"):
    """Copy a tensor with its whole storage, so a view keeps its offset and its neighbours (as_strided
    samples read outside the view, as a sample made on the device would)."""
    if not isinstance(x, torch.Tensor) or x.layout != torch.strided:
        return x.to(device) if isinstance(x, torch.Tensor) else x
    whole = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage())
    return whole.to(device, copy=True).as_strided(x.size(), x.stride(), x.storage_offset())


def _to_spyre(x):
    return _copy(x, "spyre")


def _to_cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


def _upcast(x):
    if not isinstance(x, torch.Tensor):
        return x
    return x.float() if x.dtype == torch.float16 else x.clone()   # a copy: in-place variants must not touch samples


def _road(trace) -> str:
    fallback = any(e.args.get("fallback") for e in trace.events)
    device = any(e.args.get("kind") == "Compute" for e in trace.events)
    return {(True, True): "mixed", (True, False): "fallback", (False, True): "device"}.get((fallback, device), "none")


def _no_worse_than_cpu(got: torch.Tensor, cpu16: torch.Tensor, ref32: torch.Tensor) -> bool:
    """Element by element, spyre's distance to the fp32 result is at most the CPU's plus a few fp16 units
    of the result's scale: a composite op (attention decomposed into matmul, softmax, matmul) rounds each
    intermediate to fp16 where the CPU kernel keeps fp32 inside, and those roundings add up."""
    got, cpu16, ref32 = got.double(), cpu16.double(), ref32.double()
    if not torch.equal(torch.isfinite(got), torch.isfinite(cpu16)):
        return False
    finite = torch.isfinite(got)
    scale = ref32[torch.isfinite(ref32)].abs().max() if bool(torch.isfinite(ref32).any()) else 0.0
    bound = (cpu16 - ref32).abs() + FP16_ATOL + 4 * 2**-10 * scale
    return bool(((got - ref32).abs() <= bound)[finite].all()) and torch.equal(got[~finite].nan_to_num(),
                                                                              cpu16[~finite].nan_to_num())


def _mismatch(got, expected, reference, name: str) -> str | None:
    """None when spyre's result is right, else what is wrong with it."""
    got_leaves, got_spec = tree_flatten(got)
    want_leaves, want_spec = tree_flatten(expected)
    ref_leaves = tree_flatten(reference)[0] if reference is not None else [None] * len(want_leaves)
    if got_spec != want_spec or len(ref_leaves) != len(want_leaves):
        return f"structure {got_spec} != {want_spec}"
    for i, (g, w, r) in enumerate(zip(got_leaves, want_leaves, ref_leaves)):
        if not isinstance(w, torch.Tensor):
            if g != w and not (isinstance(w, float) and w != w and g != g):
                return f"item {i}: {g!r} != {w!r}"
            continue
        if not isinstance(g, torch.Tensor) or g.shape != w.shape or g.dtype != w.dtype:
            return f"item {i}: {getattr(g, 'dtype', type(g))} {tuple(getattr(g, 'shape', ()))} != {w.dtype} " \
                   f"{tuple(w.shape)}"
        if name in UNSPECIFIED_VALUES:
            continue
        try:
            torch.testing.assert_close(g, w, equal_nan=True, atol=FP16_ATOL, rtol=FP16_RTOL)
        except AssertionError as exc:
            if not (w.is_floating_point() and isinstance(r, torch.Tensor) and r.shape == w.shape
                    and _no_worse_than_cpu(g, w, r)):
                return f"item {i}: " + " ".join(str(exc).split())[:200]
    return None


def _check(op, sample, label: str, tally: Tally, caught: list, variant=None) -> None:
    with warnings.catch_warnings(record=True) as on_cpu:   # the CPU's own notices: spyre may give them too
        warnings.simplefilter("always")
        torch.default_generator.manual_seed(0)
        try:
            inputs = tree_map(lambda x: _copy(x, "cpu"), sample.input) if variant is not None else sample.input
            expected = (variant or op)(inputs, *sample.args, **sample.kwargs)
        except Exception:
            return  # the CPU rejects it too: not a spyre sample
        try:
            torch.default_generator.manual_seed(0)
            with torch.no_grad():
                reference = (variant or op)(tree_map(_upcast, sample.input), *tree_map(_upcast, sample.args),
                                            **tree_map(_upcast, sample.kwargs))
        except Exception:
            reference = None
    torch.default_generator.manual_seed(0)
    try:
        with warnings.catch_warnings(record=True) as seen, recording() as trace:
            warnings.simplefilter("always")
            spyre_input = _to_spyre(sample.input)
            fn = variant or op
            args = sample.args if op.name in CPU_ARGUMENTS else tree_map(_to_spyre, sample.args)
            got = tree_map(_to_cpu, fn(spyre_input, *args, **tree_map(_to_spyre, sample.kwargs)))
            if variant is not None:
                got = (got, _to_cpu(spyre_input))
                expected = (expected, inputs)
                reference = None if reference is None else (reference, reference)
        cpu_messages = {str(w.message) for w in on_cpu}
        caught.extend((label, w) for w in seen if str(w.message) not in cpu_messages)
    except SpyreUsageError as exc:
        message = str(exc)
        if re.match(r"aten::\w+", message):
            tally.errors[type(exc).__name__] += 1
            tally.clear_errors.append(f"{label}: {message.splitlines()[0][:140]}")
        else:
            tally.unclear_errors.append(f"{label}: {type(exc).__name__} without the op's name: {message[:140]}")
        return
    except Exception as exc:
        tally.unclear_errors.append(f"{label}: {type(exc).__name__}: {str(exc).splitlines()[0][:140]}")
        return
    if variant is not None and reference is not None and not isinstance(reference[0], torch.Tensor):
        reference = None
    problem = _mismatch(got, expected, reference, op.name)
    if problem:
        tally.wrong.append(f"{label}: {problem}")
        return
    tally.passed += 1
    tally.roads[_road(trace)] += 1


def run_conformance(ops, samples_per_op: int = SAMPLES_PER_OP) -> tuple[Tally, list]:
    tally, caught = Tally(), []
    for op in ops:
        tally.ops.add((op.name, op.variant_test_name))
        torch.default_generator.manual_seed(0)
        samples = list(itertools.islice(op.sample_inputs_func(op, "cpu", torch.float16, False), samples_per_op))
        for k, sample in enumerate(samples):
            _check(op, sample, f"{op.name}.{op.variant_test_name or 'default'}[{k}]", tally, caught)
        inplace = op.inplace_variant
        if inplace is not None and samples and isinstance(samples[0].input, torch.Tensor):
            before = tally.samples
            _check(op, samples[0], f"{op.name}_[0]", tally, caught, variant=inplace)
            tally.in_place += tally.samples - before
    return tally, caught


@pytest.fixture(scope="module")
def sweep():
    tally, caught = run_conformance(FP16_OPS)
    print("\n" + tally.report())
    return tally, caught


def test_no_wrong_values(sweep):
    tally, _ = sweep
    assert not tally.wrong, tally.report()


def test_every_failure_is_a_clear_error_naming_the_op(sweep):
    tally, _ = sweep
    assert not tally.unclear_errors, tally.report()
    assert len(tally.clear_errors) < 0.05 * tally.samples, tally.report()


def test_the_sweep_covers_every_fp16_op(sweep):
    tally, _ = sweep
    assert len(tally.ops) == len(FP16_OPS) > 500
    assert tally.samples >= 2 * len(FP16_OPS), tally.report()
    assert tally.roads["device"] > 0.25 * tally.passed and tally.roads["fallback"] > 0.1 * tally.passed, tally.report()
    assert tally.in_place > 50, tally.report()


def test_only_expected_warnings_and_no_device_op_falls_back(sweep):
    """Warnings are fallback notices (never for an op spyre claims as a device op), the fp16-storage
    notice, or a one-op compile gap."""
    _, caught = sweep
    unexpected = {f"{label}: {str(w.message)[:160]}" for label, w in caught
                  if not EXPECTED_WARNING.search(str(w.message))}
    assert not unexpected, sorted(unexpected)
    fell_back = {m.group(1) for _, w in caught if (m := EXPECTED_WARNING.search(str(w.message))) and m.group(1)}
    assert fell_back, "the sweep never took the CPU fallback"
    assert not fell_back & DEVICE_OPS, sorted(fell_back & DEVICE_OPS)
