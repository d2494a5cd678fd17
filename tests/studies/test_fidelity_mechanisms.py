"""The mechanism probe runs each candidate on `measured` and reports what it does; no probe is adopted silently."""

import pytest

from spyre_lab.device.config import MEASURED
from spyre_lab.studies import fidelity_mechanisms as fm


@pytest.fixture(scope="module")
def rows():
    return fm.probes()


def test_the_first_probe_is_measured_itself(rows):
    assert rows[0]["fields"] == {}
    assert rows[0] == {"mechanism": rows[0]["mechanism"], "fields": {}, **fm.probe(MEASURED)}


def test_a_fixed_bundle_cost_slows_the_last_rung_more_the_larger_it_is(rows):
    fixed = sorted((r for r in rows if "kernel_launch_cycles" in r["fields"]),
                   key=lambda r: r["fields"]["kernel_launch_cycles"])
    last = [rows[0]["last_rung_pct"]] + [r["last_rung_pct"] for r in fixed]
    assert last == sorted(last) and last[-1] > last[0] + 10


def test_no_probe_brings_the_first_rung_closer_nor_makes_four_cores_slower(rows):
    base = rows[0]["first_rung_pct"]
    assert all(r["first_rung_pct"] >= base - 0.05 for r in rows)
    assert all(r["four_over_one"] < 1 for r in rows)


def test_the_markdown_states_what_the_probe_found(rows):
    text = "\n".join(fm.to_markdown(rows))
    assert "Every mechanism only adds time" in text and "4 cores stay faster than 1" in text
    assert text.count("\n| ") == len(rows) + 1
