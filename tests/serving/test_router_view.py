"""RouterView on a real recorded run (the session's server, loaded by the real load generator)."""

from __future__ import annotations

import json

import httpx
import plotly.graph_objects as go
import pytest

from spyre_lab.serving.load import run_load, shared_prefix_workload, summarize
from spyre_lab.viz import RouterView, style


@pytest.fixture(scope="module")
def record(server):
    name = server.url.split("://")[1]
    runs = {}
    for policy in ("cold", "warm"):  # the second pass finds the first one's prefixes in the cache
        if policy == "cold":
            httpx.post(f"{server.url}/reset_prefix_cache", timeout=10).raise_for_status()
        run = run_load(server.url, shared_prefix_workload(6, num_prefixes=2, prefix_chars=48), [server.url],
                       rate=20, max_tokens=4, timeout_s=60)
        runs[policy] = {**run, "summary": summarize(run)}
    return {"config": {"replicas": [name]}, "runs": {"shared-prefix": runs}}


def test_the_view_draws_every_request_and_the_hit_rates_it_recorded(record, tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))
    view = RouterView.from_json(path, policy="cold")
    fig = view.figure
    go.Figure(fig.to_dict())  # every trace passes plotly's validators
    markers = [t for t in fig.data if t.type == "scatter" and t.mode == "markers"]
    assert sum(len(t.x) for t in markers) == 6 and markers[0].marker.color == style.replica_color(0)
    bars = next(t for t in fig.data if t.type == "bar")
    assert list(bars.x) == ["cold", "warm"]
    assert list(bars.y) == [record["runs"]["shared-prefix"][p]["summary"]["prefix_hit_rate"] for p in bars.x]
    assert bars.y[1] > bars.y[0]  # the warm pass reuses the cold pass's prefixes
    assert "wall" in fig.layout.title.text and "cold" in view.caption
    panel_titles = [a.y for a in fig.layout.annotations if a.yref == "paper"]
    assert fig.layout.legend.y > max(panel_titles), "the replica legend does not print over the panel titles"
    view.widget  # noqa: B018
    view.controls["policy"].value = "warm"
    assert "warm" in view.fig_widget.layout.title.text and "warm" in view.caption
    assert [r["policy"] for r in view.summary_rows()] == ["cold", "warm"]


def test_a_bad_source_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"bench_serving\.py --out"):
        RouterView(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="recorded run"):
        RouterView({"x": 1})
    with pytest.raises(ValueError, match="no policy 'nope'"):
        RouterView({"runs": {"w": {"a": {"requests": [], "samples": [], "summary": {}}}}}, policy="nope")
