"""The spyre device exists after a bare `import torch`, with torch's generated methods and torch.spyre."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import spyre_lab.runtime as runtime
from spyre_lab.runtime import devices

_PROBE = textwrap.dedent("""
    import json, torch                      # no spyre_lab import: the entry point must do it
    out = {}
    x = torch.arange(6, dtype=torch.float16).reshape(2, 3).to("spyre")
    out["device"] = str(x.device)
    out["is_spyre"] = x.is_spyre
    out["accelerator"] = str(torch.accelerator.current_accelerator())
    out["module"] = torch.get_device_module("spyre").__name__
    out["count"] = torch.spyre.device_count()
    y = torch.ones(3, dtype=torch.float16, device="spyre:1")
    out["y_device"] = str(y.device)
    out["mem"] = [torch.spyre.memory_allocated(0), torch.spyre.memory_allocated(1)]
    out["sum"] = (x * 2).sum().item()
    try:
        y + x[0]
    except RuntimeError as exc:
        out["mix_error"] = str(exc)
    print(json.dumps(out))
""")


def test_import_torch_alone_autoloads_the_device_in_a_fresh_process():
    env = {**os.environ, "SPYRE_LAB_DEVICES": "2", "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["device"] == "spyre:0"
    assert out["is_spyre"] is True
    assert out["accelerator"] == "spyre"
    assert out["module"] == "spyre_lab.runtime.device_module"
    assert out["count"] == 2
    assert out["y_device"] == "spyre:1"
    assert out["mem"][0] > 0 and out["mem"][1] > 0          # each card has its own DRAM
    assert out["sum"] == 30.0
    assert "spyre:0" in out["mix_error"] and "spyre:1" in out["mix_error"]


def test_device_module_mirrors_torch_cuda():
    for name in ("device_count", "is_available", "current_device", "set_device", "synchronize", "Stream", "Event",
                 "current_stream", "default_stream", "stream", "memory_allocated", "max_memory_allocated",
                 "memory_reserved", "memory_stats", "reset_peak_memory_stats", "empty_cache", "manual_seed",
                 "manual_seed_all", "get_rng_state"):
        assert hasattr(torch.spyre, name), name
    assert torch.spyre.is_available()
    assert torch.spyre.device_count() >= 1
    assert torch.spyre.current_device() == 0


def test_generated_methods_for_tensors_and_modules():
    x = torch.ones(2, 2, dtype=torch.float16)
    assert x.spyre().is_spyre and not x.is_spyre
    m = torch.nn.Linear(2, 2).half().spyre()
    assert m.weight.device.type == "spyre"
    assert torch.device("spyre").type == "spyre"


def test_set_device_changes_where_factories_allocate():
    if torch.spyre.device_count() < 2:
        pytest.skip("needs SPYRE_LAB_DEVICES >= 2")
    torch.spyre.set_device(1)
    try:
        assert torch.empty(3, device="spyre:1").device.index == 1
        assert torch.spyre.current_device() == 1
    finally:
        torch.spyre.set_device(0)


def test_bad_device_index_names_the_fix():
    with pytest.raises(RuntimeError, match="SPYRE_LAB_DEVICES"):
        torch.spyre.memory_allocated(63)


def test_manual_seed_controls_random_ops_without_recursion():
    torch.spyre.manual_seed(7)
    a = torch.randn(4, device="spyre", dtype=torch.float16).cpu()
    torch.manual_seed(7)  # torch.manual_seed also calls torch.spyre.manual_seed_all
    b = torch.randn(4, device="spyre", dtype=torch.float16).cpu()
    assert torch.equal(a, b)
    assert isinstance(torch.spyre.get_rng_state(), torch.Tensor)


def test_autoload_warns_instead_of_raising(monkeypatch):
    from spyre_lab.runtime import registration

    def broken() -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(registration, "register", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runtime._autoload()
    assert any("could not register" in str(w.message) for w in caught)


def test_register_is_idempotent():
    runtime.register()
    runtime.register()
    assert torch.ones(1, device="spyre").device.type == "spyre"


def test_bad_devices_env_is_explained(monkeypatch):
    monkeypatch.setenv(devices.DEVICES_ENV, "many")
    with pytest.raises(ValueError, match="not an integer"):
        devices._count_from_env()


def test_every_torch_registration_is_in_the_kernel_table():
    """One table of what the backend registers with torch: no other runtime module calls torch.library."""
    import ast
    import pathlib

    from spyre_lab.runtime import kernel_table, ops  # noqa: F401  (ops: the second stage is installed)

    root = pathlib.Path(kernel_table.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "kernel_table.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("Library", "impl", "fallback", "custom_op"):
                offenders.append(f"{path.relative_to(root)}:{node.lineno} uses .{node.attr}")
    assert not offenders, offenders
    rows = kernel_table.installed()
    assert kernel_table.is_installed("import") and kernel_table.is_installed("first op")
    keys = {(str(r.op), r.key) for r in rows}
    assert (kernel_table.FALLBACK, "PrivateUse1") in keys and (kernel_table.FALLBACK, "SparsePrivateUse1") in keys
    assert ("aten._to_copy.default", "PrivateUse1") in keys and ("aten.mm.default", "AutocastPrivateUse1") in keys
    assert "the eager dispatcher" in kernel_table.describe()
