"""Platform discovery through the `spyre_lab.platform_plugins` entry-point group."""

from __future__ import annotations

import textwrap

import pytest

from spyre_lab.engine import LLM, SamplingParams
from spyre_lab.engine.platforms.cpu import CpuPlatform
from spyre_lab.engine.platforms.registry import PLUGIN_GROUP, available_platforms, resolve_platform


def install_toy_distribution(root, name: str = "toy_accel") -> None:
    """Write a minimal installed distribution (package + dist-info with entry_points.txt) under `root`."""
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent('''
        import torch
        from spyre_lab.engine.layers.norm import RMSNorm
        from spyre_lab.engine.platforms.base import Platform

        class ToyRMSNorm(RMSNorm):
            calls = 0

            def forward_oot(self, x):
                type(self).calls += 1
                return super().forward_native(x)

        class ToyAccelPlatform(Platform):
            name = "toy-accel"
            supported_dtypes = (torch.float32,)
            dispatch_mode = "toy"

            def register_ops(self):
                self.register_oot("RMSNorm", ToyRMSNorm)

            def modeled_device_ms(self, kind, num_tokens, batch):
                return 0.001 * num_tokens
    '''))
    dist_info = root / f"{name}-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(f"[{PLUGIN_GROUP}]\ntoy-accel = {name}:ToyAccelPlatform\n")


def test_cpu_platform_is_registered_as_an_entry_point():
    assert available_platforms()["cpu"].load() is CpuPlatform
    assert isinstance(resolve_platform("cpu"), CpuPlatform)


def test_third_party_platform_is_discovered_and_runs_a_model(tmp_path, monkeypatch, hf_granite_dir):
    install_toy_distribution(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "toy-accel" in available_platforms()
    llm = LLM(hf_granite_dir, platform="toy-accel", max_model_len=64)
    import toy_accel

    out = llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    reference = LLM(hf_granite_dir, max_model_len=64).generate(
        [[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False
    )
    assert out[0].outputs[0].token_ids == reference[0].outputs[0].token_ids
    assert toy_accel.ToyRMSNorm.calls > 0
    steps = llm.stats.to_rows()
    assert {row["dispatch"] for row in steps} == {"toy"}
    assert all(row["device_ms_modeled"] == pytest.approx(0.001 * row["num_tokens"]) for row in steps)
    with pytest.raises(ValueError, match="does not run dtype"):
        LLM(hf_granite_dir, platform="toy-accel", dtype="float16")


def test_unknown_platform_names_the_installed_ones():
    with pytest.raises(ValueError, match=r"unknown platform 'nope'.*cpu"):
        resolve_platform("nope")
