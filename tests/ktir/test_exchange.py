"""Inter-tile communication: the ring reduction's numbers, its modeled ring traffic, an all-reduce variant,
and a group whose partials never all arrive (refused by name, never a hang)."""

from __future__ import annotations

import pytest
import torch

from spyre_lab.device.config import SPYRE
from spyre_lab.ktir import KTIRUnsupported
from spyre_lab.ktir.examples import path
from spyre_lab.ktir.module import load

X = torch.randn(32, 128, generator=torch.Generator().manual_seed(1)).half()
TEXT = path("ring_reduce").read_text()


def test_ring_reduce_chains_the_partials() -> None:
    fn = load(TEXT).main
    result = fn.run(X, torch.zeros(128, dtype=torch.half))
    torch.testing.assert_close(result.outputs["out_ptr"].float(), X.float().sum(0), atol=0.05, rtol=1e-3)
    sim = fn.simulate(SPYRE)
    assert sim.ring_bytes == 31 * 128 * 4, "31 fp32 partial rows travel down the chain to core 0"
    assert fn.simulate(SPYRE, mode="event").ring_bytes == sim.ring_bytes


def test_every_consumer_gets_the_total() -> None:
    """Consumers = all producers (an all-reduce): core 0 sends the total on to each of the others."""
    text = TEXT.replace("consumer_tiles_per_group = #core0", "consumer_tiles_per_group = #everyone")
    text = text.replace("%is_core0 = arith.cmpi eq, %p, %c0 : index", "%is_core0 = arith.cmpi eq, %p, %c31 : index")
    text = text.replace("%c0 = arith.constant 0 : index",
                        "%c0 = arith.constant 0 : index\n    %c31 = arith.constant 31 : index")
    fn = load(text).main
    result = fn.run(X, torch.zeros(128, dtype=torch.half))
    torch.testing.assert_close(result.outputs["out_ptr"].float(), X.float().sum(0), atol=0.05, rtol=1e-3)
    assert fn.simulate(SPYRE).ring_bytes == 2 * 31 * 128 * 4


def test_a_partial_that_never_comes_is_refused() -> None:
    """Cores 16..31 skip the exchange, but the group names all 32: core 0 would wait forever."""
    head, rest = TEXT.split("    %partials = ktdp.inter_tile_produce", 1)
    exchange, tail = rest.split("    return", 1)
    text = (head + "    %half = arith.constant 16 : index\n    %low = arith.cmpi slt, %p, %half : index\n"
            "    scf.if %low {\n    %partials = ktdp.inter_tile_produce" + exchange + "    }\n    return" + tail)
    with pytest.raises(KTIRUnsupported, match="waits for partials no core will produce"):
        load(text).main.run(X, torch.zeros(128, dtype=torch.half))
