"""A Granite-3.3-8B-shaped engine step on the modeled card, timed without weights.

The model is the engine's own ``GraniteForCausalLM`` with the published architecture (hidden 4096,
40 layers, 32 query / 8 KV heads of 128, intermediate 12800, vocabulary 49159, tied embeddings,
Granite's four multipliers). It is built on the meta device, so no weight is ever allocated on the
host, and given DRAM on the card with ``to_empty``: a spyre tensor's payload only materialises when
written, so the 16 GB of weights are addresses, not bytes. The spyre platform then does what it does
for tiny-granite: linear weights stored transposed, the model compiled piecewise per bucket with
identical layers sharing one Program, paged attention as eager device ops between the pieces, every
launch through the runtime's JobPlan path. The runtime runs in ``timing_only()``: each launch is
planned, enqueued and timed by the analytic simulator as usual, only the numerics are skipped.

Depth: decoder layers are identical, so each adds the same launches and the same modeled time to a
step. A study therefore runs the real path at two depths (``PROBE_DEPTHS``) and extends the per-layer
difference to 40 layers (:meth:`StepTiming.extend`), which keeps Dynamo from tracing 40 layers for
every bucket and every configuration. ``depth="full"`` runs all 40 layers instead; the tests check
that the two agree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from spyre_lab.engine.models.config import ModelConfig
from spyre_lab.engine.platforms.paged_attention_op import ATTENTION_LANE

GRANITE_3_3_8B = ModelConfig(
    architecture="GraniteForCausalLM", vocab_size=49159, hidden_size=4096, intermediate_size=12800,
    num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=10_000_000.0, tie_word_embeddings=True,
    embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125, logits_scaling=16.0,
)
"""ibm-granite/granite-3.3-8b-instruct's architecture (its published config.json)."""

PROBE_DEPTHS = (2, 3)
"""Depths the real path runs at; the difference is one decoder layer (one middle piece + one attention)."""

PREFILL_TOKENS = 1024
CONTEXT = 1024
BLOCK_SIZE = 16


