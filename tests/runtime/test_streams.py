"""Streams and events on the modeled clock: async enqueue, FIFO order, cross-stream waits."""

from __future__ import annotations

import pytest
import torch

from spyre_lab.runtime import last_trace, recording
from spyre_lab.runtime.timeline import TIMELINE


def half(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.float16)


def test_stream_ids_follow_the_default_low_and_high_pools():
    assert torch.spyre.default_stream().stream_id == 0
    low = torch.spyre.Stream()
    high = torch.spyre.Stream(priority=-1)
    assert 1 <= low.stream_id <= 32 and low.priority == 0
    assert 33 <= high.stream_id <= 64 and high.priority == -1
    with pytest.raises(ValueError, match="binary"):
        torch.spyre.Stream(priority=3)


def test_enqueue_costs_host_time_and_returns_before_the_device_finishes():
    cfg = torch.spyre.get_device(0).config
    x = half(1024, 1024).to("spyre")
    torch.spyre.synchronize()
    host_before = torch.spyre.modeled_time_us()
    y = torch.exp(x)                                   # device op: 3 steps, each costs one host enqueue
    host_after = torch.spyre.modeled_time_us()
    assert host_after - host_before == pytest.approx(3 * cfg.host_launch_us)
    stream = torch.spyre.current_stream()
    assert not stream.query()                          # the kernel is still running (modeled)
    torch.spyre.synchronize()
    assert stream.query()
    assert torch.spyre.modeled_time_us() == pytest.approx(stream.ready_us)
    assert y.shape == x.shape


def test_events_time_device_work_in_modeled_milliseconds():
    x = half(512, 512).to("spyre")
    start, end = torch.spyre.Event(enable_timing=True), torch.spyre.Event(enable_timing=True)
    start.record()
    torch.exp(x)
    end.record()
    end.synchronize()
    compute = [e for e in last_trace().on("stream0") if e.args.get("kind") == "Compute"]
    elapsed_ms = start.elapsed_time(end)
    assert elapsed_ms > 0
    assert elapsed_ms * 1000 >= compute[0].dur_us
    with pytest.raises(RuntimeError, match="record"):
        torch.spyre.Event().elapsed_time(end)


def test_work_on_a_side_stream_lands_on_its_own_lane():
    side = torch.spyre.Stream()
    x = half(256, 256).to("spyre")
    with recording() as trace, torch.spyre.stream(side):
        assert torch.spyre.current_stream() == side
        torch.relu(x)
    assert torch.spyre.current_stream() == torch.spyre.default_stream()
    assert [e.args["kind"] for e in trace.on(side.lane)] == ["Compute"]
    assert not trace.on("stream0")


def test_cross_stream_wait_is_respected_and_visible():
    producer, consumer = torch.spyre.Stream(), torch.spyre.Stream()
    x = half(1024, 1024).to("spyre")
    with recording() as trace:
        with torch.spyre.stream(producer):
            y = torch.exp(x)
            done = producer.record_event()
        consumer.wait_event(done)
        with torch.spyre.stream(consumer):
            torch.relu(y)
    exp_end = trace.on(producer.lane)[0].end_us
    relu = next(e for e in trace.on(consumer.lane) if e.args.get("kind") == "Compute")
    assert relu.start_us >= exp_end
    waits = [e for e in trace.on(consumer.lane) if e.name == "wait event"]
    assert waits and waits[0].args["waits_for_stream"] == producer.stream_id


def test_independent_streams_overlap_copy_and_compute():
    copier, computer = torch.spyre.Stream(), torch.spyre.Stream()
    x = half(1024, 1024).to("spyre")
    big = half(2048, 1024)
    torch.spyre.synchronize()
    with recording() as trace:
        with torch.spyre.stream(computer):
            torch.exp(x)
        with torch.spyre.stream(copier):
            big.to("spyre", non_blocking=True)
    compute = trace.on(computer.lane)[0]
    copy = next(e for e in trace.on("pcie") if e.args.get("kind") == "H2D" and e.args["bytes"] > 1000)
    assert copy.start_us < compute.end_us and compute.start_us < copy.end_us


def test_fifo_order_within_one_stream():
    x = half(256, 256).to("spyre")
    with recording() as trace:
        a = torch.exp(x)
        torch.relu(a)
        a.cpu()
    compute = trace.on("stream0")
    d2h = next(e for e in trace.on("pcie") if e.args.get("kind") == "D2H")
    assert compute[0].end_us <= compute[1].start_us <= compute[1].end_us <= d2h.start_us


def test_synchronize_waits_for_every_stream():
    s = torch.spyre.Stream()
    x = half(1024, 1024).to("spyre")
    with torch.spyre.stream(s):
        torch.exp(x)
    torch.spyre.synchronize()
    assert TIMELINE.host_us >= s.ready_us
    assert s.query()


def test_an_interprocess_event_is_refused_with_the_way_to_share_across_processes():
    with pytest.raises(RuntimeError, match=r"interprocess Event is not supported.*torch\.distributed"):
        torch.spyre.Event(interprocess=True)
    assert torch.spyre.Event(blocking=True).blocking      # a wait that blocks is how every modeled wait behaves
