"""Results kept on disk under the source fingerprint: a study is computed again only when its code changed.

The modeled numbers are a function of the source (no randomness that is not seeded, no wall clock in
them), so a result computed once from this exact code can be read back instead of recomputed. The
fingerprint hashes every file of the packages the numbers depend on; the folder is ``$SPYRE_LAB_CACHE``
or ``~/.cache/spyre_lab``. Nothing here imports torch, so reading a cached result is quick.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

FINGERPRINTED = ("device", "compiler", "runtime", "engine", "studies", "distributed", "ktir")
"""The packages whose code the results depend on, with the package's top-level modules (the views do not
change a number); the installed torch's version is hashed too, since its decompositions shape every graph."""

_ROOT = Path(__file__).resolve().parents[1]


def source_fingerprint(salt: str = "") -> str:
    """A hash of the source the results depend on (and ``salt``, e.g. a result schema)."""
    digest = hashlib.sha256(f"{salt}|torch {_torch_version()}".encode())
    files = [*_ROOT.glob("*.py"), *(p for sub in FINGERPRINTED for p in (_ROOT / sub).rglob("*.py"))]
    for path in sorted(files):
        digest.update(str(path.relative_to(_ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _torch_version() -> str:
    """The installed torch's version, read from its metadata (importing torch here would make a cache hit slow)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "none"


def cache_folder(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where cached results live: ``cache_dir``, else ``$SPYRE_LAB_CACHE``, else ``~/.cache/spyre_lab``."""
    return Path(cache_dir or os.environ.get("SPYRE_LAB_CACHE") or Path.home() / ".cache" / "spyre_lab")


def read_json(path: Path) -> Any | None:
    """The JSON at ``path``, or None when there is none (or it is unreadable: it is then recomputed)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` as JSON atomically (a reader never sees half a file, two writers never mix)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)
