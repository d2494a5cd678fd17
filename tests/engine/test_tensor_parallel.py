"""Tensor parallelism on the cpu platform: the sharded model computes what one card computes, and a failed
worker is reported (rank and cause) instead of hanging, leaving no process, socket or rendezvous file behind.

Every LLM with tensor_parallel_size > 1 spawns k - 1 workers (at most 3 here) and is closed before the next one.
Each spawn starts an interpreter that imports torch, so the tests that only read a TP-2 tiny-granite engine share
one (`two_cards`), and the one-card results are computed once.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import pytest
import torch
from spyre_tp_runs import prefill_logits

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.parallel.drills import fail_next_step
from spyre_lab.engine.parallel.launcher import TensorParallelError
from spyre_lab.engine.platforms.cpu import CpuPlatform

PROMPTS = [[1, 5, 17, 33, 9, 40, 12], [1, 7, 8, 9, 10, 11, 12, 13, 14, 3], [1, 3, 4]]  # ids in both vocabularies
GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
# fp32 weights: sharding changes only the order of the sums (per-rank partials, then the all-reduce), so the
# logits (|x| up to 13) agree to float32 rounding; measured max |diff| 2.4e-6 (TP 2), 3.8e-6 (TP 4)
FP32_TOLERANCE = dict(atol=1e-4, rtol=1e-4)
# fp16 weights and activations: an fp16 ulp at |x| in [8, 16) is 2**-7; measured max |diff| 0.012 (TP 2), 0.016 (TP 4)
FP16_TOLERANCE = dict(atol=2e-2, rtol=1e-2)
OPTIONS = dict(max_model_len=64, block_size=8, max_num_seqs=4, distributed_timeout_s=30)


def token_ids(llm: LLM, prompts: list) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def results(model: str, size: int, dtype: str = "float32") -> tuple[torch.Tensor, list[list[int]]]:
    with LLM(model, tensor_parallel_size=size, dtype=dtype, **OPTIONS) as llm:
        return prefill_logits(llm, PROMPTS), token_ids(llm, PROMPTS)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> str:
    from tests.engine.conftest import save_hf_model

    return save_hf_model(tmp_path_factory.mktemp("tp_llama"), "llama")


def children() -> set[int]:
    """Pids of this process's live children, read from the process table (/proc)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z" and not _is_resource_tracker(entry):
                found.add(int(entry))
    return found


def _is_resource_tracker(pid: str) -> bool:
    """multiprocessing's shared helper (started by the first spawn, it lives as long as this process)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"resource_tracker" in cmdline.read()
    except OSError:
        return False


def listening_sockets() -> set[int]:
    """Inodes of the TCP sockets this process holds in LISTEN state (/proc/net/tcp*, matched to our fds)."""
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            listening |= {int(row.split()[9]) for row in list(rows)[1:] if row.split()[3] == "0A"}
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            ours.add(int(target[8:-1]))
    return listening & ours


@dataclass
class TwoCards:
    """What the module's shared TP-2 tiny-granite engine (fp32) showed, and the one-card engine beside it."""

    rendezvous_error: str           # what a rank 0 whose worker never joins raised, before the engine started
    logits: dict[int, torch.Tensor]
    tokens: dict[int, list[list[int]]]
    heads: tuple[int, int]          # rank 0's layer-0 attention: (query heads, KV heads)
    kv_cache_bytes: dict[int, int]
    weights: dict[int, int]         # rank 0's parameter count
    worker_weights: list[int]       # the workers' parameter counts (rank 1..)
    after_idle: list[list[int]]     # the first prompt's tokens again, after idling past the collective timeout
    idle_s: float


IDLE_TIMEOUT_S = 8


