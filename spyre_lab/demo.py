"""``make demo``: the main job on the modeled device, with a report.

Three sections, bottom layer first, each printing what it did and adding to ``out/report.txt``:

1. device:   hand-built softmax and matmul kernels on all 32 cores, simulated tile by tile;
2. compiler: a SwiGLU MLP and a softmax through ``torch.compile(backend="spyre")`` with every
             fusion rule on and off, launched on ``torch.device("spyre")``;
3. engine:   the embedded tiny-granite model served by the mini vLLM engine on the spyre platform.

Ops with no spyre kernel run as CPU fallbacks; instead of a warning per op the demo ends with one summary
(op, calls, where first seen). Per-core timelines go to ``out/trace.json`` and the engine's steps to
``out/engine_trace.json`` (both open in Perfetto / chrome://tracing). Every device time is modeled.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from spyre_lab.device.config import SPYRE, SpyreConfig
from spyre_lab.device.kernels import matmul_kernel, softmax_kernel
from spyre_lab.device.sim import SimResult, simulate
from spyre_lab.device.trace import Trace

ENGINE_PROMPTS = ("count from 5 to 12:", "letters from c to h:", "3 + 4 =", "The answer is")


def _kernel_lines(result: SimResult) -> list[str]:
    active = result.active_cores
    util = sum(result.core_utilization[c] for c in active) / max(1, len(active))
    return [
        f"  {result.kernel.name}",
        f"    modeled time      {result.time_us:10.2f} us  (launch {result.launch_us:.2f} us, {result.mode} mode)",
        f"    cores active      {len(active):10d}     mean core utilization {util:.1%}, PT {result.pt_utilization:.1%}",
        f"    data moved        {result.bytes_loaded / 1e6:10.3f} MB into LX, {result.bytes_stored / 1e6:.3f} MB out; "
        f"DRAM served {result.dram_bytes / 1e6:.3f} MB (broadcasts once); ring {result.ring_bytes / 1e6:.3f} MB",
        f"    bottleneck        {result.bottleneck:>10s}     {result.explain()}",
    ]


def device_section(cfg: SpyreConfig, trace: Trace) -> list[str]:
    """A softmax-shaped and a matmul-shaped kernel on every core, event-simulated tile by tile."""
    lines = ["1. Device model: hand-built kernels on the dataflow simulator (event mode)", f"  {cfg.describe()}"]
    kernels = [
        softmax_kernel(1024, 1024, cores=cfg.cores, cfg=cfg, fused=True),
        matmul_kernel(2048, 2048, 2048, cores_m=4, cores_n=4, cores_k=2, cfg=cfg, tile=(256, 256, 128)),
    ]
    for kernel in kernels:
        result = simulate(kernel, cfg, mode="event")
        assert result.trace is not None
        trace.extend(result.trace, offset_us=trace.end_us)
        lines += _kernel_lines(result)
    return lines


class SwiGLU(torch.nn.Module):
    """The gated MLP of a Granite/Llama block: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(hidden, inner, bias=False)
        self.up = torch.nn.Linear(hidden, inner, bias=False)
        self.down = torch.nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def _compiled_run(module: torch.nn.Module, x: torch.Tensor, fusion: bool) -> tuple[torch.Tensor, object]:
    from spyre_lab.runtime.dynamo_backend import compiled_graphs_for

    torch._dynamo.reset()
    compiled = torch.compile(module, backend="spyre", options={"fusion": fusion})
    with torch.no_grad():
        out = compiled(x)
    return out, compiled_graphs_for(compiled)[-1].program


def compiler_section(cfg: SpyreConfig) -> list[str]:
    """Fusion on vs off for two graphs, numerics checked against the CPU, times modeled."""
    lines = ['2. Compiler: torch.compile(backend="spyre") on torch.device("spyre"), fusion on vs off']
    torch.manual_seed(0)
    mlp = SwiGLU(512, 1408).half().eval()
    x = torch.randn(128, 512, dtype=torch.float16)
    expected_mlp = mlp(x).detach()  # on the CPU, before the module moves to the card
    graphs: list[tuple[str, torch.nn.Module, torch.Tensor, torch.Tensor]] = [
        ("SwiGLU MLP 128x512 -> 1408 -> 512", mlp.to("spyre"), x.to("spyre"), expected_mlp),
    ]
    scores = torch.randn(512, 1024, dtype=torch.float16)
    softmax = torch.nn.Softmax(dim=-1)
    graphs.append(("softmax 512x1024", softmax, scores.to("spyre"), softmax(scores.float()).half()))
    for title, module, inp, expected in graphs:
        lines.append(f"  {title}")
        for fusion in (False, True):
            out, program = _compiled_run(module, inp, fusion)
            error = (out.cpu().float() - expected.float()).abs().max().item()
            modeled = program.modeled_time_us()
            rules = sorted({launch.rule for launch in program.launches if hasattr(launch, "rule")})
            lines.append(f"    fusion {'on ' if fusion else 'off'}  {len(program.launches):3d} kernels  "
                         f"{modeled:9.2f} us modeled   max |spyre - cpu| {error:.4f}   rules: {', '.join(rules)}")
    return lines


