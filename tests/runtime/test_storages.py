"""Spyre storages: clone, deep copies that keep aliasing as on the CPU, and clear errors instead of crashes.

torch's storage methods allocate with the backend's C++ allocator, which a Python backend cannot register, so
each of them used to kill the interpreter (exit 139). Every such call runs here in a subprocess: a crash
fails its test instead of ending the test run.
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

from spyre_lab.runtime.errors import SpyreUsageError

PRELUDE = """
import copy, io, pickle, warnings
import torch
import spyre_lab.runtime
warnings.simplefilter("ignore")
x = torch.arange(6, dtype=torch.float16).to("spyre")

class MyT(torch.Tensor):
    pass

class KeepsItsType(torch.Tensor):
    def new_empty(self, *args, **kwargs):
        return super().new_empty(*args, **kwargs).as_subclass(type(self))

def same_values(storage, like):
    held = torch.empty(0, dtype=like.dtype, device=storage.device).set_(storage)
    return torch.equal(held.cpu(), like.cpu()) and storage.data_ptr() != like.untyped_storage().data_ptr()
"""

WORKS = {
    "untyped_storage().clone()": "assert same_values(x.untyped_storage().clone(), x)",
    "storage().clone()": "assert x.storage().clone().tolist() == x.cpu().tolist()",
    "empty storage clone": "assert torch.empty(0, device='spyre').untyped_storage().clone().nbytes() == 0",
    "copy.deepcopy(storage)": "assert same_values(copy.deepcopy(x.untyped_storage()), x)",
    "storage.new()": "s = x.untyped_storage().new(); assert s.nbytes() == 0 and s.device == x.device",
    "deepcopy of a subclass that keeps its type": (
        "c = copy.deepcopy(x.as_subclass(KeepsItsType)); assert type(c) is KeepsItsType\n"
        "assert torch.equal(c.as_subclass(torch.Tensor).cpu(), x.cpu())"
    ),
}
"""Storage calls that work as on the CPU (each crashed the interpreter before)."""

REFUSED = {
    "torch.UntypedStorage(10, device='spyre')": ("torch.UntypedStorage(10, device='spyre')", r"untyped_storage\(\)"),
    "torch.TypedStorage(10, device='spyre')": ("torch.TypedStorage(10, dtype=torch.float16, device='spyre')",
                                               r"untyped_storage\(\)"),
    "UntypedStorage._new_shared": ("torch.UntypedStorage._new_shared(10, device='spyre')", r"untyped_storage\(\)"),
    "storage.resize_()": ("x.untyped_storage().resize_(100)", r"t\.resize_\(n\)"),
    "storage.byte()": ("x.untyped_storage().byte()", r"raw byte access"),
    "legacy torch.save": ("torch.save(x, io.BytesIO(), _use_new_zipfile_serialization=False)", r"t\.cpu\(\)"),
}
"""Storage calls the card cannot honour: a SpyreUsageError naming the tensor-level way (each crashed before or
named the wrong cause)."""



def _isolated(body: str) -> subprocess.CompletedProcess:
    script = PRELUDE + "try:\n" + textwrap.indent(body, "    ") + textwrap.dedent("""
            print("RESULT ok")
        except Exception as exc:
            print("RESULT", type(exc).__name__, "|", str(exc).replace(chr(10), " "))
    """)
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)


def _result(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, f"the interpreter died (exit {done.returncode}): {done.stderr[-800:]}"
    return next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))


@pytest.mark.parametrize("case", sorted(WORKS))
def test_storage_copies_work_instead_of_crashing(case):
    assert _result(_isolated(WORKS[case])) == "RESULT ok"


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_raw_storage_requests_get_a_clear_error_instead_of_crashing(case):
    import re

    body, fix = REFUSED[case]
    result = _result(_isolated(body))
    assert result.startswith("RESULT SpyreUsageError |"), result
    assert re.search(fix, result), f"{case}: the error does not name the way to do it: {result}"


class MyT(torch.Tensor):
    pass


def test_deepcopy_of_a_plain_subclass_ends_as_on_the_cpu():
    with pytest.raises(Exception) as on_cpu:          # torch's own verdict for a subclass without new_empty
        copy.deepcopy(torch.arange(6, dtype=torch.float16).as_subclass(MyT))
    on_spyre = _result(_isolated("copy.deepcopy(x.as_subclass(MyT))"))
    assert on_spyre.startswith(f"RESULT {type(on_cpu.value).__name__} |"), (on_cpu.value, on_spyre)


# --- deepcopy keeps aliasing (in process: the calls above show it no longer crashes) --------------------
VIEWS = {
    "slice": lambda t: t[1:],
    "transpose": lambda t: t.t(),
    "reshape view": lambda t: t.view(-1),
    "narrow": lambda t: t.narrow(1, 1, 2),
    "diagonal": lambda t: t.diagonal(),
    "as_strided": lambda t: t.as_strided((2, 2), (1, 3), 1),
}


def _sharing(leaves):
    """Which leaves share a storage (as group numbers in order of first appearance), with their geometry."""
    groups: dict[int, int] = {}
    return [(groups.setdefault(t.untyped_storage().data_ptr(), len(groups)), t.storage_offset(), tuple(t.shape),
             t.stride()) for t in leaves]


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_deepcopy_keeps_a_tensor_and_its_view_on_one_storage(view):
    base = torch.arange(12, dtype=torch.float16).reshape(3, 4)

    def structure(device):
        placed = base.clone().to(device)
        return {"base": placed, "view": VIEWS[view](placed), "other": torch.ones(2, dtype=torch.float16).to(device)}

    structures = {device: structure(device) for device in ("cpu", "spyre")}
    copies = {device: copy.deepcopy(s) for device, s in structures.items()}
    assert _sharing(copies["spyre"].values()) == _sharing(copies["cpu"].values())
    original = structures["spyre"]["base"].untyped_storage().data_ptr()
    assert copies["spyre"]["base"].untyped_storage().data_ptr() != original
    for device in ("cpu", "spyre"):                                    # a write through one copy shows in the other
        copies[device]["base"].fill_(-1)
    assert torch.equal(copies["spyre"]["view"].cpu(), copies["cpu"]["view"])
    assert torch.equal(structures["spyre"]["view"].cpu(), VIEWS[view](base))   # the original is untouched


def test_deepcopy_of_a_module_keeps_buffers_that_view_each_other_aliased():
    def build(device):
        module = torch.nn.Module()
        table = torch.arange(8, dtype=torch.float16).to(device)
        module.register_buffer("table", table)
        module.register_buffer("tail", table[4:])
        return module

    for device in ("cpu", "spyre"):
        twin = copy.deepcopy(build(device))
        twin.table.zero_()
        assert torch.equal(twin.tail.cpu(), torch.zeros(4, dtype=torch.float16)), device


def test_deepcopy_keeps_identity_requires_grad_and_attributes():
    x = torch.arange(4, dtype=torch.float16).to("spyre").requires_grad_()
    x.note = {"origin": "test"}
    twin = copy.deepcopy([x, x])
    assert twin[0] is twin[1]
    assert twin[0].requires_grad and twin[0].note == x.note and twin[0].note is not x.note
    assert torch.equal(twin[0].detach().cpu(), x.detach().cpu())


# --- messages that used to mislead -------------------------------------------------------------------
@pytest.mark.parametrize("what", ["tensor", "view", "storage", "module"])
def test_pickling_a_spyre_tensor_asks_for_a_cpu_copy(what):
    x = torch.arange(4, dtype=torch.float16).to("spyre")
    obj = {"tensor": x, "view": x[1:], "storage": x.untyped_storage(),
           "module": torch.nn.Linear(2, 2).half().to("spyre")}[what]
    with pytest.raises(SpyreUsageError, match=r"pickle\.dumps\(t\.cpu\(\)\)") as caught:
        pickle.dumps(obj)
    assert "made by pickle" not in str(caught.value) and "by\npickle" not in str(caught.value)


def test_a_cpu_copy_pickles_and_comes_back():
    x = torch.arange(4, dtype=torch.float16).to("spyre")
    assert torch.equal(pickle.loads(pickle.dumps(x.cpu())).to("spyre").cpu(), x.cpu())


BYTE_ACCESS = {
    "fill_": lambda s: s.fill_(0),
    "setitem": lambda s: s.__setitem__(0, 1),
    "getitem": lambda s: s[0],
    "tolist": lambda s: s.tolist(),
    "float()": lambda s: s.float(),
    "cpu()": lambda s: s.cpu(),
    "copy_": lambda s: s.copy_(torch.zeros(4, dtype=torch.float16).untyped_storage()),
}


@pytest.mark.parametrize("access", sorted(BYTE_ACCESS))
def test_byte_access_to_a_storage_names_the_tensor_way(access):
    x = torch.arange(4, dtype=torch.float16).to("spyre")
    with pytest.raises(SpyreUsageError, match=r"raw byte access to a spyre storage.*t\.zero_\(\)") as caught:
        BYTE_ACCESS[access](x.untyped_storage())
    assert "correction blob" not in str(caught.value)
    assert torch.equal(x.cpu(), torch.arange(4, dtype=torch.float16))     # nothing was written


def test_byte_access_works_where_the_elements_are_bytes():
    x = torch.arange(4, dtype=torch.uint8).to("spyre")
    x.untyped_storage().fill_(7)
    assert torch.equal(x.cpu(), torch.full((4,), 7, dtype=torch.uint8))


@pytest.mark.parametrize("dtype", [torch.int64, torch.float16, torch.bool])
def test_deepcopy_of_a_zero_dim_tensor_works(dtype):
    x = torch.tensor(3, dtype=dtype).to("spyre")
    twin = copy.deepcopy(x)
    assert twin.shape == () and twin.dtype == dtype and torch.equal(twin.cpu(), x.cpu())
