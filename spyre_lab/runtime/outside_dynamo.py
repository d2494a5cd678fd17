"""Run the backend's kernels outside Dynamo, at the cost of two C calls.

Every ATen op on a spyre tensor enters a Python kernel of ours through the dispatcher. Under ``torch.compile`` a
graph break runs ops eagerly with Dynamo's frame callback still installed, and Dynamo would then try to compile
the runtime's own frames; so the kernels run with the callback removed, as ``torch._dynamo.disable`` does.
``torch._disable_dynamo``'s wrapper costs about ten Python calls per op (a lazy import check, the stance lookup,
an export check, three ``set_eval_frame`` calls); what it achieves for a kernel called by the dispatcher is
only this: no frame callback while the kernel runs, the caller's callback back afterwards.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

_set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame

def outside_dynamo(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run with Dynamo's frame callback removed (restored on return), marked as Dynamo-disabled so Dynamo
    never traces into it if it meets it as a call."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        prior = _set_eval_frame(None)
        if prior is None:                    # plain eager code: nothing to restore
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            _set_eval_frame(prior)

    run._torchdynamo_disable = True          # type: ignore[attr-defined]  (what torch._dynamo.disable marks)
    run._torchdynamo_orig_callable = fn      # type: ignore[attr-defined]
    return run
