"""Many cards in the trace and the timeline: a lane group per card, flows between one collective's cards.

The collectives come from real spyreccl processes (``run_ranks``, two ranks, one all-reduce per size); the
first DecodeTimeline test puts rank 0's recorded collectives into a real one-card engine step of the spyre platform
(card 1 mirrored); the last draws an engine-recorded tensor-parallel run (``tensor_parallel_size=2`` on the spyre
platform), where each card's lane is its own rank's recording.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from spyre_lab.compiler.explain import collectives_section
from spyre_lab.device.trace import Trace, TraceEvent, collective_flows
from spyre_lab.distributed import allreduce_cost
from spyre_lab.distributed.launch import run_ranks
from spyre_lab.viz import sources, style
from spyre_lab.viz.step_lanes import step_lanes
from spyre_lab.viz.timeline_cards import FLOWS_NAME, flow_spec

WORKERS = Path(__file__).with_name("card_workers.py")
SIZES = [4096, 65536]
WORLD = 2


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_ranks(WORKERS, "recorded_allreduces", WORLD, args=(SIZES,), timeout_s=90)


def _ccl_only(doc: dict) -> Trace:
    trace = Trace.from_chrome_trace(doc)
    return Trace([e for e in trace.events if e.lane.endswith(".ccl")])


@pytest.fixture(scope="module")
def both_cards(ranks: list[dict]) -> Trace:
    merged = Trace()
    for result in ranks:
        merged.extend(_ccl_only(result["trace"]))
    return merged


def test_each_collective_flows_to_the_same_collective_on_its_peer(both_cards: Trace) -> None:
    pairs = collective_flows(both_cards.events)
    assert len(pairs) == len(SIZES) * WORLD * (WORLD - 1)
    for source, peer in pairs:
        assert source.lane != peer.lane and source.args["bytes"] == peer.args["bytes"]
    assert sorted(p[0].args["bytes"] for p in pairs) == sorted(2 * n for n in SIZES for _ in range(WORLD))


def test_perfetto_export_has_a_process_per_card_and_matching_flow_ends(both_cards: Trace) -> None:
    doc = both_cards.to_chrome_trace()
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert sorted(names.values()) == ["card0", "card1"]
    starts = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "f"}
    assert len(starts) == len(ends) == len(SIZES) * WORLD * (WORLD - 1) and starts.keys() == ends.keys()
    for flow_id, start in starts.items():
        assert names[start["pid"]] != names[ends[flow_id]["pid"]]         # each flow crosses to a peer card
        assert ends[flow_id]["bp"] == "e"
    assert len(Trace.from_chrome_trace(doc)) == len(both_cards)            # flows do not come back as events


def test_one_rank_stands_for_its_symmetric_peers(ranks: list[dict]) -> None:
    rank0 = _ccl_only(ranks[0]["trace"])
    filled, mirrored = sources.symmetric_cards(rank0)
    assert mirrored == [1]
    assert [e.start_us for e in filled.on("card1.ccl")] == [e.start_us for e in rank0.on("card0.ccl")]
    assert all(e.args["mirrored_from"] == 0 for e in filled.on("card1.ccl"))
    untouched, none = sources.symmetric_cards(Trace([TraceEvent("host", "enqueue", 0.0, 1.0)]))
    assert none == [] and len(untouched) == 1


def test_step_lanes_put_each_cards_collectives_on_its_own_lane_in_the_link_color(both_cards: Trace) -> None:
    lanes, order = step_lanes(both_cards)
    assert order == ["card 0 collectives", "card 1 collectives"]
    assert all(color == style.UNIT_COLORS["link"] for name in order for _, color in lanes[name])
    assert [e.dur_us for e, _ in lanes["card 0 collectives"]] == pytest.approx(
        [allreduce_cost(2 * n, WORLD).us for n in SIZES])


def test_flow_lines_join_the_lanes_of_the_two_cards(both_cards: Trace) -> None:
    spec = flow_spec(both_cards, lambda card: f"card {card} collectives")
    assert spec is not None and spec["name"] == FLOWS_NAME
    segments = [spec["y"][i:i + 2] for i in range(0, len(spec["y"]), 3)]
    assert segments == [["card 0 collectives", "card 1 collectives"]] * len(SIZES)
    assert flow_spec(Trace([TraceEvent("host", "enqueue", 0.0, 1.0)]), str) is None


def test_explain_lists_the_groups_collectives_with_algorithm_bytes_time_and_link(ranks: list[dict]) -> None:
    for result in ranks:
        assert result["collectives"] == [allreduce_cost(2 * n, WORLD).describe() for n in SIZES]
    text = collectives_section([allreduce_cost(2 * n, WORLD) for n in SIZES] + [allreduce_cost(2 * SIZES[0], WORLD)])
    first = allreduce_cost(2 * SIZES[0], WORLD)
    assert f"   2x allreduce  [ring] {2 * SIZES[0]:>12,} B over 2 cards" in text
    assert f"on {first.link} = {first.us:8.2f} us each" in text
    total = 2 * first.us + allreduce_cost(2 * SIZES[1], WORLD).us
    assert text.endswith(f"collectives total: {total:,.2f} us modeled")
    assert collectives_section([]) == ""


@pytest.fixture(scope="module")
def tp_run(ranks: list[dict]):
    """A real spyre-platform engine run whose decode steps each end with rank 0's recorded collectives."""
    import dataclasses

    import torch
    from warning_checks import only_warnings

    from spyre_lab.engine import LLM, SamplingParams
    from spyre_lab.engine.platforms.spyre import SpyrePlatform

    torch.manual_seed(0)
    with only_warnings(r"spyre: aten\.embedding runs on the host CPU"):
        llm = LLM("tiny-granite", platform=SpyrePlatform(prefill_buckets=[64], batch_buckets=[1]),
                  max_model_len=64, max_num_seqs=1)
        llm.generate(["3 + 4 ="], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    run = sources.as_run(llm.stats, "TP 2, rank 0")
    rank0 = _ccl_only(ranks[0]["trace"])
    for row in run.served:
        detail = run.details.get(row["step"])
        if row["kind"] == "decode" and detail is not None and detail.device_trace is not None:
            step = detail.device_trace
            collectives = rank0.shifted(step.end_us - rank0.start_us)
            run.details[row["step"]] = dataclasses.replace(detail, device_trace=Trace([*step.events, *collectives]))
    return run


def test_decode_timeline_draws_a_collectives_lane_per_card_and_the_flows_between(tp_run) -> None:
    from spyre_lab.viz.timeline import DecodeTimeline

    view = DecodeTimeline(tp_run)
    fig = view.figure
    lanes = [t.name for t in fig.data if t.type == "bar" and t.orientation == "h" and t.xaxis == "x4"]
    assert lanes[-2:] == ["card 0 collectives", "card 1 collectives"]
    (flows,) = [t for t in fig.data if t.name == FLOWS_NAME]
    assert flows.line.color == style.UNIT_COLORS["link"] and list(flows.y).count(None) == len(SIZES)
    assert "card 1 is drawn from the recorded rank's timing" in view.caption
    decode = [r["step"] for r in tp_run.served if r["kind"] == "decode" and r["step"] != view.step]
    view.fig_widget  # noqa: B018  (the live figure the slider updates in place)
    view.controls["step"].value = decode[0]
    live = [(t.name, t.x, t.y) for t in view.fig_widget.data if t.xaxis == "x4"]
    full = [(t.name, t.x, t.y) for t in view.figure.data if t.xaxis == "x4"]
    assert live == full and any(name == FLOWS_NAME for name, _, _ in live)


def test_explain_of_a_program_appends_the_steps_collectives_only_when_there_are_some() -> None:
    import torch

    from spyre_lab.compiler.backend import compile_graph
    from spyre_lab.compiler.explain import explain
    from spyre_lab.studies.granite8b import GRANITE_3_3_8B
    from spyre_lab.studies.tensor_parallel import step_collectives

    program = compile_graph(lambda x: torch.relu(x) * 2, [torch.randn(64, 128, dtype=torch.float16)])
    step = step_collectives(GRANITE_3_3_8B, 4, "decode", 1)
    text = explain(program, collectives=step)
    assert "  collectives (82, modeled" in text and "81x allreduce  [ring]        8,192 B over 4 cards" in text
    assert f"collectives total: {sum(c.us for c in step):,.2f} us modeled" in text
    assert "collectives (" not in explain(program)          # no spyreccl group in this process: no section


@pytest.fixture(scope="module")
def engine_tp_run():
    """A real tensor-parallel run on the spyre platform (two ranks, shared with the engine's TP tests)."""
    from spyre_tp_runs import spyre_runs

    return spyre_runs()[2].stats


def test_decode_timeline_of_an_engine_tp_run_draws_each_cards_own_collectives(engine_tp_run) -> None:
    """No mirroring: every card's lane is the collectives its own rank recorded, joined to the peer's."""
    from spyre_lab.viz.timeline import DecodeTimeline

    decode = next(s.step for s in engine_tp_run.steps if s.kind == "decode")
    view = DecodeTimeline(engine_tp_run, step=decode)
    fig = view.figure
    lanes = [t.name for t in fig.data if t.type == "bar" and t.orientation == "h" and t.xaxis == "x4"]
    assert lanes[-2:] == ["card 0 collectives", "card 1 collectives"]
    card0, card1 = (next(t for t in fig.data if t.name == f"card {c} collectives" and t.xaxis == "x4") for c in (0, 1))
    assert len(card0.x) == len(card1.x) > 0
    trace = engine_tp_run.details[decode].device_trace
    assert all("mirrored_from" not in e.args and e.args["rank"] == 1 for e in trace.on("card1.ccl"))
    (flows,) = [t for t in fig.data if t.name == FLOWS_NAME]
    assert list(flows.y).count(None) == len(card0.x)                   # one segment per collective
    assert "each card's lane is its own rank's recording" in view.caption
    assert "drawn from the recorded rank's timing" not in view.caption
