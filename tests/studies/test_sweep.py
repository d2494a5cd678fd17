"""Design-space sweeps on Dask: a 2-worker local cluster gives exactly the in-process results, and the cache
serves every configuration it has seen from this source."""

from __future__ import annotations

import pandas as pd
import pytest

from spyre_lab.device.config import SPYRE
from spyre_lab.studies import sweep
from spyre_lab.studies.sweep_runner import IN_PROCESS, config_of, study_key
from spyre_lab.studies.sweeps import kernel_ratios

CONFIGS = [("default", {}), {"clock_hz": 1.25e9}, {"dram_bandwidth": 153.6e9}, {"kernel_launch_cycles": 3000},
           {"dram_broadcast_cores": 4, "clock_hz": 1.75e9}]


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None, env={"OMP_NUM_THREADS": "1"}, death_timeout=60)
    client = Client(cluster, timeout=60)
    try:
        yield client
    finally:
        client.close(timeout=30)
        cluster.close(timeout=30)


@pytest.fixture(scope="module")
def in_process():
    return sweep(CONFIGS, kernel_ratios, scheduler=IN_PROCESS, progress=False, cache=False)


def test_a_two_worker_cluster_gives_the_in_process_results(client, in_process, tmp_path):
    assert len(client.scheduler_info()["workers"]) == 2
    on_cluster = sweep(CONFIGS, kernel_ratios, scheduler=client, progress=False, cache=tmp_path)
    pd.testing.assert_frame_equal(on_cluster, in_process, check_exact=True)
    assert list(on_cluster.columns) == ["label", "clock_hz", "dram_bandwidth", "kernel_launch_cycles",
                                        "dram_broadcast_cores", "matmul", "softmax", "mlp"]
    assert on_cluster["label"].tolist()[:2] == ["default", "clock_hz=1.25e+09"]
    assert on_cluster.loc[0, "clock_hz"] == SPYRE.clock_hz            # unchanged parameters show their default
    assert on_cluster.attrs["computed"] == len(CONFIGS) and on_cluster.attrs["cached"] == 0
    # the effects point the documented way: faster DRAM helps the planned matmul less than the naive one
    assert (in_process[["matmul", "softmax"]] > 1).all().all()


def test_the_cache_serves_configurations_seen_from_this_source(client, in_process, tmp_path):
    first = sweep(CONFIGS[:3], kernel_ratios, scheduler=client, progress=False, cache=tmp_path)
    assert first.attrs["computed"] == 3
    # through the scheduler's address, as `--scheduler tcp://HOST:PORT` connects: only the two new ones run
    grown = sweep(CONFIGS, kernel_ratios, scheduler=client.scheduler.address, progress=False, cache=tmp_path)
    assert grown.attrs["cached"] == 3 and grown.attrs["computed"] == 2
    pd.testing.assert_frame_equal(grown, in_process, check_exact=True)
    again = sweep(CONFIGS, kernel_ratios, scheduler=IN_PROCESS, progress=False, cache=tmp_path)
    assert again.attrs["cached"] == len(CONFIGS)
    pd.testing.assert_frame_equal(again, in_process, check_exact=True)


def test_bad_input_names_the_problem_and_the_fix():
    with pytest.raises(ValueError, match=r"unknown SpyreConfig field\(s\) \['clock'\]"):
        sweep([{"clock": 1e9}], kernel_ratios, scheduler=IN_PROCESS, cache=False)
    with pytest.raises(ValueError, match="tcp://HOST:8786"):
        sweep([{}], kernel_ratios, scheduler="localhost:8786", progress=False, cache=False)
    with pytest.raises(TypeError, match="cache_key"):
        study_key(lambda cfg: {"x": 1.0})
    with pytest.raises(TypeError, match=r"\(label, dict\)"):
        sweep([1.0], kernel_ratios, scheduler=IN_PROCESS, cache=False)


def test_config_of_keeps_each_field_type():
    cfg = config_of({"dram_broadcast_cores": 4.0, "clock_hz": 2e9})
    assert isinstance(cfg.dram_broadcast_cores, int) and cfg.dram_broadcast_cores == 4 and cfg.clock_hz == 2e9


def machine_numbers(cfg):
    """A study that reads the machine: its name and DRAM rates at a balanced mix."""
    return {"machine": cfg.name, "balanced_gbs": cfg.dram_bandwidth_at(1, 1) / 1e9}


def test_the_same_changes_to_another_machine_are_another_result(tmp_path):
    """A configuration is a set of changes to a base machine: the cache must not hand one machine's results to
    the other, and the base travels with each task (a worker's own default may differ)."""
    from spyre_lab.device.config import SpyreConfig

    changes = [{"clock_hz": 1.25e9}]

    def run(name):
        return sweep(changes, machine_numbers, scheduler=IN_PROCESS, progress=False, cache=tmp_path,
                     base=SpyreConfig.preset(name))

    datasheet, measured, datasheet_again = run("datasheet"), run("measured"), run("datasheet")
    assert measured.attrs["cached"] == 0 and measured["machine"].tolist() == ["measured"]
    assert measured["balanced_gbs"][0] < datasheet["balanced_gbs"][0]
    assert datasheet_again.attrs["cached"] == 1
    pd.testing.assert_frame_equal(datasheet_again, datasheet)
