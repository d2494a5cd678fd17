"""The reader under random rewrites of a valid kernel: spacing, comments, SSA names and attribute order change
nothing it computes; random damage raises only KTIRParseError or KTIRUnsupported."""

from __future__ import annotations

import contextlib
import re

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spyre_lab.ktir as ktir
from spyre_lab.ktir.examples import path

SOFTMAX = path("row_softmax").read_text()
VECTOR_ADD = path("vector_add").read_text()
X = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)).half()
REFERENCE = ktir.load(SOFTMAX).main.run(X, torch.zeros(64, 256, dtype=torch.half)).outputs["out_ptr"]
NAMES = sorted(set(re.findall(r"%[A-Za-z_][A-Za-z0-9_]*", SOFTMAX)) - {"%in_ptr", "%out_ptr"})
FUZZ = settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _respace(text: str, data: st.DataObject) -> str:
    """Each run of spaces becomes 1-3 spaces, tabs or a newline, and some lines get a trailing comment."""
    out = []
    for line in text.split("\n"):
        if line.lstrip().startswith("//"):
            out.append(line)
            continue
        parts = line.split(" ")
        glue = [data.draw(st.sampled_from([" ", "  ", "\t", " \n  "])) for _ in parts[1:]]
        line = parts[0] + "".join(g + p for g, p in zip(glue, parts[1:]))
        if data.draw(st.booleans()):
            line += data.draw(st.sampled_from(["  // note", " //", "// %x = arith.addf {"]))
        out.append(line)
    return "\n".join(out)


@FUZZ
@given(data=st.data())
def test_rewrites_keep_the_numbers(data: st.DataObject) -> None:
    text = SOFTMAX
    # rename SSA values (same rename everywhere)
    fresh = data.draw(st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), min_size=len(NAMES),
                               max_size=len(NAMES), unique=True))
    mapping = {old: f"%v_{new}" for old, new in zip(NAMES, fresh)}
    text = re.sub(r"%[A-Za-z_][A-Za-z0-9_]*", lambda m: mapping.get(m.group(0), m.group(0)), text)
    # swap the two entries of attribute dicts
    if data.draw(st.booleans()):
        text = re.sub(r"\{access_tile_set = (#\w+), access_tile_order = (#\w+)\}",
                      r"{access_tile_order = \2, access_tile_set = \1}", text)
        text = re.sub(r"coordinate_set = (#\w+), memory_space = (#ktdp\.memory_space<global>)",
                      r"memory_space = \2, coordinate_set = \1", text)
    text = _respace(text, data)
    out = ktir.load(text).main.run(X, torch.zeros(64, 256, dtype=torch.half)).outputs["out_ptr"]
    assert torch.equal(out, REFERENCE)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(0, len(VECTOR_ADD)), junk=st.text(alphabet="%{}()[]<>=:,.#!^@x0 \n", max_size=6),
       drop=st.integers(0, 40))
def test_damage_raises_only_the_two_errors(cut: int, junk: str, drop: int) -> None:
    text = VECTOR_ADD[:cut] + junk + VECTOR_ADD[cut + drop:]
    with contextlib.suppress(ktir.KTIRParseError, ktir.KTIRUnsupported):
        ktir.load(text).main.tile_program()
