"""torch.cuda habits next to the spyre device: each row of the README's habit table, held here.

The device registers itself inside ``import torch``, so plain CPU code in the same environment runs
with spyre as the current accelerator. The first group of tests runs in a fresh interpreter that
imports only torch (the autoload path a user's CPU script takes); the rest run in this process.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from spyre_lab.runtime.errors import SpyreUsageError

_CPU_SCRIPT = textwrap.dedent("""
    import json, torch                              # nothing else: the entry point registers spyre
    out = {"accelerator": str(torch.accelerator.current_accelerator())}

    def probe(name, fn):
        try:
            out[name] = fn()
        except Exception as exc:                    # record, so every habit is reported
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}

    def pin():
        t = torch.arange(6.0).reshape(2, 3)
        p = t.pin_memory()
        return {"device": str(p.device), "pinned": p.is_pinned(), "source_pinned": t.is_pinned(),
                "equal": torch.equal(p, t), "strides": list(p.stride())}

    def loader():
        data = torch.utils.data.TensorDataset(torch.arange(8.0).reshape(4, 2), torch.arange(4))
        batches = list(torch.utils.data.DataLoader(data, batch_size=2, pin_memory=True))
        return {"pinned": [t.is_pinned() for batch in batches for t in batch],
                "devices": sorted({str(t.device) for batch in batches for t in batch}),
                "first": batches[0][0].tolist()}

    def d2h_non_blocking():
        x = torch.arange(6, dtype=torch.float16).reshape(2, 3).to("spyre")
        y = x.to("cpu", non_blocking=True)
        return {"device": str(y.device), "values": y.tolist(), "pinned": y.is_pinned()}

    def accelerator_memory():
        before = torch.accelerator.memory_allocated()
        x = torch.ones(1024, 64, dtype=torch.float16, device="spyre")
        during = torch.accelerator.memory_allocated()
        stats = torch.accelerator.memory_stats()
        result = {"grew_by": during - before, "spyre_agrees": during == torch.spyre.memory_allocated(),
                  "peak_at_least": torch.accelerator.max_memory_allocated() >= during,
                  "reserved": torch.accelerator.memory_reserved() == during,
                  "stats_current": stats["allocated_bytes.all.current"] - torch.spyre.memory_stats()[
                      "allocated_bytes.all.current"],
                  "info": list(torch.accelerator.get_memory_info()) == list(torch.spyre.mem_get_info())}
        del x
        torch.accelerator.reset_peak_memory_stats()
        result["peak_after_reset"] = torch.accelerator.max_memory_allocated() == torch.accelerator.memory_allocated()
        return result

    def accelerator_empty_cache():
        x = torch.ones(4, dtype=torch.float16, device="spyre")
        torch.accelerator.empty_cache()
        return {"kept": x.cpu().tolist()}

    def accelerator_synchronize():
        x = torch.ones(512, 512, dtype=torch.float16, device="spyre")
        torch.exp(x)
        busy = not torch.spyre.current_stream().query()
        torch.accelerator.synchronize()
        return {"busy_before": busy, "idle_after": torch.spyre.current_stream().query()}

    probe("pin_memory", pin)
    probe("dataloader", loader)
    probe("d2h_non_blocking", d2h_non_blocking)
    probe("accelerator_memory", accelerator_memory)
    probe("accelerator_empty_cache", accelerator_empty_cache)
    probe("accelerator_synchronize", accelerator_synchronize)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def cpu_script() -> dict:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, "-c", _CPU_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["accelerator"] == "spyre"            # the situation under test: spyre is the accelerator
    return out


def _ok(result: object) -> dict:
    assert isinstance(result, dict) and "error" not in result, result
    return result


# --- fresh process, `import torch` only -----------------------------------------------------------
def test_pin_memory_on_a_cpu_tensor_gives_a_pinned_cpu_tensor(cpu_script):
    got = _ok(cpu_script["pin_memory"])
    assert got == {"device": "cpu", "pinned": True, "source_pinned": False, "equal": True, "strides": [3, 1]}


