"""Outside the subset: KTIRUnsupported naming the op and its line; malformed: KTIRParseError with line and column."""

from __future__ import annotations

import pytest

import spyre_lab.ktir as ktir
from spyre_lab.ktir.examples import path

VECTOR_ADD = path("vector_add").read_text()


def test_an_unknown_op_names_itself_and_its_line() -> None:
    text = VECTOR_ADD.replace("%sum = arith.addf %x, %y", "%sum = arith.frobnicate %x, %y")
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "frobnicate" in s)
    fn = ktir.load(text).main
    with pytest.raises(ktir.KTIRUnsupported, match=f"line {line}: arith.frobnicate") as info:
        fn.tile_program()
    assert info.value.op == "arith.frobnicate" and info.value.line == line


def test_linalg_generic_is_reported_not_skipped() -> None:
    text = VECTOR_ADD.replace("%sum = arith.addf %x, %y : tensor<128xf16>",
                              "%sum = linalg.generic {indexing_maps = []} ins(%x : tensor<128xf16>)")
    with pytest.raises(ktir.KTIRUnsupported, match=r"linalg\.generic"):
        ktir.load(text).main.tile_program()


@pytest.mark.parametrize("line_text", ["    %c128 = arith.constant 128 : index\n",
                                       "    %t = ktdp.get_compute_tile_id : index\n"])
def test_a_malformed_line_gives_line_and_column(line_text: str) -> None:
    lines = VECTOR_ADD.splitlines(keepends=True)
    idx = lines.index(line_text)
    lines[idx] = line_text.replace(" = ", " = = ")
    with pytest.raises(ktir.KTIRParseError) as info:
        ktir.load("".join(lines))
    assert (info.value.line, info.value.col) == (idx + 1, lines[idx].index("= =") + 3)


def test_an_unclosed_region_and_a_stray_character() -> None:
    with pytest.raises(ktir.KTIRParseError, match="never closed"):
        ktir.load(VECTOR_ADD.rsplit("}", 2)[0])
    text = VECTOR_ADD.replace("%c128 = arith.constant 128", "%c128 = arith.constant 128 ` ", 1)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "`" in s)
    col = text.splitlines()[line - 1].index("`") + 1
    with pytest.raises(ktir.KTIRParseError, match=f"line {line}, column {col}: unexpected character"):
        ktir.load(text)


def test_a_function_without_a_grid_and_a_value_used_before_definition() -> None:
    with pytest.raises(ktir.KTIRUnsupported, match="no grid attribute"):
        ktir.load(VECTOR_ADD.replace(" attributes {grid = [32]}", ""))
    text = VECTOR_ADD.replace("%sum = arith.addf %x, %y", "%sum = arith.addf %x, %nowhere")
    with pytest.raises(ktir.KTIRUnsupported, match="%nowhere is used before it is defined"):
        ktir.load(text).main.tile_program()


def test_dynamic_shapes_are_reported() -> None:
    text = VECTOR_ADD.replace("-> tensor<128xf16>", "-> tensor<?xf16>", 1)
    with pytest.raises(ktir.KTIRUnsupported, match="dynamic sizes"):
        ktir.load(text).main.tile_program()


def test_extract_slice_takes_a_window_at_an_index_offset_and_refuses_one_past_the_end() -> None:
    """Core t adds x + y and keeps the window [64 t % 128, + 64) of its 128: each core writes its window's values."""
    import torch

    window = ("      %sum = arith.addf %x, %y : tensor<128xf16>\n"
              "      %w0 = arith.remui %t, %c2 : index\n"
              "      %w = arith.muli %w0, %c64 : index\n"
              "      %win = tensor.extract_slice %sum[%w] [64] [1] : tensor<128xf16> to tensor<64xf16>\n"
              "      %twice = tensor.concat dim(0) %win, %win : (tensor<64xf16>, tensor<64xf16>) -> tensor<128xf16>\n")
    text = VECTOR_ADD.replace("      %sum = arith.addf %x, %y : tensor<128xf16>\n", window).replace(
        "ktdp.store %sum,", "ktdp.store %twice,").replace(
        "    %c256 = arith.constant 256 : index\n",
        "    %c256 = arith.constant 256 : index\n    %c2 = arith.constant 2 : index\n"
        "    %c64 = arith.constant 64 : index\n")
    x, y = torch.randn(8192).half(), torch.randn(8192).half()
    out = ktir.load(text).main.run(x, y, torch.zeros(8192).half()).outputs["out_ptr"]
    tiles = (x + y).reshape(32, 2, 2, 64)                     # core, round, half of the round's 128
    want = torch.stack([tiles[t, :, t % 2] for t in range(32)])   # the half the core's window takes
    assert torch.equal(out.reshape(32, 2, 2, 64), want.unsqueeze(2).expand(32, 2, 2, 64))
    past = text.replace("%w = arith.muli %w0, %c64", "%w = arith.muli %w0, %c128")   # core 1's window: [128, 192)
    line = next(i for i, s in enumerate(past.splitlines(), 1) if "extract_slice" in s)
    where = f"line {line}: tensor.extract_slice .*128, 192\\) of dim 0 runs past its 128"
    with pytest.raises(ktir.KTIRUnsupported, match=where):
        ktir.load(past).main.tile_program()
