"""The run report: one HTML file, plotly.js inlined once, a figure per view of the run, offline."""

import json
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from plotly.offline import get_plotlyjs

from spyre_lab.cli import main
from spyre_lab.device.config import SPYRE
from spyre_lab.device.kernels import softmax_kernel
from spyre_lab.device.sim import simulate
from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.studies.fidelity import fidelity
from spyre_lab.viz.report import FIDELITY_FILE, REPORT_FILE, STATS_FILE, Section, write_html

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """What `make demo` leaves behind: an engine run's stats and a device trace."""
    out = tmp_path_factory.mktemp("run")
    llm = LLM("tiny-granite", platform="cpu", max_model_len=64, max_num_seqs=2, num_kv_blocks=8, block_size=8)
    llm.generate(["count from 5 to 12:", "3 + 4 ="], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    llm.stats.save_json(out / STATS_FILE)
    simulate(softmax_kernel(256, 256, cores=4, cfg=SPYRE, fused=True), SPYRE, mode="event").trace.to_chrome_trace(
        out / "trace.json")
    (out / FIDELITY_FILE).write_text(json.dumps(fidelity()))
    return out


def test_cli_report_writes_one_offline_file(run_dir, capsys):
    assert main(["report", "--out", str(run_dir), "--no-run"]) == 0
    page = (run_dir / REPORT_FILE).read_text()
    assert "wrote" in capsys.readouterr().out
    # plotly.js is inlined once and nothing is fetched from the network
    assert page.count(get_plotlyjs()[:300]) == 1
    assert not re.search(r"<script[^>]+src=", page)
    titles = re.findall(r"<h2 id='s\d+'>([^<]+)</h2>", page)
    assert [t.split(":")[0] for t in titles] == ["Layout", "Dataflow", "Fusion", "Work division", "Roofline", "What if",
                                                 "Fidelity", "Decode timeline", "KV cache"]
    assert page.count("Plotly.newPlot") == len(titles)
    assert "could not draw" not in page
    assert "modeled" in page


def test_a_section_that_fails_says_why(tmp_path):
    path = write_html([Section("broken", "", None, "could not draw this section: ValueError: no steps")],
                      tmp_path / "r.html")
    assert "ValueError: no steps" in path.read_text()


def test_report_without_a_run_points_at_make_demo(tmp_path):
    assert main(["report", "--out", str(tmp_path), "--no-run"]) == 0
    page = (tmp_path / REPORT_FILE).read_text()
    assert "no engine_stats.json" in page and "make demo" in page
    assert f"no {FIDELITY_FILE}" in page and "spyre-lab fidelity --json" in page
