"""``with only_warnings(pattern, ...):`` -- a block may give only the warnings a test documents.

Silencing warnings hides new ones; requiring them makes a test depend on order, because the runtime's
notices are one-time (per op, per dtype) and an earlier test may already have given them. So every warning
the block gives must match one of the patterns (regular expressions), and none is required.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator

SPYRE_ENGINE_WARNINGS = (
    r"aten::\w+ has no spyre kernel",                          # rotary tables, the eager path's KV writes, masks
    r"spyre: aten\.embedding runs on the host CPU",            # the embedding gather
    r"spyre stores torch\.float(32|64) tensors as float16",    # the rotary tables are computed in fp32 / fp64
)
"""What running tiny-granite on the spyre platform may warn about (each notice is one-time, so none is required)."""


@contextlib.contextmanager
def only_warnings(*patterns: str) -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    unexpected = [f"{w.category.__name__}: {w.message}" for w in caught
                  if not any(re.search(p, str(w.message)) for p in patterns)
                  and not issubclass(w.category, DeprecationWarning)]
    assert not unexpected, f"warnings the test does not expect: {unexpected}"
