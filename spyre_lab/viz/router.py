"""RouterView: a recorded fleet run — where each request went, each replica's queue and KV cache, hit rate by policy.

Four panels from one run of ``benchmarks/bench_serving.py --out run.json`` (or :func:`spyre_lab.serving.load`
results in the same shape), for the workload and policy chosen above the figure:

* **requests**: each request at the time it was sent, its TTFT up the y axis, colored by the replica that served
  it (a failed request is an x);
* **queue**: each replica's waiting requests (``vllm:num_requests_waiting``) as the load generator scraped them;
* **KV cache**: each replica's ``vllm:kv_cache_usage_perc`` over the same time;
* **hit rate**: the prefix-cache hit rate every policy reached on this workload, the chosen one outlined.

All times are wall clock on the machine that ran it (measured, not modeled). The JSON keeps the notebook
deterministic: the view draws what was recorded, it runs nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from spyre_lab.viz import style
from spyre_lab.viz.base import View, base_layout, cached_subplots, toggle

WALL_S_AXIS = "wall time since the run started (s)"
LEGEND_Y = 1.06
"""The replica legend sits in the top margin, between the figure's title and the requests panel's title (at the
panel's top it printed over the panel title; the margin is made tall enough that it clears the figure title)."""


def _load(source: str | Path | dict[str, Any]) -> dict[str, Any]:
    if isinstance(source, str | Path):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"no such file: {path}; record one with benchmarks/bench_serving.py --out {path}")
        source = json.loads(path.read_text())
    if not isinstance(source, dict) or not source.get("runs"):
        raise ValueError("a RouterView needs a recorded run: a dict with 'runs' {workload: {policy: run}}, as "
                         "benchmarks/bench_serving.py --out writes")
    return source