def test_dataloader_with_pin_memory_yields_pinned_cpu_batches(cpu_script):
    got = _ok(cpu_script["dataloader"])
    assert got["devices"] == ["cpu"] and all(got["pinned"]) and len(got["pinned"]) == 4
    assert got["first"] == [[0.0, 1.0], [2.0, 3.0]]


def test_non_blocking_copy_to_the_cpu_works_and_lands_in_pinned_memory(cpu_script):
    got = _ok(cpu_script["d2h_non_blocking"])
    assert got == {"device": "cpu", "values": [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], "pinned": True}


def test_torch_accelerator_memory_functions_answer_from_torch_spyre(cpu_script):
    got = _ok(cpu_script["accelerator_memory"])
    assert got["grew_by"] == 1024 * 64 * 2              # fp16, already a whole number of 128-byte sticks
    assert got["spyre_agrees"] and got["peak_at_least"] and got["reserved"] and got["info"]
    assert got["stats_current"] == 0 and got["peak_after_reset"]


def test_torch_accelerator_empty_cache_keeps_live_tensors(cpu_script):
    assert _ok(cpu_script["accelerator_empty_cache"]) == {"kept": [1.0, 1.0, 1.0, 1.0]}


def test_torch_accelerator_synchronize_waits_for_the_card(cpu_script):
    assert _ok(cpu_script["accelerator_synchronize"]) == {"busy_before": True, "idle_after": True}


# --- in process ------------------------------------------------------------------------------------
def test_torch_load_to_spyre_explains_the_two_step_alternative():
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2, 2, dtype=torch.float16)}, buffer)
    for location in ("spyre", torch.device("spyre", 0), {"cpu": "spyre:0"}):
        buffer.seek(0)
        with pytest.raises(SpyreUsageError, match=r"map_location='cpu'.*\.to\('spyre'\)"):
            torch.load(buffer, map_location=location)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, map_location="cpu")["w"], torch.ones(2, 2, dtype=torch.float16))


def test_a_spyre_generator_is_the_host_generator_spyre_random_ops_draw_from(fresh_warnings):
    g = torch.Generator("spyre")
    assert isinstance(g, torch.Generator) and g.device.type == "cpu"
    assert isinstance(torch.Generator(), torch.Generator) and isinstance(torch.default_generator, torch.Generator)
    with pytest.warns(UserWarning, match="normal_"):       # random ops are CPU fallbacks on spyre
        on_card = torch.randn(8, generator=g.manual_seed(7), device="spyre", dtype=torch.float16).cpu()
    on_host = torch.randn(8, generator=torch.Generator().manual_seed(7), dtype=torch.float16)
    assert torch.equal(on_card, on_host)


def test_device_properties_have_total_memory_and_mem_get_info_matches():
    props = torch.spyre.get_device_properties(0)
    free, total = torch.spyre.mem_get_info(0)
    # minus the program segment and the intermediates segment
    assert props.total_memory == total == props.config.dram_usable_bytes - (1 << 30) - (16 << 30)
    assert props.multi_processor_count == props.config.cores == 32
    x = torch.empty(1 << 20, dtype=torch.float16, device="spyre")
    assert torch.spyre.mem_get_info(0)[0] == free - x.numel() * 2


def test_memory_summary_reports_the_live_tensors():
    x = torch.empty(1 << 20, dtype=torch.float16, device="spyre")
    summary = torch.spyre.memory_summary()
    assert summary.startswith("spyre:0 memory summary")
    line = next(row for row in summary.splitlines() if "tensors allocated (now)" in row)
    assert x.numel() * 2 == 2 * 2**20 and torch.spyre.memory_allocated() >= 2 * 2**20
    assert f"{torch.spyre.memory_allocated() / 2**20:.2f} MiB" in line


def test_event_without_timing_refuses_elapsed_time_as_cuda_does():
    untimed, timed = torch.spyre.Event(), torch.spyre.Event(enable_timing=True)
    untimed.record()
    timed.record()
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        untimed.elapsed_time(timed)
    other = torch.spyre.Event(enable_timing=True)
    other.record()
    assert timed.elapsed_time(other) >= 0.0


