"""Every benchmark script explains itself: ``--help`` lists its sections and options and runs nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
BENCHMARKS = sorted([*_DIR.glob("bench_*.py"), _DIR / "instructions.py"])   # (instructions.py: not in make bench)


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.stem)
def test_help_lists_sections_without_running_them(script: Path) -> None:
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "usage:" in text and script.name in text and "section" in text.lower(), text
    assert "\n== " not in text, "--help ran a section"  # every section prints a "== ..." header first


def test_an_unknown_section_names_the_valid_ones() -> None:
    script = next(p for p in BENCHMARKS if p.stem == "bench_sim")
    done = subprocess.run([sys.executable, str(script), "nope"], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "unknown section 'nope'" in done.stderr and "1 event" in done.stderr
