"""``spyre-lab reproduce``: every published claim against the model, as text, Markdown or JSON.

:func:`reproduce` runs the 8B-shaped engine study (prefill, decode, the batch sweep and the waterfall of
mechanisms) and the kernel claims, optionally the parameter sweep, and returns one JSON-ready dict whose
layout is fixed by ``SCHEMA``: notebooks and reports read it, ``docs/reproduce.md`` is rendered from it.
Every time in it is modeled (analytic simulator and the runtime's launch model) except the wall-clock
seconds under ``"wall_s"``, which say how long the study itself took here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spyre_lab.device.config import SPYRE
from spyre_lab.studies.cache import FINGERPRINTED, cache_folder, read_json, write_json  # noqa: F401 (re-exported)
from spyre_lab.studies.cache import source_fingerprint as _fingerprint
from spyre_lab.studies.tp_table import section_table

# The studies (claims, tensor_parallel, granite8b, sweeps) load the compiler and the engine, over a second of
# imports: they are imported where they run, so a cached result is read and rendered without them.

SCHEMA = "spyre_lab.reproduce/1"
DECODE_BATCHES = (1, 2, 4, 8, 16, 32)


def __getattr__(name: str) -> Any:
    """``ATTENTION_OFF``: every mechanism on but the paged-attention kernel (attention as the engine's eager
    device ops). Built on first use, since ``StepConfig`` comes with the engine study."""
    if name == "ATTENTION_OFF":
        from spyre_lab.studies.granite8b import StepConfig

        return StepConfig(attention_kernel=False)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def reproduce(sweep: bool = False, depth: str | int = "probe", progress: bool = True,
              samples: int | None = None, workers: int | None = None, scheduler: Any = None) -> dict[str, Any]:
    """Run every study; returns the ``SCHEMA`` dict (see ``docs/reproduce.md`` for a rendering).

    Keys: ``schema``, ``modeled`` (always True), ``device`` (the swept SpyreConfig fields),
    ``model`` (the 8B architecture), ``engine`` (``method``, ``steps``: one row per bucket, ``attention``:
    attention's share of the prefill and decode steps with the ``attention`` rule on and off, ``tensor_parallel``:
    the TP 1/2/4/8 table of :mod:`~spyre_lab.studies.tensor_parallel`, each row the step study at
    ``StepConfig(tensor_parallel=k)``; TP 1 is the step table's own row), ``claims``
    (one :class:`~spyre_lab.studies.claims.Claim` dict each, in order matmul, softmax, mlp, prefill,
    decode), ``sweep`` (None, or ``configurations``, ``ranges``, ``verdicts``, ``points``), ``wall_s``.
    The sweep runs on Dask: a local cluster of ``workers`` processes, or ``scheduler`` (see ``sweep_runner``),
    ``samples`` random configurations (default ``sweeps.RANDOM_SAMPLES``).
    """
    from spyre_lab.studies import claims as C
    from spyre_lab.studies import tensor_parallel as TP
    from spyre_lab.studies.granite8b import (
        GRANITE_3_3_8B,
        PREFILL_TOKENS,
        PROBE_DEPTHS,
        ProbeCache,
        StepConfig,
        time_steps,
    )
    from spyre_lab.studies.sweeps import RANDOM_SAMPLES, SWEEP_RANGES, run_sweep

    attention_off = StepConfig(attention_kernel=False)
    say = _progress(progress)
    wall: dict[str, float] = {}
    start = time.perf_counter()
    say("engine: 8B-shaped steps, all mechanisms on (prefill 1024, decode batch 1-32)")
    buckets = [("prefill", PREFILL_TOKENS), *(("decode", b) for b in DECODE_BATCHES)]
    probes = ProbeCache()   # stages that differ only in runtime options (dispatch, overlap) share a model
    steps = time_steps(StepConfig(), buckets, depth, probes=probes)
    wall["engine_steps"] = time.perf_counter() - start
    start = time.perf_counter()
    waterfall = []
    for label, step in C.WATERFALL:
        say(f"engine waterfall: {label}")
        times = steps if step == StepConfig() else time_steps(step, C.ENGINE_BUCKETS, depth, probes=probes)
        waterfall.append((label, step, {b: times[b] for b in C.ENGINE_BUCKETS}))
    wall["engine_waterfall"] = time.perf_counter() - start
    del probes
    rule_off = next(times for _, step, times in waterfall if step == attention_off)   # the stage before the kernel
    start = time.perf_counter()
    claims = _claims(waterfall, say)
    wall["claims"] = time.perf_counter() - start
    start = time.perf_counter()
    say("engine: tensor parallel, TP 1/2/4/8 (one rank plus modeled collectives)")
    tensor_parallel = TP.reproduce_section(depth, one_card=steps)   # TP 1 is the step table's own model
    wall["tensor_parallel"] = time.perf_counter() - start
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "modeled": True,
        "device": {name: getattr(SPYRE, name) for name in ("cores", *SWEEP_RANGES)},
        "model": dataclasses.asdict(GRANITE_3_3_8B),
        "engine": {
            "method": (f"the spyre platform's real path at {PROBE_DEPTHS[0]} and {PROBE_DEPTHS[1]} layers, extended "
                       f"per layer to {GRANITE_3_3_8B.num_hidden_layers}" if depth == "probe"
                       else f"the spyre platform's real path at {depth} layers"),
            "steps": [_step_row(kind, size, t) for (kind, size), t in steps.items()],
            "attention": [_attention_row(kind, size, rule, t) for (kind, size) in C.ENGINE_BUCKETS
                          for rule, t in (("on", steps[kind, size]), ("off", rule_off[kind, size]))],
            "tensor_parallel": tensor_parallel,
        },
        "claims": [c.to_dict() for c in claims],
        "sweep": None,
        "wall_s": wall,
    }
    if sweep:
        start = time.perf_counter()
        say("sweep: every claim across the unpublished parameters")
        logs = {c: (waterfall[0][2][b].log, waterfall[-1][2][b].log) for c, b in
                (("prefill", C.ENGINE_BUCKETS[0]), ("decode", C.ENGINE_BUCKETS[1]))}
        swept = run_sweep(logs, RANDOM_SAMPLES if samples is None else samples, workers, progress,
                          scheduler=scheduler)
        result["sweep"] = {"configurations": len(swept.points), "ranges": {k: list(v) for k, v in SWEEP_RANGES.items()},
                           "verdicts": swept.verdicts(), "points": swept.points}
        wall["sweep"] = time.perf_counter() - start
    return result


def _claims(waterfall: list, say: Callable[[str], None]) -> list[Any]:
    """The kernel claims (matmul, softmax, mlp), each computed here, then the engine claims read off the waterfall."""
    from spyre_lab.studies import claims as C

    kernel = []
    for name, fn in (("matmul", C.matmul_claim), ("softmax", C.softmax_claim), ("mlp", C.mlp_claim)):
        say(f"kernel claim: {name}")
        kernel.append(fn())
    return kernel + C.engine_claims(waterfall)


def _progress(enabled: bool) -> Callable[[str], None]:
    def say(message: str) -> None:
        if enabled:
            print(f"[reproduce] {message}", flush=True)
    return say


def _attention_row(kind: str, size: int, rule: str, t: Any) -> dict[str, Any]:
    """Attention's part of one step's modeled device time, with the compiler's ``attention`` rule on or off."""
    return {"kind": kind, "size": size, "attention_rule": rule, "attention_us": t.attention_us,
            "attention_launches": t.attention_launches, "device_us": t.device_us, "step_us": t.step_us,
            "share": t.attention_share}


def _step_row(kind: str, size: int, t: Any) -> dict[str, Any]:
    # a prefill step makes its prompt's tokens' states (one new token), a decode step one token per sequence
    return {"kind": kind, "size": size, **t.to_dict(), "tokens_per_s": size / (t.step_us / 1e6)}


# --- rendering ------------------------------------------------------------------------------------

def _us(v: float) -> str:
    return f"{v / 1e3:,.2f} ms" if v >= 1e4 else f"{v:,.2f} us"


def to_markdown(result: dict[str, Any]) -> str:
    """The result as the Markdown of ``docs/reproduce.md`` (no wall-clock numbers, so it is deterministic)."""
    out = ["# Reproducing the published Spyre results on the model", "",
           "Generated by `spyre-lab reproduce --markdown` (do not edit; a test regenerates it). Every time is "
           "**modeled**: the analytic simulator for kernels and the runtime's launch model for host, PCIe and "
           f"queues, on the `{SPYRE.name}` machine (the default `SpyreConfig`; `spyre-lab reproduce --machine "
           f"datasheet` reruns every claim on the peak numbers), whose unpublished numbers are estimates. "
           "Published figures are "
           "IBM's. Each claim compares the same measurement with named options off and on; the `changed` line "
           "lists every option that differs.", ""]
    m = result["model"]
    out += ["The portable-layers claim (within 3.4% of native) is a wall-clock measurement, so it is not in this "
            "document: `spyre-lab reproduce --portable` measures it here.", ""]
    out += ["## The Granite-3.3-8B-shaped engine step", "",
            f"hidden {m['hidden_size']}, {m['num_hidden_layers']} layers, {m['num_attention_heads']} heads / "
            f"{m['num_key_value_heads']} KV heads of {m['head_dim']}, intermediate {m['intermediate_size']}, "
            f"vocabulary {m['vocab_size']}, tied embeddings, Granite multipliers; built on the meta device (no "
            f"weights), run through the spyre platform with the runtime in timing-only mode. Method: "
            f"{result['engine']['method']}.", "",
            "| step | step time | host busy | device busy | launches | tokens/s |", "|---|---:|---:|---:|---:|---:|"]
    for r in result["engine"]["steps"]:
        label = f"prefill {r['size']} tokens" if r["kind"] == "prefill" else f"decode batch {r['size']}, context 1024"
        out.append(f"| {label} | {_us(r['step_us'])} | {_us(r['host_us'])} | {_us(r['device_us'])} | "
                   f"{r['launches']} | {r['tokens_per_s']:,.1f} |")
    out.append("")
    attention = result["engine"].get("attention")
    if attention:
        out += ["### Attention's share of the step", "",
                "Paged attention's launches on the card, read off each step's trace: with the compiler's `attention` "
                "rule on, one paged-attention kernel per layer (KV write and attention, each KV block read once "
                "through the block table); off, the engine's eager device ops (KV writes, page gathers, scores, "
                "softmax, PV).", "",
                "| step | attention rule | attention | launches | device busy | share of device time |",
                "|---|---|---:|---:|---:|---:|"]
        for r in attention:
            label = f"prefill {r['size']} tokens" if r["kind"] == "prefill" else f"decode batch {r['size']}"
            out.append(f"| {label} | {r['attention_rule']} | {_us(r['attention_us'])} | {r['attention_launches']} | "
                       f"{_us(r['device_us'])} | {r['share']:.1%} |")
        out.append("")
    tp = result["engine"].get("tensor_parallel")
    if tp:
        out += ["### Tensor parallel: TP 1, 2, 4 and 8", "",
                f"Method: {tp['method']}. Card-to-card link: {tp['link']}.", "", *section_table(tp), "",
                "Where TP stops paying for decode at batch 1 (from the rows above):", "", "```",
                tp["decode_batch_1"], "```", ""]
    for c in result["claims"]:
        out += [f"## {c['title']}", "",
                f"- published: **{c['published']}**",
                f"- modeled: before {_us(c['before_us'])} ({c['before_label']}), after {_us(c['after_us'])} "
                f"({c['after_label']}): **{c['ratio']:.2f}x**",
                f"- dominant cost: before {c['dominant_before']}; after {c['dominant_after']}",
                f"- mechanism: {c['mechanism']}",
                "- changed: " + ", ".join(f"`{k}` {v[0]} -> {v[1]}" for k, v in c["changed"].items()
                                          if not k.startswith("device.") or len(c["changed"]) == 1),
                ]
        if c["note"]:
            out.append(f"- why the model lands where it does: {c['note']}")
        out += ["", *_rows_table(c["rows"]), ""]
    sweep = result.get("sweep")
    if sweep:
        out += ["## Sweeps: which conclusions are robust", "",
                f"{sweep['configurations']} configurations: each parameter alone across its range, then all at "
                "once in a seeded random sample.", "", "| parameter | values |", "|---|---|"]
        out += [f"| `{k}` | {', '.join(f'{x:g}' for x in v)} |" for k, v in sweep["ranges"].items()]
        out += ["", "| claim | measured on | verdict |", "|---|---|---|"]
        out += [f"| {k} | {v['measured_on']} | {v['verdict']} |" for k, v in sweep["verdicts"].items()]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _cell(key: str, v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if key.endswith("util"):
            return f"{v:.0%}"
        if key in ("change", "share"):
            return f"{v:+.1%}"
        return f"{v:,.2f}"
    return str(v)


def _rows_table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    keys = list(rows[0])
    lines = ["| " + " | ".join(k.replace("_", " ") for k in keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_cell(k, r.get(k)) for k in keys) + " |" for r in rows]
    return lines


def to_text(result: dict[str, Any]) -> str:
    """A terminal summary: one block per claim, plus the wall-clock seconds the study took."""
    lines = ["Published Spyre results vs the model (modeled times)", ""]
    for r in result["engine"]["steps"]:
        lines.append(f"  8B {r['kind']:<7} {r['size']:>5}: step {_us(r['step_us']):>12}  host {_us(r['host_us']):>12}"
                     f"  device {_us(r['device_us']):>12}  {r['tokens_per_s']:>10,.1f} tok/s")
    for r in result["engine"].get("attention", []):
        lines.append(f"  8B {r['kind']:<7} {r['size']:>5}: attention rule {r['attention_rule']:<3}  attention "
                     f"{_us(r['attention_us']):>12} in {r['attention_launches']:>4} launches = {r['share']:.1%} of "
                     f"device {_us(r['device_us'])}")
    tp = result["engine"].get("tensor_parallel")
    if tp:
        lines.append(f"  8B tensor parallel ({tp['method']}; link {tp['link']}):")
        lines += [f"    TP {r['tp']} {r['kind']:<7} {r['size']:>5}: step {_us(r['step_us']):>12}  collectives "
                  f"{_us(r['collective_us']):>12} = {r['collective_share']:.1%}" for r in tp["rows"]]
        lines += ["    " + line for line in tp["decode_batch_1"].splitlines()]
    lines.append("")
    for c in result["claims"]:
        lines += [f"{c['title']}",
                  f"  published {c['published']}; model {_us(c['before_us'])} -> {_us(c['after_us'])} = "
                  f"{c['ratio']:.2f}x",
                  f"  dominant: {c['dominant_before']} -> {c['dominant_after']}",
                  f"  {c['mechanism']}"]
        if c["note"]:
            lines.append(f"  note: {c['note']}")
        lines.append("")
    if result.get("sweep"):
        lines.append(f"Sweep over {result['sweep']['configurations']} configurations:")
        lines += [f"  {k:<8} {v['verdict']}" for k, v in result["sweep"]["verdicts"].items()]
        lines.append("")
    lines.append("wall clock when this result was computed (it may be read from the cache): "
                 + ", ".join(f"{k} {v:.1f} s" for k, v in result["wall_s"].items()))
    return "\n".join(lines)


def main(json: bool = False, markdown: bool = False, sweep: bool = False, full_depth: bool = False,
         portable: bool = False, scheduler: str | None = None, workers: int | None = None,
         fresh: bool = False) -> int:
    """The ``spyre-lab reproduce`` command: progress on stderr, the chosen rendering on stdout.

    The keywords are the command's flags. Every modeled result is read from the cache when this source has
    computed it before (``--fresh`` computes it again); the portable claim is measured each time."""
    import contextlib
    import json as json_module
    import sys

    with contextlib.redirect_stdout(sys.stderr):
        depth = "full" if full_depth else "probe"
        result = cached_reproduce(sweep=sweep or (markdown and not full_depth), depth=depth, progress=True,
                                  scheduler=scheduler, workers=workers, fresh=fresh)
        if portable:   # measured wall clock: reported with the others, never in the generated document
            from spyre_lab.studies.claims import portable_claim

            result["claims"].append(portable_claim().to_dict())
    if json:
        print(json_module.dumps(result, indent=1, default=str))
    elif markdown:
        print(to_markdown(result), end="")
    else:
        print(to_text(result))
    return 0


def source_fingerprint() -> str:
    """A hash of the source the results depend on: a cached result is reused only while none of it has changed."""
    return _fingerprint(SCHEMA + SPYRE.name)   # the machine the results were computed on


def cached_reproduce(sweep: bool = True, cache_dir: str | None = None, progress: bool = False, depth: str = "probe",
                     scheduler: str | None = None, workers: int | None = None, fresh: bool = False) -> dict[str, Any]:
    """:func:`reproduce`, kept on disk (``$SPYRE_LAB_CACHE`` or ``~/.cache/spyre_lab``) under the package's
    source fingerprint: any change to the code computes it again, so a cached result is never stale. Without
    the sweep, a cached result with it serves too (its sweep left out). ``fresh`` computes and stores again."""
    folder, fingerprint = cache_folder(cache_dir), source_fingerprint()
    depth_part = "" if depth == "probe" else f"{depth}-"

    def path(with_sweep: bool) -> Path:
        return folder / f"reproduce-{depth_part}{'sweep-' if with_sweep else ''}{fingerprint}.json"

    for candidate in ([] if fresh else [path(sweep)] + ([] if sweep else [path(True)])):
        result = read_json(candidate)
        if result is not None:
            if progress:
                print(f"[reproduce] read {candidate} (computed from this very source; --fresh computes it again)")
            if not sweep:
                result["sweep"] = None
                result["wall_s"].pop("sweep", None)
            return result
    result = _json(reproduce(sweep=sweep, depth=depth, progress=progress, scheduler=scheduler, workers=workers))
    write_json(path(sweep), result)
    return result


def _json(result: dict[str, Any]) -> dict[str, Any]:
    """The result as JSON reads it back (tuples as lists, keys as strings), so fresh and cached results match."""
    import json

    return json.loads(json.dumps(result, default=str))
