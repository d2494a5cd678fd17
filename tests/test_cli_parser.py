"""The ``spyre-lab`` command line: building its parser loads no layer a command may not need."""

import subprocess
import sys

import pytest

HEAVY = ("uvicorn", "fastapi", "plotly", "dask", "ipywidgets", "spyre_lab.engine", "spyre_lab.serving.launcher")


def test_building_the_parser_imports_no_web_server_engine_or_views():
    """Every command builds the whole parser first; a cached ``reproduce`` must not pay for uvicorn or the engine."""
    probe = ("import sys; from spyre_lab.cli import build_parser; build_parser(); "
             f"print([m for m in {HEAVY!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_serving_package_still_offers_its_launcher():
    from spyre_lab import serving

    assert serving.ServerThread.__module__ == "spyre_lab.serving.launcher"
    assert "wait_healthy" in serving.__all__
    with pytest.raises(AttributeError, match="no_such_name"):
        serving.no_such_name  # noqa: B018
