"""One rule, as CUDA's: an index-less ``"spyre"`` means the current card, whatever road torch takes to it.

torch completes a missing index in C++ for some calls (``.to``, ``torch.tensor``) and leaves it to the backend
for others (factories), so every placement is checked under both ways of choosing a card.
"""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from torch.overrides import BaseTorchFunctionMode

from spyre_lab.runtime import current_card

pytestmark = pytest.mark.skipif(torch.spyre.device_count() < 2, reason="needs SPYRE_LAB_DEVICES >= 2")

CPU = torch.tensor([1.0, 2.0], dtype=torch.float16)

PLACEMENTS = {
    "x.to('spyre')": lambda: CPU.to("spyre"),
    "x.to(torch.device('spyre'))": lambda: CPU.to(torch.device("spyre")),
    "x.to(device='spyre')": lambda: CPU.to(device="spyre"),
    "x.to('spyre', dtype)": lambda: CPU.to("spyre", torch.float16),
    "spyre:0 tensor .to('spyre')": lambda: CPU.to("spyre:0").to("spyre"),
    "torch.tensor": lambda: torch.tensor([1.0], dtype=torch.float16, device="spyre"),
    "torch.as_tensor": lambda: torch.as_tensor([1.0], dtype=torch.float16, device="spyre"),
    "torch.asarray": lambda: torch.asarray([1.0], dtype=torch.float16, device="spyre"),
    "torch.scalar_tensor": lambda: torch.scalar_tensor(1.0, dtype=torch.float16, device="spyre"),
    "x.new_tensor": lambda: CPU.new_tensor([1.0], device="spyre"),
    "torch.ones": lambda: torch.ones(2, dtype=torch.float16, device="spyre"),
    "torch.zeros_like": lambda: torch.zeros_like(CPU, device="spyre"),
    "x.spyre()": lambda: CPU.spyre(),
    "nn.Linear.to('spyre')": lambda: torch.nn.Linear(2, 2).half().to("spyre").weight,
    "nn.Linear.to(device=)": lambda: torch.nn.Linear(2, 2).half().to(device="spyre").bias,
    "nn.Linear.spyre()": lambda: torch.nn.Linear(2, 2).half().spyre().weight,
    "nn.Linear.to_empty": lambda: torch.nn.Linear(2, 2).half().to_empty(device="spyre").weight,
    "with torch.device('spyre')": lambda: _in_default_device(lambda: torch.tensor([1.0], dtype=torch.float16)),
}


def _in_default_device(make):
    with torch.device("spyre"):
        return make()


@contextlib.contextmanager
def _with_block():
    with torch.spyre.device(1):
        yield


@contextlib.contextmanager
def _after_set_device():
    torch.spyre.set_device(1)
    try:
        yield
    finally:
        torch.spyre.set_device(0)


@contextlib.contextmanager
def _accelerator_block():
    with torch.accelerator.device_index(1):
        yield


CHOICES = {"with torch.spyre.device(1)": _with_block, "torch.spyre.set_device(1)": _after_set_device,
           "with torch.accelerator.device_index(1)": _accelerator_block}


@pytest.mark.parametrize("choice", sorted(CHOICES))
@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_an_indexless_spyre_lands_on_the_current_card(placement, choice):
    with CHOICES[choice]():
        made = PLACEMENTS[placement]()
        assert made.device == torch.device("spyre", 1), f"{placement} under {choice}"
    assert PLACEMENTS[placement]().device == torch.device("spyre", 0)   # and on spyre:0 again once it is current


def test_an_explicit_index_is_kept_whatever_the_current_card():
    with torch.spyre.device(1):
        assert CPU.to("spyre:0").device == torch.device("spyre", 0)
        assert torch.tensor([1.0], dtype=torch.float16, device="spyre:0").device == torch.device("spyre", 0)
        assert torch.nn.Linear(2, 2).half().to("spyre:0").weight.device == torch.device("spyre", 0)
    with torch.spyre.device(0):
        assert CPU.to("spyre:1").device == torch.device("spyre", 1)


def test_torch_accelerator_reads_and_sets_the_current_card():
    with torch.spyre.device(1):
        assert torch.accelerator.current_device_index() == 1
    torch.accelerator.set_device_index(1)
    try:
        assert torch.spyre.current_device() == 1
        assert CPU.to("spyre").device == torch.device("spyre", 1)
        torch.accelerator.set_device_index(-1)                 # torch documents a negative index as a no-op
        assert torch.spyre.current_device() == 1
    finally:
        torch.accelerator.set_device_index(0)
    assert torch.accelerator.current_device_index() == 0


def test_the_current_card_belongs_to_the_thread_that_chose_it():
    seen = {}

    def worker():
        seen["start"] = (torch.spyre.current_device(), CPU.to("spyre").device,
                         torch.ones(1, device="spyre").device)
        torch.spyre.set_device(1)
        seen["set"] = CPU.to("spyre").device

    with torch.spyre.device(1):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        assert CPU.to("spyre").device == torch.device("spyre", 1)
    assert seen["start"] == (0, torch.device("spyre", 0), torch.device("spyre", 0))
    assert seen["set"] == torch.device("spyre", 1)
    assert torch.spyre.current_device() == 0 and CPU.to("spyre").device == torch.device("spyre", 0)


def test_a_mode_entered_around_set_device_does_not_take_the_current_card_with_it():
    with BaseTorchFunctionMode():
        torch.spyre.set_device(1)
    try:
        assert CPU.to("spyre").device == torch.device("spyre", 1)   # the user's mode left; the rule stayed
    finally:
        torch.spyre.set_device(0)
    assert current_card.installed() is None                     # nothing is left on spyre:0


def test_compiled_code_runs_on_the_current_card():
    with torch.spyre.device(1):
        x = CPU.to("spyre")
        got = torch.compile(lambda a: a * 2 + 1, backend="spyre")(x)
        assert got.device == torch.device("spyre", 1)
        assert torch.equal(got.cpu(), CPU * 2 + 1)