def engine_section(out: Path, trace_path: Path) -> list[str]:
    """tiny-granite on the spyre platform: warmup, greedy generation, per-request and per-step stats."""
    from spyre_lab.engine import LLM, SamplingParams

    lines = ['3. Engine: LLM("tiny-granite", platform="spyre"), greedy decoding']
    llm = LLM("tiny-granite", platform="spyre", max_num_seqs=4, max_model_len=128)
    started = time.perf_counter()
    llm.warmup(show_progress=True)
    lines.append(f"  warmup (every static-shape bucket): {time.perf_counter() - started:.1f} s wall")
    outputs = llm.generate(list(ENGINE_PROMPTS), SamplingParams(temperature=0, max_tokens=32), use_tqdm=True)
    for request in outputs:
        seen = (request.decoded_prompt or "").removeprefix("<bos>")
        note = f"   (the model saw {seen!r})" if seen and seen != request.prompt else ""
        lines.append(f"  {request.prompt!r:>26} -> {request.outputs[0].text!r}{note}")
    summary = llm.stats.summary()
    modeled = summary.get("device_ms_modeled")
    lines.append(f"  {summary['steps']} steps ({summary['prefill_steps']} prefill, {summary['decode_steps']} decode), "
                 f"{summary['generated_tokens']} tokens; device {modeled:.2f} ms modeled, "
                 f"host {summary['host_s'] * 1e3:.0f} ms measured")
    lines += ["  last steps:", *("    " + row for row in llm.stats.table(last=4).splitlines())]
    llm.stats.to_trace().to_chrome_trace(trace_path)
    llm.stats.save_json(out / "engine_stats.json")  # replayed by the views in out/report.html
    return lines


COMPILED_HOST_OP = "runs on the host CPU (Fallback)"
"""What the compiler's warning for a graph node it hands to the host says (``spyre: aten.X runs on ...``)."""


@contextlib.contextmanager
def fallback_report() -> Iterator[list[str]]:
    """Run a block with the per-op CPU-fallback warnings held back; the list it yields is filled, on exit,
    with one summary: eager fallbacks (op, calls, first call site) and graph nodes compiled as host ops.
    Any other warning of the block is listed after it, so nothing is hidden."""
    from spyre_lab.runtime.fallback import collect_fallbacks

    lines: list[str] = []
    with collect_fallbacks() as log, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        yield lines
    lines.append(log.summary())
    compiled: dict[str, str] = {}
    others: list[str] = []
    for w in caught:
        text = str(w.message)
        if COMPILED_HOST_OP in text:
            compiled.setdefault(text.split()[1], text.split(": ", 2)[-1])
        else:
            others.append(f"  {w.category.__name__}: {text} ({w.filename}:{w.lineno})")
    if compiled:
        lines.append(f"Compiled graph nodes run on the host: {len(compiled)} (each launch of their program: D2H, "
                     "the CPU op, H2D)")
        lines += [f"  {op}: {reason}" for op, reason in compiled.items()]
    if others:
        lines += [f"Other warnings: {len(dict.fromkeys(others))}", *dict.fromkeys(others)]


def run_demo(out_dir: str = "out", cfg: SpyreConfig = SPYRE, engine: bool = True) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trace = Trace(meta={"demo": "spyre_lab", "time": "modeled"})
    sections: list[tuple[str, Callable[[], list[str]]]] = [
        ("device", lambda: device_section(cfg, trace)),
        ("compiler", lambda: compiler_section(cfg)),
    ]
    if engine:
        sections.append(("engine", lambda: engine_section(out, out / "engine_trace.json")))
    report: list[str] = ["spyre_lab demo report (all device times are modeled)", ""]
    with fallback_report() as fallbacks:
        for name, section in sections:
            started = time.perf_counter()
            lines = section()
            lines.append(f"  [{name} section: {time.perf_counter() - started:.2f} s wall]")
            print("\n".join(lines), flush=True)
            report += [*lines, ""]
    print("\n".join(fallbacks), flush=True)
    report += [*fallbacks, ""]
    trace.to_chrome_trace(out / "trace.json")
    (out / "report.txt").write_text("\n".join(report))
    print(f"\nwrote {out / 'trace.json'} ({len(trace)} events; open in https://ui.perfetto.dev)")
    print(f"wrote {out / 'report.txt'}")
    if engine:
        from spyre_lab.studies.fidelity import fidelity
        from spyre_lab.viz.report import write_report  # the run's figures: one HTML file that opens offline

        write_report(out, run=False, fidelity=fidelity())   # with the modeled card held against the real one
    return 0
