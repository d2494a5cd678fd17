"""FusionView's KTIR tab: every kernel's LoopIR next to its KTIR, redrawn when a fusion rule changes."""

import ipywidgets as W
import torch
import torch.nn.functional as F

from spyre_lab.compiler.backend import compile_graph
from spyre_lab.ktir.module import load
from spyre_lab.viz.fusion_ktir import KTIR_TAB, fusion_with_ktir, ktir_panel


def _program():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(48, 150, generator=g).half(), torch.randn(48, 150, generator=g).half()
    return compile_graph(lambda a, b: torch.softmax(F.silu(a) * b, -1), [x, y])


def test_tab_shows_loopir_next_to_ktir_and_follows_the_rules() -> None:
    program = _program()
    view = fusion_with_ktir(program)
    tab = next(w for w in view.widget.children if isinstance(w, W.Tab))
    assert tab.titles == (KTIR_TAB,)
    text = view.panel_texts()[KTIR_TAB]
    assert f"of {program.num_kernels} device kernels written as KTIR" in text
    assert "// LoopIR of" in text and "ktdp.get_compute_tile_id" in text and "linalg.reduce" in text
    funcs = text.count("func.func @")
    for rule in list(view.rules):
        view.controls[rule].value = False
    unfused = view.panel_texts()[KTIR_TAB]
    assert unfused.count("func.func @") > funcs, "each kernel the rules no longer merge is its own func.func"
    assert tab.children[0].value.count("func.func @") == unfused.count("func.func @"), "the shown tab is redrawn"
    # what the tab shows is real KTIR: every function in it loads
    for chunk in unfused.split("module {")[1:]:
        assert load("module {" + chunk.split("\n}\n")[0] + "\n}\n").main.cores >= 1


def test_saved_program_says_why_there_is_no_ktir(tmp_path) -> None:
    program = _program()
    path = tmp_path / "p.json"
    program.save_json(str(path))
    assert "keeps no LoopIR" in ktir_panel(__import__("json").loads(path.read_text()))
