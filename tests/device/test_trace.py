import json

from spyre_lab.device.trace import Trace


def _sample() -> Trace:
    t = Trace(meta={"kernel": "demo"})
    t.add("core1.pt", "matmul", 2.0, 3.0, m=8)
    t.add("core0.load", "load A", 0.0, 2.0, bytes=128)
    t.add("host", "launch", 0.0, 0.5)
    t.add("core0.load", "load B", 1.0, 2.0)
    return t


def test_lanes_ordered_host_then_cores_by_unit():
    assert _sample().lanes() == ["host", "core0.load", "core1.pt"]


def test_busy_counts_overlap_once():
    assert _sample().busy_us("core0.load") == 3.0
    assert _sample().duration_us == 5.0


def test_chrome_trace_round_trip_and_determinism(tmp_path):
    path = tmp_path / "t.json"
    doc = _sample().to_chrome_trace(path)
    assert json.loads(path.read_text()) == doc
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {"ph", "ts", "dur", "pid", "tid", "name", "args"} <= set(xs[0])
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"host", "core0.load", "core1.pt"}
    back = Trace.from_chrome_trace(path)
    assert sorted((e.lane, e.name, e.start_us, e.dur_us) for e in back) == sorted(
        (e.lane, e.name, e.start_us, e.dur_us) for e in _sample())
    assert _sample().to_chrome_trace() == doc  # same inputs, identical trace


def test_kept_filters_lanes_in_order_and_leaves_the_trace_alone():
    t = Trace(meta={"run": 1})
    t.add("host", "a", 0.0, 1.0)
    t.add("core0.pt", "k", 1.0, 2.0)
    t.add("PCIe", "b", 3.0, 1.0)
    kept = t.kept(lambda lane: not lane.startswith("core"))
    assert [e.name for e in kept.events] == ["a", "b"] and kept.meta == {"run": 1}
    assert len(t.events) == 3
