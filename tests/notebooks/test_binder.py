"""A Binder launch, rebuilt here: a fresh virtual environment from binder/ alone, then every tutorial executed in it.

repo2docker clones the repository, runs ``pip install -r binder/requirements.txt`` and then ``binder/postBuild``
from the repository root. This test does the same in a temporary copy of the working tree, with one swap: the
PyTorch CPU wheel index (``--extra-index-url https://download.pytorch.org/whl/cpu``) is not reachable from the
machines that run the tests, so that line is dropped and pip's configured default index supplies the same
``torch==2.13.0+cpu`` wheel. Everything else (the pins, the postBuild step, the notebooks) is used as committed.

Slow (a venv build, about a minute and a half, then every tutorial): runs only with ``SPYRE_LAB_BINDER_TEST=1``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _requirements() -> list[str]:
    return (ROOT / "binder" / "requirements.txt").read_text().splitlines()


def test_binder_requirements_get_the_cpu_build_of_torch():
    lines = [line.split("#")[0].strip() for line in _requirements()]
    assert any(CPU_INDEX in line and line.startswith(("--extra-index-url", "--index-url")) for line in lines), \
        "binder/requirements.txt must point pip at the PyTorch CPU index, or Binder pulls the CUDA build"
    torch_pins = [line for line in lines if line.startswith("torch")]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("torch"))
    assert torch_pins == [package_pin + "+cpu"], f"binder pins {torch_pins}; the package pins {package_pin}"
    post_build = (ROOT / "binder" / "postBuild").read_text()
    assert os.access(ROOT / "binder" / "postBuild", os.X_OK) and '-e ".[viz]"' in post_build


def test_binder_badge_matches_the_repository_url():
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    owner_repo = urls["Repository"].removeprefix("https://github.com/").strip("/")
    badge = (f"[![Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/{owner_repo}/HEAD"
             f"?urlpath=lab/tree/tutorials)")
    readme = (ROOT / "README.md").read_text()
    assert badge in readme, f"README's Binder badge should be exactly:\n{badge}"


def test_binder_culls_idle_kernels(tmp_path):
    """postBuild installs the server config, and Jupyter's own kernel manager reads the culling settings from it."""
    from jupyter_server.services.kernels.kernelmanager import MappingKernelManager
    from traitlets.config.loader import PyFileConfigLoader

    post_build = (ROOT / "binder" / "postBuild").read_text().splitlines()
    config_steps = [line for line in post_build if line.strip() and not line.startswith("#")
                    and "pip install" not in line]
    jupyter_bin = Path(sys.executable).parent
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter"),
           "PATH": f"{jupyter_bin}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", "-c", "\n".join(config_steps)], cwd=ROOT, env=env, check=True)
    installed = tmp_path / "jupyter" / "jupyter_server_config.py"
    assert installed.read_text() == (ROOT / "binder" / "jupyter_server_config.py").read_text()
    config = PyFileConfigLoader(installed.name, path=str(installed.parent)).load_config()
    manager = MappingKernelManager(config=config)
    assert 0 < manager.cull_idle_timeout <= 15 * 60, "cull kernels idle for at most 15 minutes"
    assert manager.cull_connected, "JupyterLab keeps every opened notebook connected: cull connected kernels too"
    assert not manager.cull_busy and 0 < manager.cull_interval <= manager.cull_idle_timeout
    assert set(config.MappingKernelManager) == {"cull_idle_timeout", "cull_interval", "cull_connected", "cull_busy"}


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [p for p in out.split("\0") if p]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SPYRE_LAB_BINDER_TEST") != "1",
                    reason="slow (fresh venv + every tutorial); set SPYRE_LAB_BINDER_TEST=1 to run it")
def test_binder_environment_runs_the_tutorials(tmp_path):
    repo = tmp_path / "repo"
    for rel in _tracked_files():
        if (ROOT / rel).is_file():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, repo / rel)
    # the one swap: the CPU wheel index is unreachable here; pip's default index serves the same wheel
    requirements = [line for line in _requirements() if CPU_INDEX not in line]
    (tmp_path / "requirements-local.txt").write_text("\n".join(requirements) + "\n")

    venv = tmp_path / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    python = str(venv / "bin" / "python")

    def run(*cmd: str) -> str:
        done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    run(python, "-m", "pip", "install", "--quiet", "-r", str(tmp_path / "requirements-local.txt"))
    run("bash", str(repo / "binder" / "postBuild"))
    version = run(python, "-c", "import torch; print(torch.__version__, torch.version.cuda)").split()
    assert version == ["2.13.0+cpu", "None"], f"torch in the Binder env: {version}"
    installed = run(python, "-m", "pip", "list", "--format=freeze").lower()
    assert "nvidia" not in installed, "a CUDA wheel got into the Binder environment"
    run(python, "-c", "import spyre_lab, spyre_lab.viz, plotly, ipywidgets")
    report = run(python, "scripts/run_notebooks.py", "tutorials")
    assert report.count(".ipynb:") == len(list((ROOT / "tutorials").glob("*.ipynb"))), report
