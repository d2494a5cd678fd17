"""One tiny-granite run on the spyre platform on one card and on two (``tensor_parallel_size=2``), shared.

Each spawned rank imports torch and compiles its pieces (tens of CPU seconds on two cores), so the two runs are
made once per test session (``functools.cache``) and every module that needs them reads the same results through
a module-scoped fixture: tests/engine/test_tensor_parallel_spyre.py and tests/viz/test_timeline_cards.py.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from warning_checks import SPYRE_ENGINE_WARNINGS, only_warnings

PROMPTS = [[1, 5, 17, 33, 9, 40, 12], [1, 7, 8, 9, 10, 11, 12, 13, 14, 3], [1, 3, 4]]
STEPS = 32
OPTIONS = dict(platform="spyre", max_model_len=64, block_size=8, max_num_seqs=4, prefill_buckets=[64],
               batch_buckets=[4], distributed_timeout_s=120)
EXPECTED_WARNINGS = (*SPYRE_ENGINE_WARNINGS,
                     r"spyre: aten\.bitwise_or runs on the host CPU")  # the vocab-parallel embedding's id mask


@dataclass
class SpyreRun:
    logits: torch.Tensor                 # last-position logits of one prefill step over PROMPTS (rank 0's)
    tokens: list[list[int]]              # STEPS greedy tokens per prompt
    stats: object                        # rank 0's EngineStats (steps, details with each step's modeled trace)
    charged: list[float]                 # modeled us of every collective rank 0's spyreccl group charged in generate
    backend: str                         # the default group's backend name ("" on one card)


def prefill_logits(llm, prompts: list[list[int]]) -> torch.Tensor:
    """Last-position logits of one prefill step over ``prompts``, on the host (on every rank, as a step runs)."""
    from spyre_lab.engine import SamplingParams
    from spyre_lab.engine.sequence import Sequence

    engine = llm.llm_engine
    seqs = [Sequence(str(i), list(p), SamplingParams()) for i, p in enumerate(prompts)]
    for seq in seqs:
        engine.block_manager.allocate(seq)
    runner = engine.runner
    logits = runner.step_logits(seqs, is_prefill=True) if engine.tensor_parallel else \
        runner.execute(runner.prepare_prefill(seqs))
    for seq in seqs:
        engine.block_manager.free(seq)
    return logits.cpu().clone()


def _run(size: int) -> SpyreRun:
    import torch.distributed as dist

    from spyre_lab.engine import LLM, SamplingParams

    greedy = SamplingParams(max_tokens=STEPS, temperature=0.0, ignore_eos=True)
    with only_warnings(*EXPECTED_WARNINGS), LLM("tiny-granite", tensor_parallel_size=size, **OPTIONS) as llm:
        llm.warmup(show_progress=False)
        logits = prefill_logits(llm, PROMPTS)
        group = dist.group.WORLD if dist.is_initialized() else None
        before = len(group.history) if group is not None else 0
        tokens = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
        charged = [c.us for c in list(group.history)[before:]] if group is not None else []
        backend = group.getBackendName() if group is not None else ""
        return SpyreRun(logits, tokens, llm.stats, charged, backend)


@functools.cache
def spyre_runs() -> dict[int, SpyreRun]:
    """{1: the one-card run, 2: the two-card run}, made once per session."""
    return {size: _run(size) for size in (1, 2)}
