"""A cached ``spyre-lab reproduce`` reads its result and renders it without loading the studies it would run.

Each check runs in a fresh interpreter, since this test process has long since imported everything.
"""

import ast
import json
import os
import subprocess
import sys

import pytest

from spyre_lab.studies.reproduce import SCHEMA, source_fingerprint

HEAVY = ("spyre_lab.compiler", "spyre_lab.engine", "spyre_lab.distributed", "spyre_lab.studies.claims",
         "spyre_lab.studies.granite8b", "spyre_lab.studies.tensor_parallel", "spyre_lab.studies.sweeps",
         "spyre_lab.studies.sweep_runner", "torch._dynamo")
"""What a computed result needs (the compiler, the engine, Dynamo, the study modules) and a cached one does not."""


def _step(kind: str, size: int, step_us: float) -> dict:
    return {"kind": kind, "size": size, "step_us": step_us, "host_us": step_us / 4, "device_us": step_us / 2,
            "launches": 321, "tokens_per_s": size / (step_us / 1e6)}


def _stored_result() -> dict:
    """A result of the schema's shape with numbers no study computes, so the output shows it was read back."""
    tp_rows = [{"tp": k, "kind": "decode", "size": 1, "compute_us": 43210.0 / k, "collective_us": 10.0 * (k - 1),
                "step_us": 43210.0 / k + 10.0 * (k - 1), "collective_share": 10.0 * (k - 1) / (43210.0 / k + 1),
                "collectives": 0 if k == 1 else 82, "weight_bytes_per_card": 16_000_000_000 // k} for k in (1, 2)]
    claim = {"key": "decode", "title": "Decode: all mechanisms on", "published": "2.4x", "before_us": 98765.0,
             "after_us": 43210.0, "before_label": "all off", "after_label": "all on", "ratio": 98765.0 / 43210.0,
             "dominant_before": "host-bound", "dominant_after": "device-bound", "mechanism": "stored mechanism",
             "changed": {"overlap": [False, True]}, "rows": [_step("decode", 1, 43210.0)], "note": ""}
    return {"schema": SCHEMA, "modeled": True, "device": {"cores": 32}, "model": {
                "hidden_size": 4096, "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
                "head_dim": 128, "intermediate_size": 12800, "vocab_size": 49159},
            "engine": {"method": "stored", "steps": [_step("prefill", 1024, 87654.0), _step("decode", 1, 43210.0)],
                       "attention": [{"kind": "decode", "size": 1, "attention_rule": "on", "attention_us": 1234.0,
                                      "attention_launches": 40, "device_us": 21605.0, "step_us": 43210.0,
                                      "share": 1234.0 / 21605.0}],
                       "tensor_parallel": {"method": "stored TP", "link": "stored link", "rows": tp_rows,
                                           "decode_batch_1": "decode batch 1: fastest at TP 2"}},
            "claims": [claim],
            "sweep": {"configurations": 3, "ranges": {"dram_gbs": [100.0, 200.0]},
                      "verdicts": {"decode": {"measured_on": "decode batch 1", "verdict": "robust"}}},
            "wall_s": {"engine_steps": 1.0, "sweep": 2.0}}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A cache folder holding this source's result (the sweep's file, which every rendering reads)."""
    folder = tmp_path_factory.mktemp("reproduce-cache")
    (folder / f"reproduce-sweep-{source_fingerprint()}.json").write_text(json.dumps(_stored_result()))
    return folder


def _run_cli(cache_dir, *flags: str) -> tuple[str, str, list[str]]:
    """(stdout, stderr, heavy modules loaded) of ``spyre-lab reproduce FLAGS`` in a fresh interpreter."""
    probe = ("import sys; from spyre_lab.cli import main; code = main(sys.argv[1:]); "
             f"print('LOADED', [m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr); sys.exit(code)")
    env = dict(os.environ, SPYRE_LAB_CACHE=str(cache_dir))
    done = subprocess.run([sys.executable, "-c", probe, "reproduce", *flags], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    loaded = next(line for line in done.stderr.splitlines() if line.startswith("LOADED "))
    return done.stdout, done.stderr, ast.literal_eval(loaded.removeprefix("LOADED "))


@pytest.mark.parametrize("flags", [(), ("--json",), ("--markdown",)], ids=["text", "json", "markdown"])
def test_a_cached_reproduce_loads_no_compiler_engine_or_study(cache_dir, flags):
    out, err, loaded = _run_cli(cache_dir, *flags)
    assert "computed from this very source" in err          # it was a cache hit...
    assert "43.21 ms" in out or '"step_us": 43210.0' in out   # ...and printed the stored numbers
    assert loaded == [], f"a cache hit loaded {loaded}"


def test_the_package_names_still_import_and_load_on_first_use():
    probe = """
import sys, importlib
import spyre_lab.studies as S
before = [m for m in ("spyre_lab.studies.claims", "spyre_lab.studies.granite8b") if m in sys.modules]
import spyre_lab.studies.reproduce   # the submodule shares its name with the package's function
from spyre_lab.studies import reproduce
assert callable(reproduce) and reproduce.__module__ == "spyre_lab.studies.reproduce", reproduce
for name in S.__all__:
    exec(f"from spyre_lab.studies import {name}")
from spyre_lab.studies import Claim, StepConfig, sweep, time_steps
assert Claim is importlib.import_module("spyre_lab.studies.claims").Claim
assert StepConfig is importlib.import_module("spyre_lab.studies.granite8b").StepConfig
assert time_steps is importlib.import_module("spyre_lab.studies.granite8b").time_steps
assert sweep is importlib.import_module("spyre_lab.studies.sweep_runner").sweep
assert set(S.__all__) <= set(dir(S))
try:
    S.no_such_study
except AttributeError as error:
    assert "no_such_study" in str(error)
else:
    raise AssertionError("an unknown name must raise AttributeError")
from spyre_lab.studies.reproduce import ATTENTION_OFF
assert ATTENTION_OFF == StepConfig(attention_kernel=False)
print("BEFORE", before)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "BEFORE []"   # importing the package loaded no study
