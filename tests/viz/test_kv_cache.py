"""KVCacheView on a real engine run that runs out of blocks: states, tables, prefix hits, preemption, replay."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.viz import kv_cache as kv_module
from spyre_lab.viz import style
from spyre_lab.viz.kv_cache import KVCacheView

torch.set_num_threads(1)
# two prompts share their first block ("count from 5 to "), and ten blocks of eight tokens cannot hold four
# 24-token completions: the scheduler must preempt
PROMPTS = ["count from 5 to 12:", "count from 5 to 9:", "letters from c to h:", "3 + 4 ="]


@pytest.fixture(scope="module")
def llm():
    llm = LLM("tiny-granite", platform="cpu", max_model_len=64, max_num_seqs=4, num_kv_blocks=10, block_size=8)
    llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    return llm


def _grid(fig):
    return next(t for t in fig.data if t.name == "blocks")


def _tables(fig):
    return next(t for t in fig.data if t.name == "tables")


def test_block_colors_follow_the_snapshot(llm):
    view = KVCacheView(llm)
    for step in view.steps[:12]:
        view.step = step
        kv = view.snapshot
        grid = _grid(view.figure)
        holders = {b: r for r, table in kv.tables.items() for b in table}
        assert len(grid.marker.color) == kv.num_blocks
        for block_id, color in enumerate(grid.marker.color):
            state = kv.state(block_id)
            expected = style.request_color(holders[block_id]) if state == "used" else style.KV_STATE_COLORS[state]
            assert color == expected, (step, block_id)
        assert sum(kv.counts().values()) == kv.num_blocks


def test_opens_on_the_preemption_and_marks_events(llm):
    view = KVCacheView(llm)
    stats = llm.stats
    assert stats.summary()["preemptions"] > 0
    assert view.details[view.step].preempted
    assert "preempted" in view.caption
    fig = view.figure
    preempted = next(t for t in fig.data if t.name == "preempted")
    assert list(preempted.x) == [n for n, d in stats.details.items() if d.preempted]
    finished = next(t for t in fig.data if t.name == "finished")
    assert sum(len(stats.details[n].finished) for n in finished.x) == len(PROMPTS)


def test_shared_prefix_is_marked_in_the_block_tables(llm):
    view = KVCacheView(llm)
    hit_steps = [n for n, d in view.details.items() if any(d.kv.cached_tokens.get(r, 0) for r in d.arrived)]
    assert hit_steps, "the second 'count from 5 to' prompt should reuse the first one's full block"
    view.step = hit_steps[0]
    kv = view.snapshot
    tables = _tables(view.figure)
    outlined = [h for h, w in zip(tables.hovertext, tables.marker.line.width) if w > 1]
    assert outlined and all("prefix cache hit" in h for h in outlined)
    reused = {r for r in view.details[view.step].arrived if kv.cached_tokens.get(r, 0)}
    assert len(outlined) == sum(kv.cached_tokens[r] // kv.block_size for r in reused)


def test_history_stacks_to_the_cache_size(llm):
    fig = KVCacheView(llm).figure
    areas = [t for t in fig.data if t.stackgroup == "blocks"]
    assert [t.name for t in areas] == ["used blocks", "cached blocks", "free blocks"]
    totals = [sum(values) for values in zip(*(t.y for t in areas))]
    assert set(totals) == {llm.llm_engine.block_manager.num_blocks}


def test_slider_replays_the_run(llm, tmp_path):
    view = KVCacheView(llm)
    before = tuple(view.fig_widget.data[0].marker.color)
    later = next(n for n in view.steps if n > view.step and view.details[n].kv.counts() !=
                 view.details[view.step].kv.counts())
    view.controls["step"].value = later
    assert tuple(view.fig_widget.data[0].marker.color) != before
    assert f"step {later}" in view.caption
    saved = KVCacheView(str(llm.stats.save_json(tmp_path / "stats.json")), step=later)
    assert _grid(saved.figure).marker.color == _grid(view.figure).marker.color


def test_big_caches_aggregate_with_a_note(llm, monkeypatch):
    monkeypatch.setattr(kv_module, "MAX_GRID_BLOCKS", 4)
    fig = KVCacheView(llm).figure
    assert len(_grid(fig).x) == 4
    assert any("first 4 of 10 blocks" in a.text for a in fig.layout.annotations)


def test_no_snapshots_is_a_clear_error():
    fresh = LLM("tiny-granite", platform="cpu", max_model_len=64, max_num_seqs=1)
    with pytest.raises(ValueError, match="serve some requests first"):
        KVCacheView(fresh)