def test_record_stream_accepts_a_spyre_stream():
    side = torch.spyre.Stream()
    x = torch.ones(4, dtype=torch.float16, device="spyre")
    x.record_stream(side)                                 # no caching allocator: nothing to defer
    assert isinstance(side, torch.Stream) and torch.spyre.Stream(stream_id=side.stream_id) is side
    assert x.cpu().tolist() == [1.0] * 4


def test_torch_spyre_empty_cache_keeps_tensors_and_reset_device_wipes_them():
    keep = torch.ones(4, dtype=torch.float16, device="spyre")
    torch.spyre.empty_cache()
    assert keep.cpu().tolist() == [1.0] * 4
    torch.spyre.reset_device()
    with pytest.raises(SpyreUsageError, match="reset_device"):
        keep.cpu()


def test_device_context_manager_switches_the_current_card():
    if torch.spyre.device_count() < 2:
        pytest.skip("needs SPYRE_LAB_DEVICES >= 2")
    with torch.spyre.device(1):
        assert torch.empty(2, device="spyre").device.index == 1
    assert torch.spyre.current_device() == 0


def test_autocast_runs_matmuls_in_fp16_and_leaves_other_ops_alone(fresh_warnings):
    a = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    b = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    with pytest.warns(UserWarning, match="stores torch.float32"):
        a_dev, b_dev = a.to("spyre"), b.to("spyre")
    linear = torch.nn.Linear(32, 8).to("spyre")
    with torch.autocast("spyre"):
        product, projected, total = a_dev @ b_dev, linear(a_dev), a_dev + 1
    assert product.dtype == projected.dtype == torch.float16
    assert total.dtype == torch.float32                     # not on the lower-precision list
    expected = (a.half().float() @ b.half().float())
    torch.testing.assert_close(product.cpu().float(), expected, atol=2e-2, rtol=2e-2)
    assert (a_dev @ b_dev).dtype == torch.float32          # outside the block: as written


def test_amp_supported_dtypes_tell_the_truth_and_bf16_autocast_is_refused_by_name():
    assert torch.spyre.get_amp_supported_dtype() == [torch.float16]
    x = torch.ones(4, 4, dtype=torch.float16, device="spyre")
    with (pytest.warns(UserWarning, match=r"only supports dtypes of torch\.float16"),
          torch.autocast("spyre", dtype=torch.bfloat16)):
        y = x.float() @ x.float()
    assert y.dtype == torch.float32                         # autocast was switched off, not faked


def test_compiled_autocast_casts_the_same_ops_as_eager():

    def f(a, b, w):
        with torch.autocast("spyre"):
            return a @ b, a + b, torch.nn.functional.linear(a, w)

    gen = torch.Generator().manual_seed(3)
    args = [torch.randn(*shape, generator=gen).half().to("spyre") for shape in ((16, 16), (16, 16), (4, 16))]
    args = [args[0].float(), args[1], args[2].float()]        # fp32 and fp16 operands on the card
    eager = f(*args)
    compiled = torch.compile(f, backend="spyre")(*args)
    assert [t.dtype for t in compiled] == [t.dtype for t in eager] == [torch.float16, torch.float32, torch.float16]
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got.cpu(), want.cpu(), atol=2e-2, rtol=2e-2)


def test_moving_a_raw_storage_to_spyre_is_refused_instead_of_crashing():
    script = textwrap.dedent("""
        import torch
        storage = torch.arange(4.0).untyped_storage()
        for move in (lambda: storage.to(device="spyre"), lambda: storage.spyre(), lambda: storage.to(device="cpu")):
            try:
                print(type(move()).__name__)
            except RuntimeError as exc:
                print(type(exc).__name__, "t.to('spyre')" in str(exc))
    """)
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, f"the interpreter died (rc {done.returncode}): {done.stderr[-500:]}"
    assert done.stdout.split("\n")[:3] == ["SpyreUsageError True", "SpyreUsageError True", "UntypedStorage"]
