"""docs/reproduce.md is what `spyre-lab reproduce --markdown` prints today; the JSON keeps its schema."""

import itertools
import json
from pathlib import Path

import pytest

from spyre_lab.device.config import SPYRE
from spyre_lab.studies.reproduce import SCHEMA, cached_reproduce, to_markdown
from spyre_lab.studies.sweeps import SweepResult, configurations

DOC = Path(__file__).resolve().parents[2] / "docs" / "reproduce.md"


@pytest.fixture(scope="module")
def result():
    # the whole study (8B engine, every claim, the sweep); cached under the package's source fingerprint,
    # so it is computed again whenever any source file changes and read back otherwise
    return cached_reproduce(sweep=True)


def test_docs_reproduce_md_is_current(result):
    fresh = to_markdown(result)
    assert DOC.read_text() == fresh, ("docs/reproduce.md is stale: regenerate it with "
                                      "`spyre-lab reproduce --markdown > docs/reproduce.md`")


def test_json_schema_is_stable(result):
    assert result["schema"] == SCHEMA and result["modeled"] is True
    assert set(result) == {"schema", "modeled", "device", "model", "engine", "claims", "sweep", "wall_s"}
    assert [c["key"] for c in result["claims"]] == ["matmul", "softmax", "mlp", "prefill", "decode"]
    for c in result["claims"]:
        assert {"published", "before_us", "after_us", "ratio", "dominant_before", "dominant_after", "mechanism",
                "changed", "rows", "note"} <= set(c)
    kinds = [(r["kind"], r["size"]) for r in result["engine"]["steps"]]
    assert kinds == [("prefill", 1024), *(("decode", b) for b in (1, 2, 4, 8, 16, 32))]
    json.dumps(result)


def test_engine_directions(result):
    claims = {c["key"]: c for c in result["claims"]}
    for key in ("prefill", "decode"):
        assert claims[key]["ratio"] > 1                               # all mechanisms on beats all off
    # all off, decode waits on the host; prefill, with its longer kernels, is host-bound on datasheet and
    # device-bound on measured (the card's time grows at the fitted DRAM rates, the host estimates stay). Either
    # way the host is a smaller share of the all-off prefill step than of decode's, which is why the published
    # gain is smaller for prefill (1.7x) than for decode (2.4x).
    assert claims["decode"]["dominant_before"].startswith("host-bound")
    assert claims["prefill"]["dominant_before"].startswith("host-bound" if SPYRE.name == "datasheet" else "device")
    host_share = {}
    for key in ("prefill", "decode"):
        off = claims[key]["rows"][0]
        host_share[key] = off["host_us"] / off["step_us"]
    assert host_share["prefill"] < host_share["decode"]
    steps = [r for r in result["engine"]["steps"] if r["kind"] == "decode"]
    # batching amortises the weight reads
    assert all(a["tokens_per_s"] < b["tokens_per_s"] for a, b in itertools.pairwise(steps))


def test_sweep_has_a_verdict_per_claim(result):
    sweep = result["sweep"]
    assert sweep["configurations"] == len(configurations()) >= 100
    assert set(sweep["verdicts"]) == {"matmul", "softmax", "mlp", "prefill", "decode"}
    for v in sweep["verdicts"].values():
        assert v["verdict"].startswith(("robust", "depends on"))
    again = SweepResult(sweep["points"]).verdicts()
    assert again == sweep["verdicts"]


def test_text_and_json_read_the_cached_result_of_this_source(result, capsys):
    # the default output (no sweep) is served by the sweep run's cached result, its sweep left out
    plain = cached_reproduce(sweep=False, progress=True)
    assert "computed from this very source" in capsys.readouterr().out
    assert plain["sweep"] is None and "sweep" not in plain["wall_s"]
    assert plain["claims"] == result["claims"] and plain["engine"] == result["engine"]


def test_tensor_parallel_section_is_the_tp_study_on_the_same_steps(result):
    from spyre_lab.studies.tensor_parallel import METHOD

    tp = result["engine"]["tensor_parallel"]
    assert tp["method"] == METHOD and "one rank's programs" in tp["method"] and "(estimate)" in tp["link"]
    assert [(r["tp"], r["kind"], r["size"]) for r in tp["rows"]] == [
        (k, kind, size) for k in (1, 2, 4, 8) for kind, size in (("prefill", 1024), ("decode", 1))]
    steps = {(r["kind"], r["size"]): r["step_us"] for r in result["engine"]["steps"]}
    for r in tp["rows"]:
        assert r["step_us"] == pytest.approx(r["compute_us"] + r["collective_us"])
        if r["tp"] == 1:   # one card: no collective, and the rank's step is the engine table's step
            assert r["collective_us"] == 0 and r["compute_us"] == pytest.approx(steps[r["kind"], r["size"]], rel=1e-3)
        else:
            assert r["collectives"] == 2 * result["model"]["num_hidden_layers"] + 2 and r["collective_share"] > 0
    decode = [r["step_us"] for r in tp["rows"] if r["kind"] == "decode"]
    assert decode[1] < decode[0]   # TP 2 pays for decode at batch 1
    assert tp["decode_batch_1"].startswith("decode batch 1: fastest at TP")
    assert "### Tensor parallel" in to_markdown(result) and "stops paying" in to_markdown(result)
