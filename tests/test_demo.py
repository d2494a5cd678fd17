import json

from spyre_lab.demo import run_demo


def test_demo_writes_report_and_perfetto_trace(tmp_path, capsys):
    """Device and compiler sections (the engine section runs in `make demo`, which CI also runs)."""
    assert run_demo(str(tmp_path), engine=False) == 0
    report = (tmp_path / "report.txt").read_text()
    assert "modeled" in report and "bottleneck" in report
    doc = json.loads((tmp_path / "trace.json").read_text())
    lanes = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert {"core0.load", "core31.sfu", "core0.pt"} <= lanes
    assert any(e["ph"] == "X" and e["dur"] > 0 for e in doc["traceEvents"])
    assert "fusion on" in report and "kernels" in report
    assert "CPU fallbacks: none" in report  # one summary at the end instead of a warning per op
