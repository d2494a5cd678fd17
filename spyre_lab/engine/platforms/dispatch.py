"""Guard-free dispatch: once a bucket is compiled, a step runs Dynamo's code for it without evaluating guards.

Every call of a ``torch.compile``d model first evaluates the guards of its cached graphs (is ``meta`` still an
``AttentionMetadata``, does every one of the ~40 weights and caches still have its dtype, shape and strides,
is grad mode still off, ...) to pick the graph to run. For tiny-granite that is about 900 guards, and right after
a step has run they are cold in the CPU caches: measured, ~0.4 ms of host time a decode step. vLLM skips that
work with its custom dispatcher: after the compile it keeps the bytecode Dynamo made for the model's
``forward`` (which reads the weights and inputs off the module and calls the compiled graph) and later calls
that code directly. The engine does the same, per bucket:

* while a bucket compiles, the platform's backend records the compile's id (:meth:`BucketDispatch.compiling`);
* after that bucket's first call through Dynamo, :meth:`BucketDispatch.bind` finds the cache entry that compile
  made, checks its guards once against the call's arguments, and keeps its code as a function;
* later calls of the bucket run that function: the same graph, the same inputs, minus the guard evaluation.

A bucket fixes every input's shape (the model runner pads to it), the engine runs the model only under
``inference_mode``, and nothing changes the loaded model's weights' shapes, so the guards it skips would pass.
A model changed after warmup in a way its guards would catch (a weight of another shape or dtype) must be
run without this: ``SpyrePlatform(skip_guards=False)`` calls the model through Dynamo every step.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Bucket = tuple[str, int]


class BucketDispatch:
    """One compiled model's buckets, each bound to the code Dynamo made for it (see module doc)."""

    def __init__(self, model: nn.Module) -> None:
        self._model = weakref.ref(model)
        self._forward = type(model).forward
        self._compile_ids: dict[Bucket, Any] = {}
        self._bound: dict[Bucket, Callable[..., Any]] = {}
        #: model calls per path: "direct" (bound code, no guards) and "dynamo" (through torch.compile)
        self.calls = {"direct": 0, "dynamo": 0}

    @property
    def buckets(self) -> list[Bucket]:
        """The buckets whose steps skip guard evaluation."""
        return sorted(self._bound)

    def compiling(self, bucket: Bucket) -> None:
        """Called by the backend while Dynamo compiles ``bucket``: remember which compile makes its graph."""
        compile_id = torch._guards.CompileContext.current_compile_id()
        if compile_id is not None:
            self._compile_ids[bucket] = compile_id
            self._bound.pop(bucket, None)            # a recompile replaces the bucket's code

    def __call__(self, bucket: Bucket | None, model: nn.Module, *args: Any) -> Any:
        run = self._bound.get(bucket) if bucket is not None else None
        if run is not None and model is self._model():
            self.calls["direct"] += 1
            return run(model, *args)
        self.calls["dynamo"] += 1
        out = model(*args)
        if bucket is not None and bucket in self._compile_ids and bucket not in self._bound:
            self.bind(bucket, model, args)
        return out

    def bind(self, bucket: Bucket, model: nn.Module, args: tuple[Any, ...]) -> bool:
        """Keep the code of the cache entry ``bucket``'s compile made, if its guards pass for ``args``."""
        if model is not self._model():
            return False
        code = self._forward.__code__
        names = code.co_varnames[:code.co_argcount]
        if len(names) != len(args) + 1:
            return False
        f_locals = dict(zip(names, (model, *args)))
        try:
            entries = torch._dynamo.eval_frame._debug_get_cache_entry_list(code)
        except AttributeError:                          # another torch: stay on the guarded path
            return False
        for entry in entries:
            if entry.compile_id == self._compile_ids[bucket] and entry.guard_manager.check(f_locals):
                forward = self._forward
                try:
                    self._bound[bucket] = types.FunctionType(entry.code, forward.__globals__, forward.__name__,
                                                             forward.__defaults__, forward.__closure__)
                except (TypeError, ValueError):        # code that does not fit the function: stay guarded
                    return False
                return True
        return False
