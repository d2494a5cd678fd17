"""EngineStats: what each step did and how long each request took, as plain rows and a text table.

Host times are measured wall-clock on this machine. Device times are *modeled* by the platform's
device model; a platform without one (cpu) reports None, shown as "n/a".

Bounded memory: an engine serving for days must not keep every step. ``steps`` and ``requests`` keep
the most recent ``max_steps`` / ``max_requests`` records (10,000 each by default), ``details`` (a KV
snapshot per step) the most recent ``max_details`` (1,000), device traces the most recent
``max_device_traces`` (128); older records are dropped as new ones come. ``summary()`` and ``totals``
count every record ever made, exactly, whatever the windows. Set a window to ``None`` to keep everything
(``llm.stats.max_steps = None``), or smaller to save memory; a change applies at the next record.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spyre_lab.device.trace import Trace, TraceEvent


@dataclass
class StepStats:
    step: int
    # "prefill" | "decode" | "mixed" (decode rows and prompts in one pass) | "warmup-prefill" | "warmup-decode"
    kind: str
    num_seqs: int  # real sequences in the batch
    batch_bucket: int | None  # padded batch size (static shapes) or None
    token_bucket: int | None  # padded prefill length (static shapes) or None
    num_tokens: int  # real tokens fed to the model
    padded_tokens: int  # tokens fed that are padding
    host_ms: float  # measured: prepare inputs + model + sampling
    device_ms_modeled: float | None  # modeled device time; None when the platform has no device model
    kv_blocks_used: int
    dispatch: str  # platform dispatch mode; "+on-demand" when the shape was not warmed up
    num_preempted: int = 0
    start_ms: float = 0.0  # measured, from engine creation


@dataclass
class RequestStats:
    request_id: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str | None
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    num_preemptions: int
    cached_tokens: int


@dataclass
class KVSnapshot:
    """The KV cache's blocks at one moment: who holds each block, which free blocks still hold a cached prefix."""

    block_size: int
    ref_counts: list[int]  # per block: how many running requests hold it (0 = free)
    cached: list[bool]  # per block: it holds a full, hashed block (a prefix a new request can reuse)
    tables: dict[str, list[int]]  # request id -> its block table, for every request holding blocks
    cached_tokens: dict[str, int]  # request id -> prompt tokens found by prefix caching at its last prefill

    @property
    def num_blocks(self) -> int:
        return len(self.ref_counts)

    def state(self, block_id: int) -> str:
        """``"used"`` (held), ``"cached"`` (free, keeps a reusable prefix) or ``"free"``."""
        if self.ref_counts[block_id] > 0:
            return "used"
        return "cached" if self.cached[block_id] else "free"

    def counts(self) -> dict[str, int]:
        out = {"used": 0, "cached": 0, "free": 0}
        for block_id in range(self.num_blocks):
            out[self.state(block_id)] += 1
        return out


@dataclass
class StepDetail:
    """What one served step did beyond its row: the batch, measured host phases, the KV cache, modeled events.

    Kept apart from `StepStats` so rows and tables stay flat; the views (`spyre_lab.viz`) replay a run from these.
    """

    step: int
    batch: list[tuple[str, int]]  # (request id, real tokens fed this step), in batch order
    phases_ms: dict[str, float]  # measured wall ms: schedule, prepare inputs, forward, sample
    arrived: list[str] = field(default_factory=list)  # prefilled this step (new, or again after a preemption)
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    kv: KVSnapshot | None = None  # blocks after scheduling, before finished requests free theirs
    device_trace: Trace | None = None  # modeled events of the step (core lanes dropped); None without a device model


#: Lanes a step's device trace keeps: host-side and stream lanes (per-core unit lanes are dropped: thousands a step).
def _keep_lane(lane: str) -> bool:
    return not lane.startswith("core")


