"""``spyre-lab compile --ktir OUT``: one .mlir per exported kernel, each a loadable KTIR module; refusals reported."""

from __future__ import annotations

import pytest

import spyre_lab.ktir
from spyre_lab import cli
from spyre_lab.ktir.compile_examples import EXAMPLES, compile_example


def test_softmax_writes_one_loadable_file_per_kernel(tmp_path, capsys) -> None:
    assert cli.main(["compile", "--ktir", str(tmp_path), "--example", "softmax"]) == 0
    printed = capsys.readouterr().out
    files = sorted(tmp_path.glob("*.mlir"))
    assert [p.stem for p in files] == ["k0_single_mul", "k1_softmax_amax_sub_exp_sum_div"]
    assert f"2 kernel(s) written as KTIR to {tmp_path}" in printed
    for path in files:
        assert str(path) in printed
        line = next(ln for ln in printed.splitlines() if str(path) in ln)
        assert "read back: max |error|" in line and "modeled" in line and "compiled" in line
        function = spyre_lab.ktir.load(path).main
        assert function.name == path.stem and function.grid == (32,)
        assert function.simulate().time_us > 0


def test_the_layer_is_written_whole(tmp_path, capsys) -> None:
    cli.main(["compile", "--ktir", str(tmp_path), "--example", "layer"])
    assert not list(tmp_path.glob("*.unsupported.txt")), capsys.readouterr().out
    assert len(list(tmp_path.glob("*.mlir"))) == 24
    assert any("attention" in p.name for p in tmp_path.glob("*.mlir")), "fused attention is written too"


def test_a_refused_kernel_is_printed_with_its_reason(tmp_path, capsys, monkeypatch) -> None:
    """An attention mask given as an input (not the constant causal one) is outside the written subset."""
    import torch
    import torch.nn.functional as F

    def masked(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    shapes = [(1, 2, 128, 64)] * 3 + [(128, 128)]
    monkeypatch.setitem(EXAMPLES, "masked_attention", (masked, lambda: [torch.randn(*s).half() for s in shapes]))
    from spyre_lab.ktir.compile_examples import main

    main("masked_attention", str(tmp_path))
    printed = capsys.readouterr().out
    reasons = sorted(tmp_path.glob("*.unsupported.txt"))
    assert [p.name for p in reasons] == [p.name for p in reasons if "attention" in p.name] != [], printed
    for path in reasons:
        kernel = path.name.removesuffix(".unsupported.txt")
        assert f"refused {kernel}: " in printed and "not written as KTIR" in path.read_text()
        assert "constant causal mask" in path.read_text()


def test_the_fused_mlp_example_is_written(tmp_path) -> None:
    cli.main(["compile", "--ktir", str(tmp_path), "--example", "mlp"])
    assert not list(tmp_path.glob("*.unsupported.txt"))
    (path,) = tmp_path.glob("*.mlir")
    assert spyre_lab.ktir.load(path).main.simulate().ring_bytes > 0, "the down projection's I partners meet"


def test_every_example_is_offered_and_an_unknown_one_is_named() -> None:
    assert set(cli.COMPILE_EXAMPLES) == set(EXAMPLES)
    with pytest.raises(SystemExit) as refused:
        cli.main(["compile", "--ktir", "unused", "--example", "no_such_program"])
    assert refused.value.code == 2, "argparse refuses an example outside its choices"
    with pytest.raises(ValueError, match="no example program 'no_such_program'; choose one of"):
        compile_example("no_such_program", "unused")


def test_every_written_kernel_reads_back_to_the_compiled_values(tmp_path) -> None:
    written, _, checks = compile_example("layer", tmp_path)
    assert sorted(c.kernel for c in checks) == sorted(p.stem for p in written)
    for check in checks:
        assert check.max_abs_error <= 2e-2, check.kernel        # fp16 outputs; a matmul's K order may differ
        assert check.ktir_us["analytic"] > 0
