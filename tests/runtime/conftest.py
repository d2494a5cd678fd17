"""Shared fixtures for the spyre runtime tests: a clean modeled clock and fresh warning state (both through
:func:`spyre_lab.runtime.process_state.reset`); the number of cards is set for the whole suite in
``tests/conftest.py``."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import spyre_lab.runtime  # noqa: F401  (registers the device even with autoload switched off)
from spyre_lab.runtime import process_state


@pytest.fixture(autouse=True)
def clean_clock():
    """Every test starts at modeled time zero, on the default stream of spyre:0."""
    process_state.reset("clock")
    yield


@pytest.fixture
def fresh_warnings():
    """Forget which one-time warnings were already given (and the fallback counts: a warning names its op's first
    call site), so a test can observe them."""
    process_state.reset("warnings", "records")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        yield


def half(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.float16)


def pytest_collection_modifyitems(config, items):
    """Slow runtime checks (the full OpInfo sweep) run only when asked for with ``-m slow``."""
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    here = os.path.dirname(__file__)
    for item in items:
        if "slow" in item.keywords and str(item.path).startswith(here):
            item.add_marker(skip)