@dataclass(frozen=True)
class StepConfig:
    """How the stack runs a step: the mechanisms the published speed-ups are credited to, each a switch.

    ``compile_blocks``: piecewise-compiled blocks (False: every ATen op a one-op launch).
    ``transpose_weights``: linear weights stored as ``W^T`` once at load (False: a restickify per call).
    ``dispatch``: ``"aot_patch"`` (programs built once, addresses patched per launch) or ``"rebuild"``
    (the execution graph rebuilt on the host at every launch). ``overlap``: the host prepares the next
    launch while the card runs this one (False: it waits for every launch). ``attention_kernel``: with
    compiled blocks, each layer's paged attention is one kernel (the compiler's ``attention`` rule; False:
    the engine's eager device ops), a mechanism beyond the published stack. ``tensor_parallel``: the cards the
    model is split across (:mod:`~spyre_lab.studies.tp_sharding`): one rank's programs on the shapes one card of
    ``k`` holds, timed on the real path, plus the group's modeled collectives (spyreccl is synchronous, so they
    add to the step: :attr:`StepTiming.collective_us`).
    """

    compile_blocks: bool = True
    transpose_weights: bool = True
    dispatch: str = "aot_patch"
    overlap: bool = True
    attention_kernel: bool = True
    tensor_parallel: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.tensor_parallel, int) or isinstance(self.tensor_parallel, bool) \
                or self.tensor_parallel < 1:
            raise ValueError(f"StepConfig.tensor_parallel is the number of cards, an int >= 1; got "
                             f"{self.tensor_parallel!r}")

    def traced(self) -> StepConfig:
        """This configuration with the runtime-only options (``dispatch``, ``overlap``) at their defaults.

        Dynamo's trace, the compiled programs and the model's weights see only the other fields: two
        configurations with one ``traced()`` run the same model and programs, launched differently."""
        return dataclasses.replace(self, dispatch=StepConfig.dispatch, overlap=StepConfig.overlap)

    def differs_from(self, other: StepConfig) -> dict[str, tuple[object, object]]:
        """Field -> (this, other) for every field the two configurations set differently."""
        return {f.name: (getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(other, f.name)}


@dataclass
class StepTiming:
    """Modeled times of one engine step (µs) and what it launched.

    ``host_us``: the host thread busy (enqueue, program correction callbacks, graph rebuilds, host
    fallbacks), waits excluded. ``device_us``: the cores busy. ``step_us``: the step's span, first
    event to last. ``launches``: compute launches on the card. ``attention_us``: the part of ``device_us``
    spent in paged attention (the one-launch kernels, or the eager ops of the attention regions the
    engine marks), ``attention_launches`` the launches it took; both read off the step's trace events.
    ``collective_us``: at ``tensor_parallel > 1``, the part of ``step_us`` the group's collectives take
    (``collectives`` of them, ``collective_latency_us`` of it message latency rather than bytes); ``compute_us``
    is the rest, the rank's own step.
    """

    step_us: float
    host_us: float
    device_us: float
    launches: int
    depth: int
    wall_s: float = 0.0
    extended_from: tuple[int, ...] = ()
    log: object = field(default=None, repr=False, compare=False)   # the step's StepLog (retime.py), when recorded
    attention_us: float = 0.0
    attention_launches: int = 0
    collective_us: float = 0.0
    collectives: int = 0
    collective_latency_us: float = 0.0

    @property
    def compute_us(self) -> float:
        """The rank's own step: ``step_us`` without the collectives."""
        return self.step_us - self.collective_us

    @property
    def collective_share(self) -> float:
        """The collectives' share of the step (0 at TP 1)."""
        return self.collective_us / self.step_us if self.step_us else 0.0

    def with_collectives(self, costs: Sequence[object], latency_us: float) -> StepTiming:
        """This rank's step followed by ``costs`` (CollectiveCosts; spyreccl is synchronous: no overlap)."""
        total = sum(c.us for c in costs)
        return dataclasses.replace(self, step_us=self.step_us + total, collective_us=self.collective_us + total,
                                   collectives=self.collectives + len(costs),
                                   collective_latency_us=self.collective_latency_us
                                   + sum(c.rounds * latency_us for c in costs))

    @property
    def attention_share(self) -> float:
        """Attention's share of the step's modeled device time."""
        return self.attention_us / self.device_us if self.device_us else 0.0

    @staticmethod
    def extend(shallow: StepTiming, deep: StepTiming, layers: int) -> StepTiming:
        """The step at ``layers`` layers: ``deep`` plus (layers - deep.depth) times the per-layer difference."""
        per = deep.depth - shallow.depth
        if per <= 0:
            raise ValueError(f"extend needs two depths, the second deeper; got {shallow.depth} and {deep.depth}")
        k = (layers - deep.depth) / per

        def grow(a: float, b: float) -> float:
            return b + (b - a) * k

        log = (shallow.log, deep.log, layers) if shallow.log is not None and deep.log is not None else None
        return StepTiming(grow(shallow.step_us, deep.step_us), grow(shallow.host_us, deep.host_us),
                          grow(shallow.device_us, deep.device_us),
                          round(grow(shallow.launches, deep.launches)), layers,
                          shallow.wall_s + deep.wall_s, (shallow.depth, deep.depth), log,
                          grow(shallow.attention_us, deep.attention_us),
                          round(grow(shallow.attention_launches, deep.attention_launches)))

    def to_dict(self) -> dict[str, float | int | list[int]]:
        return {"step_us": self.step_us, "host_us": self.host_us, "device_us": self.device_us,
                "launches": self.launches, "depth": self.depth, "extended_from": list(self.extended_from),
                "attention_us": self.attention_us, "attention_launches": self.attention_launches,
                "collective_us": self.collective_us, "collectives": self.collectives}


def _busy(intervals: list[tuple[float, float]]) -> float:
    total, cursor = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > cursor:
            total += end - max(start, cursor)
            cursor = end
    return total


def summarize(trace: object, depth: int, wall_s: float = 0.0) -> StepTiming:
    """Host, device and step time of one step's recorded trace (lanes as the runtime names them)."""
    events = trace.events
    host = [(e.start_us, e.start_us + e.dur_us) for e in events
            if e.lane in ("host", "host.callback") and not e.args.get("waiting")]
    device = [(e.start_us, e.start_us + e.dur_us) for e in events
              if e.lane.startswith("stream") and e.args.get("kind") == "Compute"]
    from spyre_lab.studies.retime import StepLog

    attention = attention_launches(events)
    return StepTiming(trace.duration_us if events else 0.0, _busy(host), _busy(device), len(device), depth, wall_s,
                      log=StepLog.from_trace(trace, depth), attention_us=_busy(attention),
                      attention_launches=len(attention))


def attention_launches(events: list) -> list[tuple[float, float]]:
    """(start, end) of every attention launch on the card among a step's events: the paged-attention kernels
    ("paged attention L<i>"), or each compute launch inside a region the engine marked on the attention lane."""
    regions = [(e.start_us, e.start_us + e.dur_us) for e in events if e.lane == ATTENTION_LANE]
    out = []
    for e in events:
        if not (e.lane.startswith("stream") and e.args.get("kind") == "Compute"):
            continue
        end = e.start_us + e.dur_us
        if e.name.startswith("paged attention") or any(lo <= e.start_us and end <= hi for lo, hi in regions):
            out.append((e.start_us, end))
    return out


def build_model(config: ModelConfig, platform: object, dtype: torch.dtype = torch.float16) -> torch.nn.Module:
    """The engine's model for ``config`` under ``platform``: built on meta, given card DRAM without data.

    Linear weights are transposed on meta (free) when the platform stores them so; ``prepare_model``
    then finds them stored and compiles the model.
    """
    from spyre_lab.engine.models.granite import MODEL_REGISTRY
    from spyre_lab.engine.platforms.base import set_current_platform
    from spyre_lab.engine.platforms.transposed_linear import TransposedWeight

    with set_current_platform(platform), torch.device("meta"):
        model = MODEL_REGISTRY[config.architecture](config).to(dtype)
    if getattr(platform, "compile_blocks", False) and getattr(platform, "transpose_weights", False):
        for module in model.modules():
            if isinstance(module, TransposedWeight):
                module.store_transposed()
    model.to_empty(device=platform.device)
    if config.tie_word_embeddings:          # to_empty gives each module its own tensor: tie them again
        model.lm_head.tie_to(model.model.embed_tokens)
    model.eval()
    return platform.prepare_model(model)


@contextlib.contextmanager
def _runtime(step: StepConfig) -> Iterator[None]:
    from spyre_lab.runtime.launch import RuntimeOptions, set_default_options, timing_only

    previous = set_default_options(RuntimeOptions(dispatch=step.dispatch, overlap=step.overlap))
    try:
        with timing_only():
            yield
    finally:
        set_default_options(previous)


@dataclass
class EngineProbe:
    """The real spyre-platform path for one model depth and one StepConfig, ready to time buckets."""

    config: ModelConfig
    step: StepConfig
    prefill_buckets: tuple[int, ...]
    batch_buckets: tuple[int, ...]
    compile_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        from spyre_lab.compiler.backend import options_from
        from spyre_lab.engine.model_runner import ModelRunner
        from spyre_lab.engine.platforms.spyre import SpyrePlatform

        options = self.compile_options or None
        if not self.step.attention_kernel:
            options = options_from(options).without("attention")
        self.platform = SpyrePlatform(prefill_buckets=list(self.prefill_buckets),
                                      batch_buckets=list(self.batch_buckets), compile_blocks=self.step.compile_blocks,
                                      transpose_weights=self.step.transpose_weights, compile_options=options)
        max_len = max(CONTEXT, *self.prefill_buckets) + BLOCK_SIZE
        blocks = max(self.batch_buckets) * -(-max_len // BLOCK_SIZE)
        # the step reads positions below max_len only: a rotary table for all 131072 would be 384 MB of host float64
        positions = min(self.config.max_position_embeddings, max_len)
        built = dataclasses.replace(self.config, max_position_embeddings=positions)
        with _runtime(self.step):
            self.model = build_model(built, self.platform)
            self.runner = ModelRunner(self.model, self.platform, BLOCK_SIZE, blocks, max_len, torch.float16)

    def time(self, kind: str, size: int, repeats: int = 2, step: StepConfig | None = None) -> StepTiming:
        """One bucket's step: the first run compiles it, the last is the steady state that is reported.

        ``step`` (default: the probe's own) may differ from the probe's in the runtime-only options only
        (``StepConfig.traced``): the same model and programs, launched with that dispatch and overlap."""
        from spyre_lab.runtime.stream import reset_time
        from spyre_lab.runtime.timeline import recording

        if repeats < 1:
            raise ValueError(f"EngineProbe.time needs at least one run (the first compiles), got repeats={repeats}")
        step = step or self.step
        if step.traced() != self.step.traced():
            raise ValueError(f"this probe traced {self.step.traced()}; {step} needs its own probe (it differs in "
                             f"{sorted(step.traced().differs_from(self.step.traced()))}, which the trace sees)")
        with _runtime(step), torch.inference_mode():
            for _ in range(repeats):
                start = time.perf_counter()
                reset_time()
                batch = 1 if kind == "prefill" else size
                with self.platform.device_timer(kind, size, batch), recording() as trace:   # the engine's step
                    self.runner.execute(bucket_input(self.runner, kind, size))
                    self.platform.synchronize()
        # only the last run is reported: the earlier ones' traces are never read (reading one costs its events)
        return summarize(trace, self.config.num_hidden_layers, time.perf_counter() - start)


def bucket_input(runner: object, kind: str, size: int) -> object:
    """A full bucket through the runner's own ``prepare_prefill`` / ``prepare_decode``.

    Prefill: one sequence of ``size`` tokens whose blocks are all the runner's scratch block (as the
    runner's warmup fills a bucket). Decode: ``size`` sequences, each reading a context of ``CONTEXT``
    tokens through its own block table (blocks taken round-robin over the cache) and writing its new
    token's K/V to the scratch block."""
    from spyre_lab.engine.sampling_params import SamplingParams
    from spyre_lab.engine.sequence import Sequence

    width, scratch = runner.max_blocks_per_seq, runner.scratch_block
    if kind == "prefill":
        seq = Sequence("prefill", [0] * size, SamplingParams())
        seq.block_table = [scratch] * width
        return runner.prepare_prefill([seq])
    context = min(CONTEXT, width * BLOCK_SIZE - 1)
    seqs = []
    for b in range(size):
        seq = Sequence(f"decode {b}", [0] * (context + 1), SamplingParams())
        seq.block_table = [(b * width + j) % (scratch + 1) for j in range(width)]
        seq.num_computed_tokens = context
        seqs.append(seq)
    return runner.prepare_decode(seqs)


class ProbeCache:
    """The most recent probes, one per (depth, traced configuration, buckets, compile options): configurations
    that differ only in runtime options reuse one model, its Dynamo traces and its programs. Bounded (each
    probe holds a compiled model), so a study's consecutive stages share and older probes are released."""

    def __init__(self, keep: int = len(PROBE_DEPTHS)) -> None:
        from collections import OrderedDict

        self.keep, self.built, self._probes = keep, 0, OrderedDict()

    def get(self, config: ModelConfig, step: StepConfig, prefill: tuple[int, ...], batch: tuple[int, ...],
            compile_options: dict) -> EngineProbe:
        key = (config, step.traced(), prefill, batch, repr(sorted(compile_options.items())))
        probe = self._probes.pop(key, None)
        if probe is None:
            probe = EngineProbe(config, step.traced(), prefill, batch, dict(compile_options))
            self.built += 1
        self._probes[key] = probe
        while len(self._probes) > self.keep:
            self._probes.popitem(last=False)
        return probe


def time_steps(step: StepConfig, buckets: Sequence[tuple[str, int]], depth: str | int = "probe",
               config: ModelConfig = GRANITE_3_3_8B,
               compile_options: dict | None = None,
               probes: ProbeCache | None = None) -> dict[tuple[str, int], StepTiming]:
    """Modeled step times of ``config`` for every bucket (``("prefill", 1024)``, ``("decode", 8)``).

    ``depth="probe"`` runs the real path at ``PROBE_DEPTHS`` layers and extends to the model's depth;
    ``"full"`` (or an int) runs that many layers directly. Pass one ``probes`` cache to successive calls
    to reuse a model between configurations that differ only in runtime options.
    """
    from spyre_lab.studies.tp_sharding import shard_config

    full, config = config, shard_config(config, step.tensor_parallel)   # the shapes one rank holds
    rank = dataclasses.replace(step, tensor_parallel=1)   # a rank is one card running the sharded shapes
    prefill = tuple(sorted({s for k, s in buckets if k == "prefill"})) or (64,)
    batch = tuple(sorted({s for k, s in buckets if k == "decode"})) or (1,)
    depths = PROBE_DEPTHS if depth == "probe" else (config.num_hidden_layers if depth == "full" else int(depth),)
    per_depth = {}
    probes = probes or ProbeCache()
    for d in depths:
        probe = probes.get(dataclasses.replace(config, num_hidden_layers=d), rank, prefill, batch,
                           dict(compile_options or {}))
        per_depth[d] = {b: probe.time(*b, step=rank) for b in buckets}
    if depth != "probe":
        timings = per_depth[depths[0]]
    else:
        shallow, deep = (per_depth[d] for d in PROBE_DEPTHS)
        timings = {b: StepTiming.extend(shallow[b], deep[b], config.num_hidden_layers) for b in buckets}
    return _with_collectives(timings, full, step.tensor_parallel, depths[-1] if depth != "probe" else None)


def _with_collectives(timings: dict[tuple[str, int], StepTiming], config: ModelConfig, k: int,
                      layers: int | None) -> dict[tuple[str, int], StepTiming]:
    """Each bucket's rank step plus the group's collectives at ``layers`` layers (the model's by default)."""
    if k == 1:
        return timings
    from spyre_lab.distributed.links import card_link
    from spyre_lab.studies.tp_sharding import step_collectives

    latency = card_link().latency_us
    at = config if layers is None else dataclasses.replace(config, num_hidden_layers=layers)
    return {b: t.with_collectives(step_collectives(at, k, *b), latency) for b, t in timings.items()}
