"""The spyre platform: the model runs on torch.device("spyre") from spyre_lab.runtime, in fp16.

Importing this module imports the runtime; if that fails, only this platform is unavailable
(`resolve_platform("spyre")` reports why). Like the Spyre vLLM plugin it uses static shapes:
prompts padded to prefill buckets and decode batches to batch buckets, all run once by
`LLM.warmup()`. Scheduler, block tables, slot mapping (and, for eager attention, masks) are built on the
host and copied over, a step's integers in one transfer; weights, KV cache and activations live on the device.

Two ways to run a step (the ``dispatch`` column of the engine's stats says which):

* ``"piecewise-compiled"`` (default, ``compile_blocks=True``): the model is compiled with
  ``torch.compile(fullgraph=True, dynamic=False)`` and split at attention (`piecewise`); each piece
  between two attentions is one device Program, identical blocks share one Program per bucket, and
  the paged attention runs between them as one launch per layer (`paged_kernel`: the KV write and the
  attention in one tiled kernel) while the compile options keep the ``attention`` fusion rule, or as
  about 11 eager device ops per layer without it (``compile_options={"fusion": ...}`` without
  "attention", or ``CompileOptions().without("attention")``). Linear weights are stored transposed
  at load time (`transposed_linear`). The compiles happen in `LLM.warmup()`, one bucket at a time.
* ``"eager-ops"`` (``compile_blocks=False``): every aten op is its own one-op program. Slow, but each
  op can be watched on its own.

Each step's modeled time is the span of the modeled events the runtime records while the step
runs (host program correction, PCIe copies, kernels).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.fx as fx
from torch import nn
from torch.utils._pytree import tree_leaves

from spyre_lab.compiler import cache as program_cache
from spyre_lab.compiler.backend import options_from
from spyre_lab.compiler.options import CompileOptions
from spyre_lab.engine.platforms.base import DeviceTime, Platform
from spyre_lab.engine.platforms.dispatch import BucketDispatch
from spyre_lab.engine.platforms.paged_attention_op import KernelAttention, OpaqueAttention
from spyre_lab.engine.platforms.piecewise import compiled_pieces, piecewise_backend
from spyre_lab.engine.platforms.spyre_layers import DEVICE_LAYERS
from spyre_lab.engine.platforms.transposed_linear import TRANSPOSED_LINEARS, TransposedWeight
from spyre_lab.runtime.dynamo_backend import CompiledGraph
from spyre_lab.runtime.stream import synchronize
from spyre_lab.runtime.timeline import recording


class SpyrePlatform(Platform):
    name: ClassVar[str] = "spyre"
    device_type: ClassVar[str] = "spyre"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float16,)
    default_dtype: ClassVar[torch.dtype] = torch.float16

    def __init__(
        self,
        static_shapes: bool = True,
        prefill_buckets: Sequence[int] | None = None,
        batch_buckets: Sequence[int] | None = None,
        compile_blocks: bool = True,
        transpose_weights: bool = True,
        compile_options: Mapping[str, Any] | CompileOptions | None = None,
        skip_guards: bool = True,
    ) -> None:
        if compile_blocks and not static_shapes:
            raise ValueError("compile_blocks=True needs static_shapes=True (one compiled program per bucket); "
                             "pass compile_blocks=False to run dynamic shapes op by op")
        self.compile_blocks, self.transpose_weights = compile_blocks, transpose_weights
        #: a compiled bucket's later steps run Dynamo's code for it without evaluating its guards (`dispatch`)
        self.skip_guards = skip_guards
        self.dispatch: BucketDispatch | None = None
        #: bucket ("prefill", 64) / ("decode", 4) -> its compiled pieces in call order (see spyre_lab.explain)
        self.compiled_pieces: dict[tuple[str, int], list[CompiledGraph]] = {}
        #: bucket -> the split graph a step runs: its compiled pieces with the attention calls between them
        self.split_graphs: dict[tuple[str, int], fx.GraphModule] = {}
        #: bucket -> program-cache counters while its pieces compiled: pieces, compiles, hits
        self.compile_stats: dict[tuple[str, int], dict[str, int]] = {}
        self._bucket: tuple[str, int] | None = None  # the step being run (set by device_timer)
        self.compile_options = (compile_options if isinstance(compile_options, CompileOptions)
                                else dict(compile_options or {}))
        #: attention as one paged-attention launch per layer: the compiled path with the "attention" rule on
        self.paged_kernel = compile_blocks and "attention" in options_from(compile_options).fusion
        self.needs_seq_query_lens = self.paged_kernel
        self.needs_attn_bias = not self.paged_kernel
        self.dispatch_mode = "piecewise-compiled" if compile_blocks else "eager-ops"
        super().__init__(static_shapes, prefill_buckets, batch_buckets)

    def register_ops(self) -> None:
        if not self.compile_blocks:
            return
        self.register_oot("Attention", KernelAttention if self.paged_kernel else OpaqueAttention)
        for name, layer in DEVICE_LAYERS.items():
            self.register_oot(name, layer)
        if self.transpose_weights:
            for name, layer in TRANSPOSED_LINEARS.items():
                self.register_oot(name, layer)

    def sharded_layers(self, sharded: Mapping[str, type]) -> dict[str, type]:
        """The sharded layers in this platform's forms (`spyre_parallel`): transposed weights, the paged-attention
        op, the all-reduce as an op the piecewise backend runs between pieces."""
        from spyre_lab.engine.platforms.spyre_parallel import spyre_sharded_layers

        if not self.compile_blocks:
            return dict(sharded)
        return spyre_sharded_layers(sharded, self.oot_ops.get("Attention"), self.transpose_weights)

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Store linear weights transposed, then compile the model piecewise (traced lazily, per bucket)."""
        if not self.compile_blocks:
            return model
        for module in model.modules():
            if isinstance(module, TransposedWeight):
                module.store_transposed()
        for layer, module in enumerate(m for m in model.modules() if isinstance(m, KernelAttention)):
            module.layer_index = layer                    # names its kernel: "paged attention L3"
        _COMPILED.add(self)
        self.dispatch = BucketDispatch(model) if self.skip_guards else None
        model.compile(backend=self._backend, fullgraph=True, dynamic=False)
        return model

    @property
    def num_buckets(self) -> int:
        return len(self.prefill_buckets or ()) + len(self.batch_buckets or ())

    def _backend(self, gm: fx.GraphModule, example_inputs: list[Any]) -> fx.GraphModule:
        """Dynamo calls this once per bucket (the first run of each shape) and per model."""
        options = {"options": self.compile_options} if self.compile_options else {}
        before = program_cache.stats()
        split = piecewise_backend(gm, example_inputs, **options)
        after = program_cache.stats()
        if self._bucket is not None:
            bucket = self._bucket
        else:  # the model called directly, outside an engine step: name the graph by its token count
            hidden = tree_leaves(next(n for n in gm.graph.nodes if n.op == "output").args)[0]
            bucket = ("call", hidden.meta["example_value"].shape[0])
        if self.dispatch is not None:
            self.dispatch.compiling(bucket)
        self.compiled_pieces[bucket] = pieces = compiled_pieces(split)
        self.split_graphs[bucket] = split
        self.compile_stats[bucket] = {"pieces": len(pieces), "compiles": after["compiles"] - before["compiles"],
                                          "hits": after["hits"] - before["hits"]}
        return split

    def run_model(self, model: nn.Module, *inputs: Any) -> Any:
        """A compiled bucket's steps after its first call run Dynamo's code for it without guard evaluation
        (`dispatch.BucketDispatch`); the first call, and every call with ``skip_guards=False``, go through Dynamo."""
        if self.dispatch is None:
            return model(*inputs)
        if self._bucket is None:                # called outside a timed step (runner.execute by hand)
            with _room_for_every_bucket():
                return self.dispatch(None, model, *inputs)
        return self.dispatch(self._bucket, model, *inputs)

    def explain_attention(self) -> str:
        """The paged-attention kernels' last launches (one per layer): shape, modeled time, blocks and bytes read,
        work division and tiles; or how attention runs when the kernel is off."""
        if not self.paged_kernel:
            return ("paged attention runs as eager device ops (the 'attention' fusion rule is off or the model is not "
                    "compiled): see each op in the step's trace")
        from spyre_lab.engine.platforms.paged_kernel import explain

        return explain()

    @contextlib.contextmanager
    def device_timer(self, kind: str, num_tokens: int, batch: int) -> Iterator[DeviceTime]:
        timing = DeviceTime()
        self._bucket = (kind, num_tokens)  # a decode step's num_tokens is its (padded) batch
        try:
            with _room_for_every_bucket(), recording() as trace:
                yield timing
        finally:
            self._bucket = None
        timing.modeled_ms = trace.duration_us / 1e3 if len(trace) else 0.0
        timing.trace = trace

    def synchronize(self) -> None:
        synchronize()


# Dynamo keeps one graph per bucket per model on the forward code object all models share; with
# fullgraph=True, reaching its recompile limit (default 8) is an error. Each step runs with the limit
# raised by the buckets of every live compiled model, and the user's setting is back after the step.
_COMPILED: weakref.WeakSet[SpyrePlatform] = weakref.WeakSet()


@contextlib.contextmanager
def _room_for_every_bucket() -> Iterator[None]:
    extra = sum(p.num_buckets for p in list(_COMPILED))
    config = torch._dynamo.config
    limit = config.recompile_limit              # set and restored by hand: config.patch costs ~20 us a step
    config.recompile_limit = limit + extra
    try:
        yield
    finally:
        config.recompile_limit = limit