class _KeptLater(Trace):
    """A step's modeled events on the lanes ``keep`` accepts, picked out when first read: most step records are
    never looked at, and a step's recording holds a few thousand per-core events to skip."""

    def __init__(self, source: Trace, keep: Callable[[str], bool]) -> None:
        self._source: Trace | None = source
        self._keep = keep
        self._kept: list[TraceEvent] = []
        self.meta = dict(source.meta)

    @property  # type: ignore[override]
    def events(self) -> list[TraceEvent]:
        if self._source is not None:
            self._kept, self._source = self._source.kept(self._keep).events, None
        return self._kept

    @events.setter
    def events(self, value: list[TraceEvent]) -> None:
        self._kept, self._source = value, None


def _format(value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def format_table(rows: list[dict]) -> str:
    """A fixed-width text table of dict rows (same keys in each row)."""
    if not rows:
        return "(no rows)"
    headers = list(rows[0])
    cells = [[_format(row[h]) for h in headers] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


class RecordWindow(list):
    """The most recent ``maxlen`` records (``None``: all), as a plain list (index, slice, iterate); every record
    appended is first shown to ``on_add`` (the running totals), so dropping old ones loses no count."""

    def __init__(self, records: Iterable[Any] = (), maxlen: int | None = None,
                 on_add: Callable[[Any], None] | None = None) -> None:
        super().__init__()
        self.maxlen, self.on_add = maxlen, on_add
        self.extend(records)

    def append(self, record: Any) -> None:
        on_add = getattr(self, "on_add", None)
        if on_add is not None:
            on_add(record)
        super().append(record)
        self.trim()

    def extend(self, records: Iterable[Any]) -> None:
        for record in records:
            self.append(record)

    def trim(self) -> None:
        """Drop the oldest records beyond ``maxlen``."""
        maxlen = getattr(self, "maxlen", None)
        if maxlen is not None and len(self) > maxlen:
            del self[: len(self) - maxlen]


@dataclass
class StatsTotals:
    """Counts over every record an EngineStats was given, kept exactly however small its windows are."""

    steps: int = 0  # every step recorded (warmup included): the next step's number
    served_steps: int = 0
    decode_steps: int = 0
    mixed_steps: int = 0  # decode rows and prefilled prompts in one forward pass
    requests: int = 0
    generated_tokens: int = 0
    host_ms: float = 0  # served steps, measured
    device_ms_modeled: float = 0  # served steps, modeled
    unmodeled_steps: int = 0  # served steps without a modeled time (then the modeled total is n/a)
    num_tokens: int = 0  # real tokens fed by served steps (with padded_tokens: the whole run's padding share)
    padded_tokens: int = 0
    on_demand_steps: int = 0
    preemptions: int = 0

    def add_step(self, s: StepStats) -> None:
        self.steps += 1
        if s.kind.startswith("warmup"):
            return
        self.served_steps += 1
        self.decode_steps += s.kind == "decode"
        self.mixed_steps += s.kind == "mixed"
        self.host_ms += s.host_ms
        if s.device_ms_modeled is None:
            self.unmodeled_steps += 1
        else:
            self.device_ms_modeled += s.device_ms_modeled
        self.num_tokens += s.num_tokens
        self.padded_tokens += s.padded_tokens
        self.on_demand_steps += "on-demand" in s.dispatch
        self.preemptions += s.num_preempted

    def add_request(self, r: RequestStats) -> None:
        self.requests += 1
        self.generated_tokens += r.output_tokens


DEFAULT_MAX_STEPS = DEFAULT_MAX_REQUESTS = 10_000
DEFAULT_MAX_DETAILS = 1_000


@dataclass
class EngineStats:
    #: the most recent ``max_steps`` step rows (a list; older rows are dropped, ``totals`` still counts them)
    steps: list[StepStats] = field(default_factory=list)
    #: the most recent ``max_requests`` finished requests
    requests: list[RequestStats] = field(default_factory=list)
    #: step number -> StepDetail for the most recent ``max_details`` served steps (batch, host phases, KV
    #: snapshot, modeled device events)
    details: dict[int, StepDetail] = field(default_factory=dict)
    #: device traces are kept for the most recent this many steps (older ones are dropped to bound memory)
    max_device_traces: int = 128
    max_steps: int | None = DEFAULT_MAX_STEPS
    max_requests: int | None = DEFAULT_MAX_REQUESTS
    max_details: int | None = DEFAULT_MAX_DETAILS
    #: exact counts over every record, whatever the windows (what ``summary()`` reports)
    totals: StatsTotals = field(default_factory=StatsTotals, init=False, compare=False)
    _traced: deque[int] = field(default_factory=deque, init=False, repr=False, compare=False)  # steps with a trace

    def __post_init__(self) -> None:
        self.steps = RecordWindow(self.steps, self.max_steps, self.totals.add_step)
        self.requests = RecordWindow(self.requests, self.max_requests, self.totals.add_request)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        window = {"max_steps": "steps", "max_requests": "requests"}.get(name)
        if window is not None and isinstance(getattr(self, window, None), RecordWindow):
            getattr(self, window).maxlen = value

    @property
    def next_step(self) -> int:
        """The number the next recorded step gets (steps are numbered over the engine's whole life)."""
        return self.totals.steps

    def record_detail(self, step: int, schedule_ms: float, seqs: list, preempted: list, result: Any,
                      kv: KVSnapshot | None, is_prefill: bool, num_decode: int = 0) -> StepDetail:
        """Called by the engine after each served step (``seqs`` are the scheduled Sequences, ``result`` the
        runner's StepResult; a mixed step's first ``num_decode`` sequences decoded, the others were prefilled)."""
        fed = getattr(result, "tokens_per_seq", None) or [1] * len(seqs)
        batch = [(s.request_id, int(n)) for s, n in zip(seqs, fed)]
        trace = getattr(result, "device_trace", None)
        if trace is not None:
            trace = _KeptLater(trace, _keep_lane)
        detail = StepDetail(
            step=step, batch=batch,
            phases_ms={"schedule": schedule_ms, **getattr(result, "phases_ms", {})},
            arrived=[s.request_id for s in seqs[num_decode:]] if is_prefill else [],
            preempted=[s.request_id for s in preempted],
            finished=[s.request_id for s in seqs if s.is_finished],
            kv=kv, device_trace=trace,
        )
        self.details[step] = detail
        while self.max_details is not None and len(self.details) > self.max_details:
            del self.details[next(iter(self.details))]          # the oldest: dicts keep insertion order
        if trace is not None:
            self._traced.append(step)
        while len(self._traced) > self.max_device_traces:
            dropped = self.details.get(self._traced.popleft())
            if dropped is not None:
                dropped.device_trace = None
        return detail

    def to_rows(self, what: str = "steps") -> list[dict]:
        """Plain dicts, one per step (`what="steps"`) or per finished request (`what="requests"`)."""
        if what not in ("steps", "requests"):
            raise ValueError(f'to_rows takes "steps" or "requests", got {what!r}')
        return [asdict(record) for record in getattr(self, what)]

    def table(self, what: str = "steps", last: int | None = None) -> str:
        rows = self.to_rows(what)
        return format_table(rows[-last:] if last else rows)

    def summary(self) -> dict:
        """Totals over every step and request recorded (not only those the windows still hold)."""
        t = self.totals
        host_s = t.host_ms / 1e3
        return {
            "steps": t.served_steps,
            "prefill_steps": t.served_steps - t.decode_steps - t.mixed_steps,
            "decode_steps": t.decode_steps,
            "mixed_steps": t.mixed_steps,
            "requests": t.requests,
            "generated_tokens": t.generated_tokens,
            "host_s": host_s,
            "host_tokens_per_s": t.generated_tokens / host_s if host_s else None,
            "device_ms_modeled": None if t.unmodeled_steps else t.device_ms_modeled,
            "padded_tokens": t.padded_tokens,
            "on_demand_steps": t.on_demand_steps,
            "preemptions": t.preemptions,
        }

    def to_trace(self, device: bool = False) -> Trace:
        """The steps as events on the `engine` lane of a Trace (measured host time), for timelines and Perfetto.

        With ``device=True`` each served step's modeled device events (host enqueue, program correction, PCIe,
        kernels) follow, shifted to start where the step starts and tagged ``step=n``: two clocks on one axis
        (measured step start, modeled durations), so the lanes say so in the trace's meta.
        """
        trace = Trace(meta={"time": "measured host microseconds (engine lane)"})
        for s in self.steps:
            detail = self.details.get(s.step)
            extra = {}
            if detail is not None:
                extra = {"batch": [list(b) for b in detail.batch], "phases_ms": detail.phases_ms,
                         "arrived": detail.arrived, "preempted": detail.preempted, "finished": detail.finished}
            trace.add("engine", f"{s.kind} x{s.num_seqs}", s.start_ms * 1e3, s.host_ms * 1e3,
                      step=s.step, kind=s.kind, num_seqs=s.num_seqs,
                      num_tokens=s.num_tokens, padded_tokens=s.padded_tokens, batch_bucket=s.batch_bucket,
                      token_bucket=s.token_bucket, kv_blocks_used=s.kv_blocks_used, dispatch=s.dispatch,
                      device_ms_modeled=s.device_ms_modeled, host_ms=s.host_ms, **extra)
            if device and detail is not None and detail.device_trace is not None and len(detail.device_trace):
                offset = s.start_ms * 1e3 - detail.device_trace.start_us
                for e in detail.device_trace:
                    trace.add(e.lane, e.name, e.start_us + offset, e.dur_us, **e.args, step=s.step)
        if device:
            trace.meta["device_lanes"] = "modeled microseconds, each step's events placed at the step's measured start"
        return trace

    # ---- saving and replaying ---------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """Everything recorded, as plain JSON (views replay a run from it: ``EngineStats.from_json``)."""
        details = []
        for d in self.details.values():
            entry = {k: v for k, v in asdict(d).items() if k not in ("kv", "device_trace")}
            entry["kv"] = asdict(d.kv) if d.kv is not None else None
            entry["device_trace"] = None if d.device_trace is None else [
                [e.lane, e.name, e.start_us, e.dur_us, e.args] for e in d.device_trace]
            details.append(entry)
        return {"format": "spyre_lab.engine_stats/1", "steps": self.to_rows("steps"),
                "requests": self.to_rows("requests"), "details": details, "totals": asdict(self.totals)}

    def save_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), default=str, separators=(",", ":")))
        return path

    @classmethod
    def from_json(cls, source: str | Path | dict[str, Any]) -> EngineStats:
        """Read back what :meth:`save_json` wrote (a path or the dict)."""
        doc = source if isinstance(source, dict) else json.loads(Path(source).read_text())
        if doc.get("format") != "spyre_lab.engine_stats/1":
            raise ValueError("not an EngineStats JSON file (written by EngineStats.save_json); "
                             f"its format field is {doc.get('format')!r}")
        stats = cls(max_steps=None, max_requests=None, max_details=None)   # keep all the file holds
        stats.steps.extend(StepStats(**row) for row in doc["steps"])
        stats.requests.extend(RequestStats(**row) for row in doc["requests"])
        if doc.get("totals"):                       # the run's exact totals (its windows may have dropped rows)
            stats.totals = StatsTotals(**doc["totals"])
            stats.steps.on_add, stats.requests.on_add = stats.totals.add_step, stats.totals.add_request
        for entry in doc["details"]:
            kv = KVSnapshot(**entry.pop("kv")) if entry.get("kv") else None
            raw = entry.pop("device_trace", None)
            trace = None if raw is None else Trace(TraceEvent(lane, name, start, dur, args)
                                                   for lane, name, start, dur, args in raw)
            entry.pop("kv", None)
            entry["batch"] = [tuple(b) for b in entry["batch"]]
            stats.details[entry["step"]] = StepDetail(**entry, kv=kv, device_trace=trace)
            if trace is not None:
                stats._traced.append(entry["step"])
        return stats

    def reset(self) -> None:
        """Forget every record and total (step numbers start again at 0)."""
        self.steps.clear()
        self.requests.clear()
        self.details.clear()
        self._traced.clear()
        self.totals = StatsTotals()
        self.steps.on_add, self.requests.on_add = self.totals.add_step, self.totals.add_request

    def __str__(self) -> str:
        summary = "\n".join(f"{k}: {_format(v)}" for k, v in self.summary().items())
        return f"{summary}\n\nsteps (host ms measured, device ms modeled):\n{self.table('steps', last=20)}"
