"""An op whose data fits the modeled card but not this host's RAM fails with an out-of-memory error naming the card.

Run in a subprocess with a modeled card of 1 PiB (``configure`` must come before the first spyre tensor): a
128 TiB tensor fits the card and no host can allocate it, so the host allocator fails at once, touching nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import warnings
    import torch
    import spyre_lab.runtime
    from spyre_lab.device.config import SPYRE
    from spyre_lab.runtime import devices
    warnings.simplefilter("ignore")
    devices.configure(SPYRE.replace(dram_bytes=2**50, dram_usable_bytes=2**50))
    x = torch.empty(2**46, dtype=torch.float16, device="spyre")   # the card's bookkeeping only: no host data yet
    for name, op in (("add", lambda: x + 1), ("fill_", lambda: x.fill_(1)), ("cumsum", lambda: x.cumsum(0))):
        try:
            op()
            print("RESULT", name, "no error")
        except torch.OutOfMemoryError as exc:
            print("RESULT", name, type(exc).__name__, "|", str(exc))
        except Exception as exc:
            print("RESULT", name, "other", type(exc).__name__, "|", str(exc)[:300])
""")


def test_running_out_of_host_memory_names_the_card_the_sizes_and_the_fix():
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1", "SPYRE_LAB_DEVICES": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-800:]
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert len(results) == 3, done.stdout
    for line in results:                     # a device op, an in-place op and a CPU fallback alike
        assert "SpyreHostOutOfMemoryError |" in line, line
        assert "spyre:0 out of host memory" in line and "131072.00 GiB" in line, line   # the card and the request
        assert "free of" in line and "smaller tensors" in line, line                    # the card's room, the fix
        assert "DefaultCPUAllocator" not in line.split("|")[1], line
