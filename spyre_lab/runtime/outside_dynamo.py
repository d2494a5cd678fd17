"""Every backend kernel runs outside Dynamo: one place that says how.

Every ATen op on a spyre tensor enters a Python kernel of ours through the dispatcher. Under ``torch.compile`` a
graph break runs ops eagerly with Dynamo's frame callback still installed, and Dynamo would then try to compile
the runtime's own frames; so the kernels run with the callback removed. ``torch._disable_dynamo``'s wrapper costs
about ten Python calls per op (measured: about 4 k of a cached eager op's 237 k instructions), and a leaner wrapper
of our own was tried and withdrawn: its frame lives outside torch, so Dynamo's callback meets it before it can
clear the callback (see :func:`outside_dynamo`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def outside_dynamo(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run with Dynamo's frame callback removed (restored on return), marked as Dynamo-disabled.

    This is ``torch._disable_dynamo``'s wrapper itself: a leaner wrapper of our own clears the callback just as
    well, but its frame lives outside torch, so under a graph break Dynamo's callback meets it first and warns
    that it cannot trace ``set_eval_frame`` (tests/compiler/test_data_dependent.py holds this)."""
    return torch._disable_dynamo(fn)
