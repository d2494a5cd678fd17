"""CPU-fallback warnings name the user's line, every fallback is counted, and a report can replace the warnings."""

from __future__ import annotations

import warnings

import pytest
import torch

from spyre_lab.demo import fallback_report
from spyre_lab.runtime.fallback import collect_fallbacks, fallback_stats

HERE = __file__


def _fallback_warnings(caught: list[warnings.WarningMessage], op: str) -> list[warnings.WarningMessage]:
    return [w for w in caught if f"{op} has no spyre kernel" in str(w.message)]


def test_a_direct_call_warns_at_the_calling_line(fresh_warnings):
    x = torch.arange(12, dtype=torch.float16).reshape(3, 4).to("spyre")
    with pytest.warns(UserWarning, match="aten::cumsum has no spyre kernel") as caught:
        torch.cumsum(x, dim=1)  # the line the warning must name
    (w,) = _fallback_warnings(caught.list, "aten::cumsum")
    assert (w.filename, w.lineno) == (HERE, test_a_direct_call_warns_at_the_calling_line.__code__.co_firstlineno + 3)


def test_a_factory_under_a_device_context_warns_at_the_user_line_not_torch_utils_device(fresh_warnings):
    with pytest.warns(UserWarning, match="aten::linspace has no spyre kernel") as caught, torch.device("spyre"):
        t = torch.linspace(0, 1, 5)
    (w,) = _fallback_warnings(caught.list, "aten::linspace")
    assert w.filename == HERE, w.filename  # on main: .../torch/utils/_device.py
    assert t.device.type == "spyre"
    torch.testing.assert_close(t.cpu(), torch.linspace(0, 1, 5))


class _Cumulative(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=0) * 2


def test_a_fallback_inside_a_module_names_the_module_line_of_user_code(fresh_warnings):
    module = _Cumulative()
    x = torch.ones(4, 4, dtype=torch.float16).to("spyre")
    with pytest.warns(UserWarning, match="aten::cumsum") as caught:
        module(x)
    (w,) = _fallback_warnings(caught.list, "aten::cumsum")
    assert w.filename == HERE and w.lineno == _Cumulative.forward.__code__.co_firstlineno + 1


def test_a_fallback_inside_spyre_lab_names_the_user_line_and_the_library_call_site(fresh_warnings):
    """The engine's top-p filter sorts and takes a cumsum, which have no spyre kernel: the warning is filed
    under the user's line and its text names the spyre_lab line that called the op."""
    from spyre_lab.engine.sampler import filter_top_k_top_p

    logits = torch.randn(32, dtype=torch.float16).to("spyre")
    with pytest.warns(UserWarning, match="has no spyre kernel") as caught:
        filter_top_k_top_p(logits, 0, 0.9)
    fallbacks = [w for w in caught if "has no spyre kernel" in str(w.message)]
    assert {str(w.message).split()[0] for w in fallbacks} == {"aten::sort", "aten::cumsum", "aten::scatter"}
    for w in fallbacks:
        assert w.filename == HERE
        assert "(called from spyre_lab/engine/sampler.py:" in str(w.message)


def test_fallbacks_are_counted_with_their_first_call_site(fresh_warnings):
    x = torch.arange(8, dtype=torch.float16).to("spyre")
    with collect_fallbacks() as log, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.cumsum(x, dim=0)
        torch.flip(x, dims=[0])
    assert not _fallback_warnings(caught, "aten::cumsum"), "a collector holds the per-op warnings back"
    assert log.stats["aten::cumsum"].calls == 3 and log.stats["aten::flip"].calls == 1
    first_line = test_fallbacks_are_counted_with_their_first_call_site.__code__.co_firstlineno + 5
    assert log.stats["aten::cumsum"].first_seen.endswith(f"test_fallback_warnings.py:{first_line}")
    assert fallback_stats()["aten::cumsum"].calls >= 3
    summary = log.summary()
    assert "aten::cumsum" in summary and "aten::flip" in summary and "first seen" in summary


def test_the_demo_report_replaces_per_op_warnings_with_one_summary(fresh_warnings):
    x = torch.arange(8, dtype=torch.float16).to("spyre")
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        with fallback_report() as lines:
            torch.cumsum(x, dim=0)
            torch.cumsum(x, dim=0)
            torch.flip(x, dims=[0])
    assert not [w for w in escaped if "no spyre kernel" in str(w.message)]
    text = "\n".join(lines)
    assert text.startswith("CPU fallbacks: 2 ops")
    row = next(line for line in lines[0].splitlines() if "aten::cumsum" in line)
    assert row.split()[1] == "2" and "no spyre kernel" in row and "test_fallback_warnings.py:" in row


def test_host_ops_by_design_are_counted_but_marked_as_such():
    x = torch.tensor([0.0, 2.0, -1.0], dtype=torch.float16).to("spyre")
    with collect_fallbacks() as log:
        torch.nonzero(x)
    assert log.stats["aten::nonzero"].by_design
    assert "output size from data" in log.summary()


def test_the_fp16_storage_warning_names_the_user_line(fresh_warnings):
    with pytest.warns(UserWarning, match="spyre stores torch.float64 tensors as float16") as caught:
        torch.ones(3, dtype=torch.float64).to("spyre")
    (w,) = [w for w in caught if "float64" in str(w.message)]
    assert w.filename == HERE  # not torch/_dynamo/eval_frame.py: the driver's own frames are skipped
