"""EngineStats: what each step did and how long each request took, as plain rows and a text table.

Host times are measured wall-clock on this machine. Device times are *modeled* by the platform's
device model; a platform without one (cpu) reports None, shown as "n/a".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from spyre_lab.device.trace import Trace


@dataclass
class StepStats:
    step: int
    kind: str  # "prefill" | "decode" | "warmup-prefill" | "warmup-decode"
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


@dataclass
class EngineStats:
    steps: list[StepStats] = field(default_factory=list)
    requests: list[RequestStats] = field(default_factory=list)

    def to_rows(self, what: str = "steps") -> list[dict]:
        """Plain dicts, one per step (`what="steps"`) or per finished request (`what="requests"`)."""
        if what not in ("steps", "requests"):
            raise ValueError(f'to_rows takes "steps" or "requests", got {what!r}')
        return [asdict(record) for record in getattr(self, what)]

    def table(self, what: str = "steps", last: int | None = None) -> str:
        rows = self.to_rows(what)
        return format_table(rows[-last:] if last else rows)

    def summary(self) -> dict:
        served = [s for s in self.steps if not s.kind.startswith("warmup")]
        decode = [s for s in served if s.kind == "decode"]
        generated = sum(r.output_tokens for r in self.requests)
        host_s = sum(s.host_ms for s in served) / 1e3
        modeled = [s.device_ms_modeled for s in served]
        return {
            "steps": len(served),
            "prefill_steps": len(served) - len(decode),
            "decode_steps": len(decode),
            "requests": len(self.requests),
            "generated_tokens": generated,
            "host_s": host_s,
            "host_tokens_per_s": generated / host_s if host_s else None,
            "device_ms_modeled": None if any(m is None for m in modeled) else sum(modeled),
            "padded_tokens": sum(s.padded_tokens for s in served),
            "on_demand_steps": sum("on-demand" in s.dispatch for s in served),
            "preemptions": sum(s.num_preempted for s in served),
        }

    def to_trace(self) -> Trace:
        """The steps as events on the `engine` lane of a Trace (measured host time), for timelines and Perfetto."""
        trace = Trace(meta={"time": "measured host microseconds (engine lane)"})
        for s in self.steps:
            trace.add("engine", f"{s.kind} x{s.num_seqs}", s.start_ms * 1e3, s.host_ms * 1e3,
                      num_tokens=s.num_tokens, padded_tokens=s.padded_tokens, batch_bucket=s.batch_bucket,
                      token_bucket=s.token_bucket, kv_blocks_used=s.kv_blocks_used, dispatch=s.dispatch,
                      device_ms_modeled=s.device_ms_modeled)
        return trace

    def reset(self) -> None:
        self.steps.clear()
        self.requests.clear()

    def __str__(self) -> str:
        summary = "\n".join(f"{k}: {_format(v)}" for k, v in self.summary().items())
        return f"{summary}\n\nsteps (host ms measured, device ms modeled):\n{self.table('steps', last=20)}"
