import pytest
import torch

from spyre_lab.device.config import SPYRE, SpyreConfig, get_config


def test_preset_matches_documented_numbers():
    assert SPYRE.cores == 32 and SPYRE.corelets_per_core == 2
    assert SPYRE.lx_budget_bytes == 1_677_721  # 80% of 2 MiB, the planner budget
    assert SPYRE.elems_per_stick(torch.float16) == 64
    assert SPYRE.elems_per_stick(torch.float32) == 32
    assert SPYRE.elems_per_stick(torch.int8) == 128
    # the cost model's "DL16 peak": 98.304 TFLOP/s, 1.536 TMAC/s per core
    assert SPYRE.peak_flops == pytest.approx(98.304e12)
    assert SPYRE.macs_per_cycle_per_core * SPYRE.clock_hz == pytest.approx(1.536e12)


def test_replace_derives_consistently():
    small = SPYRE.replace(cores=8)
    assert small.cores == 8 and SPYRE.cores == 32
    assert small.peak_flops == pytest.approx(SPYRE.peak_flops / 4)


@pytest.mark.parametrize(
    "field, value, needle",
    [("cores", 0, "cores"), ("lx_bytes", 64, "lx_bytes"), ("dram_bandwidth", -1.0, "dram_bandwidth"),
     ("stick_bytes", 96, "power of two"), ("lx_planner_fraction", 1.5, "lx_planner_fraction")],
)
def test_nonsense_values_name_the_field(field, value, needle):
    with pytest.raises(ValueError, match=needle):
        SpyreConfig(**{field: value})


def test_unknown_field_and_preset_are_clear():
    with pytest.raises(ValueError, match="no field"):
        SPYRE.replace(cors=8)
    with pytest.raises(ValueError, match="presets"):
        get_config("gpu")
