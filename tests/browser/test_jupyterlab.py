"""Every view in a real browser: JupyterLab on 127.0.0.1, the all-views notebook run in headless Chromium.

Checks what only a browser can: the widgets render (a plotly plot per view, no "Error displaying widget"),
no cell raises, and moving a slider with the keyboard really redraws a figure through the kernel. Screenshots of
every view go to ``out/browser/`` (look at them). Needs Debian's ``chromium`` (``apt-get install chromium``) and
the ``playwright`` package; without them the test skips, unless ``SPYRE_LAB_REQUIRE_BROWSER=1`` (set by CI),
where it fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from warning_checks import SPYRE_ENGINE_WARNINGS

HERE = Path(__file__).parent
NOTEBOOK = HERE / "all_views.ipynb"
OUT = Path(__file__).parents[2] / "out" / "browser"
CHROMIUM = os.environ.get("SPYRE_LAB_CHROMIUM", "/usr/bin/chromium")
REQUIRED = os.environ.get("SPYRE_LAB_REQUIRE_BROWSER") == "1"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
RUN_TIMEOUT_S = 600
EXPECTED_WARNINGS = re.compile("|".join(SPYRE_ENGINE_WARNINGS))   # the engine's, and WhatIf's SDPA mask constants


def _missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright; no browser download needed)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on loopback serving a copy of the notebook; stopped by its PID afterwards."""
    reason = _missing()
    if reason:
        if REQUIRED:
            pytest.fail(f"SPYRE_LAB_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)
    home = tmp_path_factory.mktemp("jupyter-home")
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               HF_HUB_OFFLINE="1")
    # the widget front-ends (ipywidgets, anywidget, plotly) are lab extensions installed as data files next to the
    # packages; a venv that shares another's packages must point JupyterLab at that one's data directory too
    import ipywidgets

    data_dirs = {str(Path(sys.prefix) / "share" / "jupyter"), str(Path(ipywidgets.__file__).parents[4] / "share" /
                                                                  "jupyter")}
    env["JUPYTER_PATH"] = os.pathsep.join([*sorted(data_dirs), env.get("JUPYTER_PATH", "")]).rstrip(os.pathsep)
    # no "would you like news?" toast over the figures in the screenshots
    news = home / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    # render every cell, not only those in view (JupyterLab 4 windows long notebooks), so each plot gets laid out
    tracker = home / "settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    (tracker / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    port = _free_port()
    log = (home / "lab.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ServerApp.token=",
         "--ServerApp.password=", "--ServerApp.ip=127.0.0.1", "--allow-root", f"--ServerApp.root_dir={root}"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not start; its log:\n{(home / 'lab.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _prompts(page) -> list[str]:
    return page.eval_on_selector_all(".jp-CodeCell .jp-InputPrompt", "els => els.map(e => e.textContent.trim())")


def _plot_state(page, index: int) -> str:
    """The data and title of the index-th plotly plot on the page, as the browser holds them."""
    return page.evaluate(
        "i => { const gd = document.querySelectorAll('.js-plotly-plot')[i];"
        " return JSON.stringify([gd.data.map(t => [t.x, t.y, t.marker && t.marker.color]),"
        " (gd.layout.annotations || []).map(a => a.text)]); }", index)


def _wait_for_plot_data(page, timeout_ms: int) -> list[int]:
    """Wait until every plot holds data; return the indices of those still empty at the timeout."""
    script = ("Array.from(document.querySelectorAll('.js-plotly-plot'))"
              ".map((gd, i) => gd.data && gd.data.length ? -1 : i).filter(i => i >= 0)")
    try:
        page.wait_for_function(f"{script}.length === 0", timeout=timeout_ms)
        return []
    except Exception:
        return page.evaluate(script)


def test_every_view_renders_and_a_slider_redraws(lab):
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    notebook = json.loads(NOTEBOOK.read_text())
    code_cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    view_cells = [i for i, c in enumerate(code_cells) if "viz." in "".join(c["source"]).splitlines()[-1]]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1500, "height": 2200})
        page.set_default_timeout(60_000)
        page.goto(f"{lab}/lab/tree/{NOTEBOOK.name}")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
        # a fresh server may ask which kernel to use; the idle indicator does not show that it is waiting
        try:
            page.wait_for_selector(".jp-Dialog .jp-mod-accept", timeout=8_000)
            page.click(".jp-Dialog .jp-mod-accept")
        except Exception:  # no dialog: the notebook's kernelspec was taken as is
            pass
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle'], .jp-Toolbar", timeout=60_000)
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_text("Run All Cells", exact=True).click()
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            prompts = _prompts(page)
            if prompts and all(p.startswith("[") and p[1:-2].strip().isdigit() for p in prompts):
                break
            if time.monotonic() > deadline:
                page.screenshot(path=str(OUT / "timeout.png"), full_page=True)
                pytest.fail(f"the notebook did not finish in {RUN_TIMEOUT_S} s; prompts: {prompts}")
            time.sleep(1)
        try:
            page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length >= {len(view_cells)}",
                                   timeout=120_000)
        except Exception:
            page.screenshot(path=str(OUT / "plots-missing.png"), full_page=True)
            shown = page.locator(".js-plotly-plot").count()
            pytest.fail(f"{shown} of {len(view_cells)} plots rendered; page text:\n{page.inner_text('body')[-3000:]}")
        # a FigureWidget's figure arrives over the kernel's comm after its cell finishes, and plotly lays a plot out
        # only when it is on screen: bring each output into view, then wait for every plot's data
        for i in view_cells:
            page.locator(".jp-CodeCell").nth(i).locator(".jp-OutputArea").scroll_into_view_if_needed()
            page.wait_for_timeout(500)
        empty = _wait_for_plot_data(page, 180_000)
        if empty:
            # Seen on this machine under load: a FigureWidget view now and then lays out before its figure arrives
            # and stays empty (plotly's front end; the kernel-side figure is complete). Running those cells again
            # makes fresh widgets, which must render. The first-render miss is recorded in out/browser, not hidden.
            (OUT / "first-render-empty.txt").write_text(f"plots {empty} (0-based) were empty at first render\n")
            print(f"first render: plots {empty} empty; running their cells again")
            owners = page.evaluate("Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => "
                                   "Array.from(document.querySelectorAll('.jp-CodeCell')).indexOf(gd.closest('.jp-CodeCell')))")
            for cell in sorted({owners[i] for i in empty}):
                target = page.locator(".jp-CodeCell").nth(cell)
                target.locator(".jp-InputArea-editor").click()
                page.keyboard.press("Control+Enter")
                page.wait_for_timeout(500)
            page.wait_for_function("Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt'))"
                                   ".every(e => !e.textContent.includes('*'))", timeout=300_000)
            still = _wait_for_plot_data(page, 180_000)
            if still:
                page.screenshot(path=str(OUT / "plots-empty.png"), full_page=True)
                pytest.fail(f"plots {still} (0-based, in notebook order) never received their data")
        page.wait_for_timeout(1_000)
        body = page.inner_text("body")
        assert "Error displaying widget" not in body
        errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")
        assert errors.count() == 0, errors.first.inner_text()
        # warnings are shown, as a learner sees them; each must be one of the documented ones
        stderr = page.eval_on_selector_all(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                                           "els => els.map(e => e.innerText)")
        warned = [line for text in stderr for line in text.splitlines() if "Warning:" in line]
        assert all(EXPECTED_WARNINGS.search(line) for line in warned), warned
        plots = page.locator(".js-plotly-plot")
        assert plots.count() == len(view_cells)
        page.screenshot(path=str(OUT / "notebook.png"))
        cells = page.locator(".jp-CodeCell")
        for i in view_cells:
            name = "".join(code_cells[i]["source"]).splitlines()[-1].split("(")[0].removeprefix("viz.")
            output = cells.nth(i).locator(".jp-OutputArea")
            output.scroll_into_view_if_needed()
            page.wait_for_timeout(300)
            output.screenshot(path=str(OUT / f"{name.replace('.', '_')}.png"))

        # the last view (KVCacheView) has a step slider: move it with the keyboard, the kernel redraws the plot
        last = plots.count() - 1
        before = _plot_state(page, last)
        handle = cells.nth(view_cells[-1]).locator(".widget-slider .noUi-handle").first
        handle.scroll_into_view_if_needed()
        handle.focus()
        for _ in range(3):
            page.keyboard.press("ArrowRight")
        page.wait_for_function(
            "([i, before]) => { const gd = document.querySelectorAll('.js-plotly-plot')[i];"
            " return JSON.stringify([gd.data.map(t => [t.x, t.y, t.marker && t.marker.color]),"
            " (gd.layout.annotations || []).map(a => a.text)]) !== before; }", arg=[last, before], timeout=60_000)
        after = _plot_state(page, last)
        assert after != before
        # and it settles on the step the slider shows (each key press is one redraw in the kernel)
        readout = cells.nth(view_cells[-1]).locator(".widget-readout").first.inner_text().strip()
        page.wait_for_function(
            "([i, want]) => (document.querySelectorAll('.js-plotly-plot')[i].layout.annotations || [])"
            ".some(a => a.text === want)", arg=[last, f"blocks at step {readout}"], timeout=60_000)
        cells.nth(view_cells[-1]).locator(".jp-OutputArea").screenshot(path=str(OUT / "KVCacheView_after_slider.png"))
        browser.close()