class RouterView(View):
    """A recorded routing run: requests by replica, queue depth and KV usage per replica, hit rate per policy."""

    figure_height = 720

    def __init__(self, source: str | Path | dict[str, Any], workload: str | None = None,
                 policy: str | None = None) -> None:
        super().__init__()
        self.record = _load(source)
        self.workloads = list(self.record["runs"])
        self.workload = workload or self.workloads[0]
        if self.workload not in self.record["runs"]:
            raise ValueError(f"no workload {self.workload!r} in this run; it has {self.workloads}")
        self.policies = list(self.record["runs"][self.workload])
        self.policy = policy or self.policies[-1]
        if self.policy not in self.policies:
            raise ValueError(f"no policy {self.policy!r} for {self.workload!r}; it has {self.policies}")
        self.replicas = list(self.record.get("config", {}).get("replicas") or self._replicas_seen())

    def _replicas_seen(self) -> list[str]:
        seen = {r["replica"] for runs in self.record["runs"].values() for run in runs.values()
                for r in run["requests"] if r["replica"]}
        return sorted(seen)

    @classmethod
    def from_json(cls, source: str | Path | dict[str, Any], **kwargs: Any) -> RouterView:
        return cls(source, **kwargs)

    @property
    def run(self) -> dict[str, Any]:
        """The chosen workload and policy's recorded run (requests, samples, counters, summary)."""
        return self.record["runs"][self.workload][self.policy]

    def summary_rows(self) -> list[dict[str, Any]]:
        """One row per policy of the chosen workload: what the benchmark's table prints."""
        rows = []
        for policy, run in self.record["runs"][self.workload].items():
            s = run["summary"]
            rows.append({"policy": policy, "hit_rate": s["prefix_hit_rate"], "ttft_p50_ms": s["ttft_p50_ms"],
                         "ttft_p99_ms": s["ttft_p99_ms"], "errors": s["errors"],
                         "per_replica": [s["per_replica"].get(r, 0) for r in self.replicas]})
        return rows

    @property
    def caption(self) -> str:  # type: ignore[override]
        s = self.run["summary"]
        load = "/".join(str(s["per_replica"].get(r, 0)) for r in self.replicas)
        return (f"{self.workload}, {self.policy}: {s['requests']} requests ({load} per replica), prefix hit rate "
                f"{s['prefix_hit_rate']:.0%}, TTFT p50 {s['ttft_p50_ms']:.0f} ms (wall)")

    def make_controls(self) -> list[W.Widget]:
        controls = []
        if len(self.workloads) > 1:
            controls.append(self.bind("workload", toggle(self.workloads, self.workload, "workload")))
        controls.append(self.bind("policy", toggle(self.policies, self.policy, "policy")))
        return controls

    def build(self) -> go.Figure:
        layout, axes = cached_subplots(
            rows=3, cols=2, specs=[[{"colspan": 2}, None], [{}, {"rowspan": 2}], [{}, None]],
            column_widths=[0.7, 0.3], vertical_spacing=0.15, horizontal_spacing=0.1,
            subplot_titles=["requests: TTFT by send time, colored by replica", "queue: waiting requests",
                            "prefix-cache hit rate by policy", "KV cache: fraction of blocks held"],
            template="plotly_white", height=self.figure_height, margin=dict(l=70, r=20, t=130, b=50))
        traces = [*self._request_traces(axes[(1, 1)]), *self._sample_traces(axes[(2, 1)], "waiting", True),
                  *self._sample_traces(axes[(3, 1)], "kv_usage", False), self._hit_rate_trace(axes[(2, 2)])]
        base = base_layout(f"Routing a fleet: {self.workload} workload, {self.policy} (recorded run, wall clock)",
                           height=self.figure_height)
        layout.update({k: v for k, v in base.items() if k not in ("annotations", "height", "margin", "template")})
        layout["legend"] = {**layout["legend"], "y": LEGEND_Y}
        fig = go.Figure(data=traces, layout=layout, _validate=False)
        x1, y1 = axes[(1, 1)]
        fig.update_layout({f"{x1.replace('x', 'xaxis')}": dict(title=WALL_S_AXIS),
                           f"{y1.replace('y', 'yaxis')}": dict(title="TTFT (ms, wall)")})
        x3, y3 = axes[(3, 1)]
        fig.update_layout({f"{x3.replace('x', 'xaxis')}": dict(title=WALL_S_AXIS),
                           f"{y3.replace('y', 'yaxis')}": dict(range=[0, 1.05])})
        _, y4 = axes[(2, 2)]
        fig.update_layout({f"{y4.replace('y', 'yaxis')}": dict(range=[0, 1], tickformat=".0%")})
        return fig

    def _request_traces(self, axis: tuple[str, str]) -> list[dict]:
        traces = []
        requests = self.run["requests"]
        for index, replica in enumerate(self.replicas):
            mine = [r for r in requests if r["replica"] == replica and r["error"] is None and r["ttft_s"] is not None]
            traces.append(dict(type="scatter", mode="markers", name=f"replica {index} ({replica})", legendgroup=replica,
                               x=[r["sent_s"] for r in mine], y=[r["ttft_s"] * 1e3 for r in mine],
                               marker=dict(color=style.replica_color(index), size=7),
                               xaxis=axis[0], yaxis=axis[1]))
        failed = [r for r in requests if r["error"] is not None]
        if failed:
            traces.append(dict(type="scatter", mode="markers", name="failed", x=[r["sent_s"] for r in failed],
                               y=[0] * len(failed), marker=dict(symbol="x", color=style.NEUTRAL["text"], size=9),
                               text=[r["error"] for r in failed], xaxis=axis[0], yaxis=axis[1]))
        return traces

    def _sample_traces(self, axis: tuple[str, str], field: str, shape_hv: bool) -> list[dict]:
        traces = []
        for index, replica in enumerate(self.replicas):
            rows = [s for s in self.run["samples"] if s["replica"] == replica]
            traces.append(dict(type="scatter", mode="lines", name=f"replica {index}", legendgroup=replica,
                               showlegend=False, x=[s["t_s"] for s in rows], y=[s[field] for s in rows],
                               line=dict(color=style.replica_color(index), width=1.5,
                                         shape="hv" if shape_hv else "linear"),
                               xaxis=axis[0], yaxis=axis[1]))
        return traces

    def _hit_rate_trace(self, axis: tuple[str, str]) -> dict:
        runs = self.record["runs"][self.workload]
        return dict(type="bar", name="hit rate", showlegend=False, x=list(runs),
                    y=[run["summary"]["prefix_hit_rate"] for run in runs.values()],
                    text=[f"{run['summary']['prefix_hit_rate']:.0%}" for run in runs.values()], textposition="outside",
                    marker=dict(color=[style.CHANGED_COLOR if p == self.policy else style.BASELINE_COLOR
                                       for p in runs],
                                line=dict(color=style.NEUTRAL["text"], width=[2 if p == self.policy else 0
                                                                              for p in runs])),
                    xaxis=axis[0], yaxis=axis[1])
