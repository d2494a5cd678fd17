"""Tensor parallelism for the Granite-8B shape: prefill and decode step times at TP 1, 2, 4 and 8.

What is timed, and how: each row is the 8B study's own step, ``time_steps(StepConfig(tensor_parallel=k))``.
Ranks of a tensor-parallel group are symmetric (each holds ``1/k`` of every sharded weight and runs the same
programs), so the study times **one rank** in one process and adds the collectives the group would run
(:mod:`~spyre_lab.studies.tp_sharding`). The rank's programs are the real spyre-platform path on a *sharded*
config, the shapes one card of ``k`` holds:

* attention: ``32/k`` query heads and ``8/k`` KV heads (KV cache sharded by KV heads), head_dim 128;
  QKV column-parallel, ``o_proj`` row-parallel;
* MLP: ``12800/k`` intermediate (gate/up column-parallel, ``down_proj`` row-parallel);
* vocabulary-parallel embedding and ``lm_head``: ``ceil(49159/k)`` rows per card (tied, as Granite's).

The collectives (modeled by :mod:`spyre_lab.distributed.algorithms` over the card-to-card link, an
*estimate*): per layer **2 all-reduces** of the activations (after ``o_proj`` and after ``down_proj``,
``tokens x hidden x 2 B``), one all-reduce after the masked embedding lookup, and one gather of the
logits shards to rank 0. spyreccl is synchronous, so a step's time is ``compute + collectives`` (no
overlap). All times are **modeled** microseconds. TP 1 has no collective.

Why decode at batch 1 stops getting faster: a batch-1 decode step streams every weight once, so its
compute part shrinks about as ``weight bytes / k / DRAM bandwidth`` plus what does not shrink (each
launch's host cost, the step's fixed launches), while each of the ``2L + 2`` collectives costs a ring
all-reduce's ``2 (k-1)`` message latencies on an 8 KB message, which *grows* with ``k``.
:func:`explain_decode` puts the two side by side from the table.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spyre_lab.distributed.links import card_link
from spyre_lab.engine.models.config import ModelConfig
from spyre_lab.studies.granite8b import GRANITE_3_3_8B, ProbeCache, StepConfig, StepTiming, time_steps
from spyre_lab.studies.tp_sharding import (  # noqa: F401 (the study's vocabulary, re-exported)
    ACTIVATION_BYTES,
    TP_SIZES,
    shard_config,
    step_collectives,
    weight_bytes,
)
from spyre_lab.studies.tp_table import section_table  # noqa: F401 (re-exported: the section's Markdown table)

BUCKETS = (("prefill", 1024), ("decode", 1))


@dataclass(frozen=True)
class TPRow:
    """One bucket at one TP size: the rank's compute, the group's collectives, and the step (modeled µs)."""

    tp: int
    kind: str
    size: int
    compute_us: float
    collective_us: float
    collectives: int
    weight_bytes_per_card: int
    collective_latency_us: float  # the part of collective_us that is message latency, not bytes

    @property
    def step_us(self) -> float:
        return self.compute_us + self.collective_us

    @property
    def collective_share(self) -> float:
        return self.collective_us / self.step_us if self.step_us else 0.0

    def to_dict(self) -> dict[str, float | int | str]:
        return {**dataclasses.asdict(self), "step_us": self.step_us, "collective_share": self.collective_share}


def tensor_parallel_table(tp_sizes: Sequence[int] = TP_SIZES, buckets: Sequence[tuple[str, int]] = BUCKETS,
                          config: ModelConfig = GRANITE_3_3_8B, step: StepConfig | None = None,
                          depth: str | int = "probe", probes: ProbeCache | None = None,
                          one_card: Mapping[tuple[str, int], StepTiming] | None = None) -> list[TPRow]:
    """One :class:`TPRow` per (TP size, bucket): one rank timed on the card plus the modeled collectives.

    ``one_card``: the unsharded model's timings of these buckets, already computed with ``step`` (TP 1 is that
    model, so it is not timed again)."""
    step = step or StepConfig()
    rows = []
    for k in tp_sizes:
        at_k = dataclasses.replace(step, tensor_parallel=k)    # the step table's own configuration, on k cards
        if k == 1 and one_card is not None and all(b in one_card for b in buckets):
            timings = one_card
        else:
            timings = time_steps(at_k, list(buckets), depth=depth, config=config, probes=probes)
        for kind, size in buckets:
            t = timings[(kind, size)]
            rows.append(TPRow(k, kind, size, t.compute_us, t.collective_us, t.collectives,
                              weight_bytes(shard_config(config, k)), t.collective_latency_us))
    return rows


def format_table(rows: Sequence[TPRow]) -> str:
    """The table as text (modeled µs)."""
    lines = [f"{'bucket':<14}{'TP':>3}{'compute us':>13}{'collect. us':>13}{'step us':>12}{'share':>8}"
             f"{'speed-up':>10}{'GB/card':>9}", "-" * 82]
    base = {(r.kind, r.size): r.step_us for r in rows if r.tp == 1}
    for r in rows:
        speedup = f"{base[(r.kind, r.size)] / r.step_us:.2f}x" if (r.kind, r.size) in base else "-"
        lines.append(f"{r.kind + ' ' + str(r.size):<14}{r.tp:>3}{r.compute_us:>13,.0f}{r.collective_us:>13,.0f}"
                     f"{r.step_us:>12,.0f}{r.collective_share:>8.1%}{speedup:>10}{r.weight_bytes_per_card / 1e9:>9.2f}")
    lines.append(f"modeled; collectives over the card-to-card link {card_link().describe()}")
    return "\n".join(lines)


def explain_decode(rows: Sequence[TPRow], size: int = 1) -> str:
    """Where TP stops paying for decode at batch ``size``, from the table's own numbers."""
    decode = sorted((r for r in rows if r.kind == "decode" and r.size == size), key=lambda r: r.tp)
    if len(decode) < 2:
        raise ValueError(f"explain_decode needs decode {size} at two or more TP sizes; the table has {len(decode)}")
    best = min(decode, key=lambda r: r.step_us)
    latency = card_link().latency_us
    tps = [r.tp for r in decode]
    out = [f"decode batch {size}: fastest at TP {best.tp} of {tps} ({best.step_us:,.0f} us modeled)."]
    for a, b in itertools.pairwise(decode):
        saved, added = a.compute_us - b.compute_us, b.collective_us - a.collective_us
        more_rounds = (b.collective_latency_us - a.collective_latency_us) / latency if latency else 0.0
        byte_part = added - (b.collective_latency_us - a.collective_latency_us)
        verdict = "pays" if saved > added else "does not pay"
        line = (f"TP {a.tp}->{b.tp}: per-card weights {a.weight_bytes_per_card / 1e9:.2f} -> "
                f"{b.weight_bytes_per_card / 1e9:.2f} GB save {saved:,.0f} us of compute; the step's {b.collectives} "
                f"collectives add {added:,.0f} us ({more_rounds:,.0f} more message latencies): {verdict}")
        if more_rounds > 0:
            line += f"; it stops paying once a message costs more than {(saved - byte_part) / more_rounds:,.1f} us"
        out.append(line + ".")
    out.append(f"(card-to-card message latency in force: {latency:.1f} us, an estimate; each doubling of TP halves "
               "the weight bytes saved per card while a ring all-reduce's 2(k-1) latencies keep growing.)")
    return "\n".join(out)


METHOD = ("one rank's programs (the spyre platform's real path on the shapes one card of k holds) plus the group's "
          "modeled collectives (2 all-reduces per layer, one after the embedding, one logits gather), no overlap")


def reproduce_section(depth: str | int = "probe",
                      one_card: Mapping[tuple[str, int], StepTiming] | None = None) -> dict[str, object]:
    """The TP table as ``spyre-lab reproduce`` carries it (JSON-ready): method, link, rows, the decode verdict."""
    rows = tensor_parallel_table(depth=depth, one_card=one_card)
    return {"method": METHOD, "link": card_link().describe(), "rows": [r.to_dict() for r in rows],
            "decode_batch_1": explain_decode(rows)}


def main() -> None:
    rows = tensor_parallel_table()
    print(format_table(rows))
    print()
    print(explain_decode(rows))


if __name__ == "__main__":
    main()
