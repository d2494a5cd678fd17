"""Test-wide setup: the tests folder is importable (small shared helpers such as ``warning_checks``), and every
test directory sees the same modeled cards.

``SPYRE_LAB_DEVICES`` is read once, when the first card is made, so it is set here, before any test module is
collected: ``tests/engine`` run alone and the whole suite see the same two cards (a test that needs one card starts
a process of its own).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("SPYRE_LAB_DEVICES", "2")

sys.path.insert(0, str(Path(__file__).parent))
