"""After a warmup the engine freezes the startup heap (as vLLM does), and the next warmup collects what it left."""

from __future__ import annotations

import gc
import weakref

import pytest

from spyre_lab.engine import LLMEngine

OPTIONS = dict(static_shapes=True, prefill_buckets=[16], batch_buckets=[1], max_model_len=16, max_num_seqs=1)


class _Node:
    """A reference cycle: only the cyclic collector can free it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def _heap_left_as_found():
    yield
    gc.unfreeze()
    LLMEngine.freeze_heap_after_warmup = True


def test_a_warmup_freezes_the_heap_and_the_next_warmup_collects_cycles_it_had_frozen():
    gc.unfreeze()
    cycle = _Node()
    alive = weakref.ref(cycle)
    LLMEngine("tiny-granite", **OPTIONS).warmup(show_progress=False)
    assert gc.get_freeze_count() > 0
    del cycle
    gc.collect()
    assert alive() is not None                  # frozen: the collector does not look at it
    LLMEngine("tiny-granite", **OPTIONS).warmup(show_progress=False)
    assert alive() is None                      # unfrozen, collected, then the new heap frozen


def test_the_freeze_can_be_switched_off():
    gc.unfreeze()
    LLMEngine.freeze_heap_after_warmup = False
    LLMEngine("tiny-granite", **OPTIONS).warmup(show_progress=False)
    assert gc.get_freeze_count() == 0