@pytest.fixture(scope="module")
def two_cards(tmp_path_factory) -> TwoCards:
    """One TP-2 engine for the tests that only read it (each spawn imports torch in a new interpreter); it is
    closed before any other test starts its own (a process belongs to one group at a time)."""
    from spyre_lab.engine.parallel.worker import init_group

    with pytest.raises(Exception, match=r"[Tt]ime") as failed:   # a rendezvous that times out leaves no group
        init_group(0, 2, str(tmp_path_factory.mktemp("rendezvous") / "rendezvous"), timeout_s=1)
    assert not torch.distributed.is_initialized()
    with LLM("tiny-granite", **OPTIONS) as one:
        one_logits, one_tokens = prefill_logits(one, PROMPTS), token_ids(one, PROMPTS)
        one_kv, one_weights = one.llm_engine.runner.kv_cache_bytes, weight_count(0, one.llm_engine.runner)
    with LLM("tiny-granite", tensor_parallel_size=2, **OPTIONS) as two:
        logits, tokens = prefill_logits(two, PROMPTS), token_ids(two, PROMPTS)
        attention = two.llm_engine.model.model.layers[0].self_attn.attn
        idle_s = 0.0
        return TwoCards(str(failed.value), {1: one_logits, 2: logits}, {1: one_tokens, 2: tokens},
                        (attention.num_heads, attention.num_kv_heads),
                        {1: one_kv, 2: two.llm_engine.runner.kv_cache_bytes},
                        {1: one_weights, 2: weight_count(0, two.llm_engine.runner)},
                        two.llm_engine.tensor_parallel.call(weight_count), token_ids(two, PROMPTS[:1]), idle_s)


def test_tiny_granite_on_two_cards_matches_one_card(two_cards):
    torch.testing.assert_close(two_cards.logits[2], two_cards.logits[1], **FP32_TOLERANCE)
    assert two_cards.tokens[2] == two_cards.tokens[1]
    assert all(len(t) == 32 for t in two_cards.tokens[1])


def test_tiny_granite_on_four_cards_matches_one_card(two_cards):
    sharded_logits, sharded_tokens = results("tiny-granite", 4)
    torch.testing.assert_close(sharded_logits, two_cards.logits[1], **FP32_TOLERANCE)
    assert sharded_tokens == two_cards.tokens[1]


def test_llama_shaped_model_sharded_matches_one_card(llama_dir):
    """vocab 128, 4 query heads over 2 KV heads, untied LM head: TP 2 splits the KV heads, TP 4 replicates them."""
    logits, tokens = results(llama_dir, 1)
    for size in (2, 4):
        sharded_logits, sharded_tokens = results(llama_dir, size)
        torch.testing.assert_close(sharded_logits, logits, **FP32_TOLERANCE)
        assert sharded_tokens == tokens


def test_fp16_sharded_matches_one_card_within_fp16_tolerance():
    logits, tokens = results("tiny-granite", 1, "float16")
    sharded_logits, sharded_tokens = results("tiny-granite", 2, "float16")
    assert sharded_logits.dtype == torch.float16
    torch.testing.assert_close(sharded_logits, logits, **FP16_TOLERANCE)
    assert sharded_tokens == tokens


def test_static_shapes_warm_up_every_rank_and_decode_the_same_tokens():
    """The bucketed path: warmup runs each bucket on every rank (padding included), then the same greedy tokens."""
    options = {**OPTIONS, "static_shapes": True, "prefill_buckets": [16, 64], "batch_buckets": [4]}
    with LLM("tiny-granite", **options) as one:
        one.warmup(show_progress=False)
        tokens = token_ids(one, PROMPTS)
    with LLM("tiny-granite", tensor_parallel_size=2, **options) as two:
        two.warmup(show_progress=False)
        assert token_ids(two, PROMPTS) == tokens


def test_an_idle_engine_outlives_the_collective_timeout():
    """Workers wait for commands on a pipe, not in a collective: idling past the timeout breaks nothing."""
    with LLM("tiny-granite", tensor_parallel_size=2, **{**OPTIONS, "distributed_timeout_s": IDLE_TIMEOUT_S}) as llm:
        first = token_ids(llm, PROMPTS[:1])
        time.sleep(IDLE_TIMEOUT_S + 1)
        assert token_ids(llm, PROMPTS[:1]) == first


def test_each_rank_holds_its_share_of_weights_and_kv_cache(two_cards):
    assert two_cards.heads == (2, 1)
    assert two_cards.kv_cache_bytes[2] * 2 == two_cards.kv_cache_bytes[1]
    assert two_cards.worker_weights == [two_cards.weights[2]] and two_cards.weights[2] < two_cards.weights[1]


