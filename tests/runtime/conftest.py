"""Shared fixtures for the spyre runtime tests: a clean modeled clock and fresh warning state."""

from __future__ import annotations

import os
import warnings

import pytest

os.environ.setdefault("SPYRE_LAB_DEVICES", "2")

import torch

import spyre_lab.runtime  # noqa: F401  (registers the device even with autoload switched off)
from spyre_lab.runtime import fallback, tensor
from spyre_lab.runtime.stream import reset_time


@pytest.fixture(autouse=True)
def clean_clock():
    """Every test starts at modeled time zero on the default stream of spyre:0."""
    reset_time()
    torch.spyre.set_device(0)
    yield


@pytest.fixture
def fresh_warnings():
    """Forget which one-time warnings were already given, so a test can observe them."""
    saved_ops, saved_dtypes = set(fallback._warned_ops), set(tensor._warned_dtypes)
    saved_stats = dict(fallback._PROCESS_LOG.stats)   # a warning names its op's first call site: start afresh
    fallback._warned_ops.clear()
    tensor._warned_dtypes.clear()
    fallback._PROCESS_LOG.stats.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        yield
    fallback._warned_ops.update(saved_ops)
    tensor._warned_dtypes.update(saved_dtypes)
    fallback._PROCESS_LOG.stats.update(saved_stats)


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
