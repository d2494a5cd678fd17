"""Shared fixtures for the studies."""

import warnings

import pytest


@pytest.fixture(autouse=True)
def _quiet_fallbacks():
    # the engine's documented host fallbacks (embedding, rotary index) warn once per process; not under test here
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(CPU fallback|runs on the host).*")
        yield
