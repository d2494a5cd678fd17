"""Every backend kernel runs outside Dynamo: one place that says how.

Every ATen op on a spyre tensor enters a Python kernel of ours through the dispatcher. Under ``torch.compile`` a
graph break runs ops eagerly with Dynamo's frame callback still installed, and Dynamo would then try to compile
the runtime's own frames. So each kernel's code object is marked, once, to be skipped by that callback, it and
every frame it calls (Dynamo's frame strategy ``SKIP`` for the frame and recursively: the callback is set aside
while the kernel runs). A marked kernel is the plain function: an eager op pays nothing for it.

Two other ways were measured and left: ``torch._disable_dynamo``'s wrapper clears and restores the callback
around every call (about ten Python calls and two ``set_eval_frame`` per op, some 4 k of a cached eager op's
237 k instructions), and a leaner wrapper of our own doing the same had its frame met by the callback before it
could clear it, which then warned that it cannot trace ``set_eval_frame`` (tests/compiler/test_data_dependent.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy


def outside_dynamo(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` itself, its code marked so that Dynamo's frame callback skips it and every frame it calls (the C
    module's strategy table, not ``torch._dynamo``: importing this imports no Dynamo). Every function made from
    one ``def`` shares its code object, so marking one marks them all."""
    set_code_exec_strategy(fn.__code__, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    return fn
