"""Test-wide setup: the tests folder is importable, for small shared helpers such as ``warning_checks``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