def weight_count(rank, runner) -> int:
    return sum(p.numel() for p in runner.model.parameters())


def test_a_worker_that_raises_is_named_with_its_cause_and_leaves_nothing_behind():
    before, sockets = children(), listening_sockets()
    llm = LLM("tiny-granite", tensor_parallel_size=2, **OPTIONS)
    workers = llm.llm_engine.tensor_parallel
    assert listening_sockets() - sockets, "gloo's endpoint should be listening while the group is up"
    assert set(workers.pids.values()) <= children() - before
    assert workers.call(fail_next_step, 1, "HBM page lost") == [True]
    with pytest.raises(TensorParallelError, match=r"rank 1 raised InjectedFault: HBM page lost"):
        llm.generate(["hello"], GREEDY, use_tqdm=False)
    assert children() - before == set()
    assert listening_sockets() - sockets == set()
    assert not os.path.exists(workers.rendezvous)
    assert not torch.distributed.is_initialized()
    with pytest.raises(TensorParallelError, match="rank 1"):   # the engine stays failed, it does not hang
        llm.generate(["hello"], GREEDY, use_tqdm=False)
    llm.close()


def test_a_worker_that_dies_is_named_within_the_timeout():
    before, sockets = children(), listening_sockets()
    llm = LLM("tiny-granite", tensor_parallel_size=2, **OPTIONS)
    workers = llm.llm_engine.tensor_parallel
    assert listening_sockets() - sockets, "gloo's endpoint should be listening while the group is up"
    os.kill(workers.pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(TensorParallelError, match=r"rank 1 died \(killed by SIGKILL\)"):
        llm.generate(["hello"], GREEDY, use_tqdm=False)
    assert time.monotonic() - start < OPTIONS["distributed_timeout_s"]
    assert children() - before == set()
    assert listening_sockets() - sockets == set()
    assert not os.path.exists(workers.rendezvous)
    llm.close()


def test_a_rendezvous_that_times_out_leaves_the_next_engine_able_to_start(two_cards):
    """Rank 0 waits for a worker that never joins: a timeout, no group, and the next group forms normally (the
    shared engine was started right after such a failure)."""
    assert "ime" in two_cards.rendezvous_error
    assert all(len(t) == 32 for t in two_cards.tokens[2])


@pytest.mark.parametrize(("options", "message"), [
    (dict(tensor_parallel_size=3), "num_attention_heads=4 does not split across tensor_parallel_size=3"),
    (dict(tensor_parallel_size=2, dtype="bfloat16"), "gloo, which has no bfloat16 sum"),
    (dict(tensor_parallel_size=2, platform=CpuPlatform()), r"runs on the platforms \('cpu', 'spyre'\) \(by name\)"),
])
def test_unsupported_tensor_parallel_settings_fail_before_any_worker_starts(options, message):
    before = children()
    with pytest.raises(ValueError, match=message):
        LLM("tiny-granite", **{**OPTIONS, **options})
    assert children() - before == set()


def test_mixed_steps_with_tensor_parallelism_is_refused_naming_the_fix():
    from spyre_lab.engine.config import EngineConfig

    with pytest.raises(ValueError, match=r"set mixed_steps=False \(or leave it None\) with tensor_parallel_size=2"):
        EngineConfig(tensor_parallel_size=2, mixed_steps=True)
    assert EngineConfig(tensor_parallel_size=2, mixed_steps=False).mixed_steps is False


def test_the_tensor_parallel_runner_refuses_a_mixed_step_by_name_before_any_rank_runs_it():
    from spyre_lab.engine.parallel.launcher import TensorParallelRunner

    class Workers:                     # records what would reach the workers: a refused step must send nothing
        def __init__(self) -> None:
            self.sent: list[tuple] = []

        def send(self, *command):
            self.sent.append(command)

    workers = Workers()
    runner = TensorParallelRunner(runner=None, workers=workers)
    with pytest.raises(ValueError, match="runs prefill and decode steps apart; set mixed_steps=False"):
        runner.run([], is_prefill=True, num_decode=2)
    assert workers.sent == []
