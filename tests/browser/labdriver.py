"""Drive JupyterLab in headless Chromium the way a learner does: Run All on a loaded core, then move every control.

Shared by the browser test (``test_jupyterlab.py``) and ``scripts/check_views_in_browser.py``. Everything waits on a
state (the kernel idle, a figure changed), never on a fixed sleep. A view is found by its DOM: a widget box with a
caption (``.widget-html``) and a plot (``.js-plotly-plot``); spyre_lab views also carry the ``spyre-lab-view`` class.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("SPYRE_LAB_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
ANYWIDGET_FAILURE = "[anywidget] Failed to initialize model."

# every view box on the page, outermost only, in page order
VIEWS_JS = """() => {
  const all = Array.from(document.querySelectorAll('.jp-OutputArea-output .widget-vbox'))
    .filter(b => b.querySelector(':scope > .widget-html') && (b.classList.contains('spyre-lab-view')
                 || b.querySelector('.js-plotly-plot')));
  return all.filter(b => !all.some(o => o !== b && o.contains(b)));
}"""

# what a plot holds as the browser draws it: per trace its type, name, legend group, legend entry, bar pattern and,
# per data array, [length, sum of its numbers, nulls, total length of its strings, its first three strings]; the
# title, notes and shapes. The browser
# test's notebook prints the same summary of the kernel's figure (tests/browser/all_views.ipynb, last cell).
DIGEST_JS = """(gd) => {
  if (!gd || !gd.data) return null;
  const summary = values => {
    const flat = [], todo = [values];
    while (todo.length) { const v = todo.shift();
      if (Array.isArray(v) || ArrayBuffer.isView(v)) todo.unshift(...Array.from(v)); else flat.push(v); }
    const strings = flat.filter(v => typeof v === 'string');
    return [flat.length, flat.filter(v => typeof v === 'number').reduce((a, b) => a + b, 0),
            flat.filter(v => v === null || v === undefined).length, strings.reduce((a, s) => a + s.length, 0),
            strings.slice(0, 3)];
  };
  const isArray = v => Array.isArray(v) || ArrayBuffer.isView(v);
  return {
    data: gd.data.map(t => { const o = {type: t.type || 'scatter', name: t.name == null ? null : t.name};
                             for (const k of ['x', 'y', 'z', 'base', 'text']) if (isArray(t[k])) o[k] = summary(t[k]);
                             if (t.marker && isArray(t.marker.color)) o.color = summary(t.marker.color);
                             const pattern = t.marker && t.marker.pattern ? t.marker.pattern.shape : undefined;
                             o.pattern = pattern === undefined ? null : (isArray(pattern) ? summary(pattern) : pattern);
                             o.legendgroup = t.legendgroup === undefined ? null : t.legendgroup;
                             o.showlegend = t.showlegend === undefined ? null : t.showlegend;
                             return o; }),
    title: gd.layout.title == null ? null : (typeof gd.layout.title === 'string' ? gd.layout.title
                                             : (gd.layout.title.text == null ? null : gd.layout.title.text)),
    annotations: (gd.layout.annotations || []).map(a => a.text == null ? null : a.text),
    shapes: (gd.layout.shapes || []).map(s => [s.x0, s.x1, s.y0, s.y1].map(v => v === undefined ? null : v)),
  };
}"""


def same_figure(kernel: dict[str, Any], browser: dict[str, Any] | None) -> list[str]:
    """Where the browser's drawing differs from the kernel's figure (both as summarised above); empty if none."""
    import math

    if browser is None:
        return ["no plot drawn"]
    diffs = []

    def close(a: Any, b: Any) -> bool:
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
        return a == b

    if len(kernel["data"]) != len(browser["data"]):
        diffs.append(f"{len(kernel['data'])} traces in the kernel, {len(browser['data'])} drawn")
    for n, (k, b) in enumerate(zip(kernel["data"], browser["data"])):
        if not close(k, b):
            diffs.append(f"trace {n} ({k.get('name')}): kernel {k} / browser {b}"[:600])
    for key in ("title", "annotations", "shapes"):
        if not close(kernel[key], browser[key]):
            diffs.append(f"{key}: kernel {kernel[key]} / browser {browser[key]}"[:600])
    return diffs


def missing() -> str | None:
    """Why the browser cannot run here, or None."""
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


def _pinned(core: int | None):
    return None if core is None else (lambda: os.sched_setaffinity(0, {core}))


@contextlib.contextmanager
def cpu_hog(core: int | None) -> Iterator[subprocess.Popen | None]:
    """A process spinning on ``core`` (the core the kernel runs on) for as long as the block lasts."""
    if core is None:
        yield None
        return
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_pinned(core))
    try:
        yield hog
    finally:
        hog.terminate()
        hog.wait(timeout=20)


@contextlib.contextmanager
def jupyterlab(root: Path, home: Path, core: int | None = None, source: Path | None = None) -> Iterator[str]:
    """A JupyterLab server on loopback serving ``root``; with ``core``, it and every kernel it starts are pinned
    there; its kernels import spyre_lab from ``source`` (default: this checkout). Stopped by its PID afterwards."""
    source = source or Path(__file__).parents[2]
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               HF_HUB_OFFLINE="1", PYTHONPATH=str(source))
    # the widget front-ends are lab extensions installed as data files next to the packages; a venv that shares
    # another's packages must point JupyterLab at that one's data directory too
    import ipywidgets

    data_dirs = {str(Path(sys.prefix) / "share" / "jupyter"),
                 str(Path(ipywidgets.__file__).parents[4] / "share" / "jupyter")}
    env["JUPYTER_PATH"] = os.pathsep.join([*sorted(data_dirs), env.get("JUPYTER_PATH", "")]).rstrip(os.pathsep)
    settings = home / "settings" / "@jupyterlab"
    # no "would you like news?" toast over the figures
    (settings / "apputils-extension").mkdir(parents=True, exist_ok=True)
    (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    # render every cell, not only those in view (JupyterLab 4 windows long notebooks), so each plot gets laid out
    (settings / "notebook-extension").mkdir(parents=True, exist_ok=True)
    (settings / "notebook-extension" / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    port = _free_port()
    log_path = home / "lab.log"
    log = log_path.open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ServerApp.token=",
         "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True", "--ServerApp.ip=127.0.0.1", "--allow-root",
         f"--ServerApp.root_dir={root}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_pinned(core))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not start; its log:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def copy_notebooks(paths: list[Path], root: Path) -> list[str]:
    """Copy notebooks (and what they open beside them) under ``root``, keeping their folder; return their paths."""
    names = []
    for path in paths:
        folder = root / path.parent.name
        if not folder.exists():
            shutil.copytree(path.parent, folder, ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints"))
        shutil.copy(path, folder / path.name)
        names.append(f"{path.parent.name}/{path.name}")
    return names


def launch(playwright, core: int | None = None):
    """Headless Chromium (pinned to ``core`` when given, to share the loaded core too)."""
    args = list(FLAGS)
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=args)
    if core is not None:
        for pid in _chromium_pids():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(pid, {core})
    return browser


def _chromium_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "cmdline").read_bytes().split(b"\0")[0].endswith(b"chromium") and \
                        os.getpid() in _ancestors(int(entry.name)):
                    pids.append(int(entry.name))
    return pids


def _ancestors(pid: int) -> list[int]:
    chain = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        while pid > 1:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
            chain.append(pid)
    return chain


def kernel_idle(page, timeout_ms: int = 300_000) -> None:
    """The notebook's kernel is connected (not "No Kernel", which also reads idle) and idle."""
    page.wait_for_function(
        "() => { const e = document.querySelector('.jp-Notebook-ExecutionIndicator');"
        " const name = document.querySelector('.jp-KernelName');"
        " const cell = document.querySelector('.jp-Notebook .jp-Cell');"
        " return e && e.getAttribute('data-status') === 'idle' && name && !/No Kernel/i.test(name.textContent)"
        " && cell && cell.offsetParent !== null; }", timeout=timeout_ms)


def open_notebook(page, url: str, name: str, timeout_s: float = 300) -> None:
    """Open a notebook and wait for its kernel to be idle, accepting a kernel dialog whenever it shows."""
    page.goto(f"{url}/lab/tree/{name}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=timeout_s * 1000)
    start = time.monotonic()
    while True:
        accept_dialog(page)
        with contextlib.suppress(Exception):
            kernel_idle(page, 5_000)
            if not accept_dialog(page):
                return
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"the kernel of {name} was not idle after {timeout_s:.0f} s")


def prompts(page) -> list[str]:
    return page.eval_on_selector_all(".jp-CodeCell .jp-InputPrompt", "els => els.map(e => e.textContent.trim())")


def accept_dialog(page) -> bool:
    """Accept a dialog JupyterLab put up (a fresh server may ask which kernel to use, late on a loaded machine)."""
    button = page.query_selector(".jp-Dialog .jp-mod-accept")
    if button is None:
        return False
    with contextlib.suppress(Exception):
        button.click(timeout=10_000)
    return True


DONE_JS = """() => {
  if (document.querySelector(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")) return 'error';
  const ps = Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')).map(e => e.textContent.trim());
  const idle = (document.querySelector('.jp-Notebook-ExecutionIndicator') || {getAttribute: () => ''})
               .getAttribute('data-status') === 'idle' && !document.querySelector('.jp-Dialog');
  return ps.length && ps.every(p => /^\\[\\d+\\]:?$/.test(p)) && idle ? 'done' : '';
}"""


def run_all(page, timeout_s: float = 900) -> float:
    """Run > Run All Cells, then wait until every cell has run and the kernel is idle (or a cell failed: Run All
    stops there); return the wall time."""
    start = time.monotonic()
    accept_dialog(page)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_text("Run All Cells", exact=True).click()
    while True:
        state = ""
        with contextlib.suppress(Exception):   # a poll: returns as soon as the notebook is done, or after 5 s
            state = page.wait_for_function(DONE_JS, timeout=5_000).json_value()
        if state == "error":
            error = page.query_selector(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")
            raise AssertionError(f"a cell failed during Run All:\n{error.inner_text()[-3000:]}")
        if state == "done":
            return time.monotonic() - start
        accept_dialog(page)
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"Run All did not finish in {timeout_s:.0f} s; prompts: {prompts(page)}")


def view_count(page) -> int:
    return page.evaluate(f"() => ({VIEWS_JS})().length")


def view_state(page, index: int) -> dict[str, Any]:
    """The caption text and the drawn figure of the index-th view."""
    return page.evaluate(
        f"i => {{ const v = ({VIEWS_JS})()[i]; const gd = v.querySelector('.js-plotly-plot');"
        f" return {{caption: v.querySelector(':scope > .widget-html').innerText.trim(),"
        f" figure: ({DIGEST_JS})(gd)}}; }}", index)


def wait_for_plots(page, timeout_ms: int = 300_000) -> None:
    """Every view has drawn a plot holding data."""
    page.wait_for_function(
        f"() => ({VIEWS_JS})().every(v => {{ const gd = v.querySelector('.js-plotly-plot');"
        " return gd && gd.data && gd.data.length; })", timeout=timeout_ms)


@dataclass
class Move:
    """One control moved: what it was, and whether the caption and the plot followed."""

    view: int
    control: str
    caption_changed: bool
    figure_changed: bool
    seconds: float


@dataclass
class ViewReport:
    view: int
    caption: str
    moves: list[Move] = field(default_factory=list)

    @property
    def frozen(self) -> bool:
        """The caption followed the controls and the plot never did (a control may leave a plot as it was, e.g. an
        LX size a small model never fills; a frozen plot follows none)."""
        return any(m.caption_changed for m in self.moves) and not self.moved

    @property
    def moved(self) -> bool:
        return any(m.figure_changed for m in self.moves)


# the controls of the index-th view, each as [kind, label, locator index within kind]
CONTROLS_JS = f"""i => {{
  const v = ({VIEWS_JS})()[i];
  const row = v.querySelector(':scope > .widget-hbox');
  if (!row) return [];
  const out = [];
  row.querySelectorAll('.widget-play').forEach((e, k) => out.push(['play', 'play', k]));
  const label = (e, d) => (e.querySelector('.widget-label') || {{}}).innerText || d;
  row.querySelectorAll('.widget-slider, .widget-hslider').forEach((e, k) => {{
      if (e.querySelector('.noUi-handle') && !e.querySelector('[disabled]'))
        out.push(['slider', label(e, 'slider'), k]); }});
  row.querySelectorAll('.widget-dropdown').forEach((e, k) => {{ const s = e.querySelector('select');
      if (s && !s.disabled && s.options.length > 1) out.push(['dropdown', label(e, 'dropdown'), k]); }});
  row.querySelectorAll('.widget-toggle-buttons').forEach((e, k) => {{
      if (e.querySelector('button:not(.mod-active):not([disabled])')) out.push(['toggles', label(e, 'toggle'), k]); }});
  row.querySelectorAll(':scope > .widget-toggle-button').forEach((e, k) => out.push(['toggle', e.innerText.trim(), k]));
  row.querySelectorAll('.widget-checkbox').forEach((e, k) => out.push(['checkbox', e.innerText.trim(), k]));
  return out;
}}"""


def _act(page, index: int, kind: str, k: int) -> None:
    handle = page.evaluate_handle(f"i => ({VIEWS_JS})()[i].querySelector(':scope > .widget-hbox')", index)
    box = handle.as_element()
    if kind == "slider":
        knob = box.query_selector_all(".widget-slider .noUi-handle, .widget-hslider .noUi-handle")[k]
        knob.scroll_into_view_if_needed()
        knob.focus()
        at_end = knob.get_attribute("aria-valuenow") == knob.get_attribute("aria-valuemax")
        page.keyboard.press("ArrowLeft" if at_end else "ArrowRight")
    elif kind == "dropdown":
        select = box.query_selector_all(".widget-dropdown select")[k]
        current = select.evaluate("s => s.selectedIndex")
        count = select.evaluate("s => s.options.length")
        select.select_option(index=(current + 1) % count)
    elif kind == "toggles":
        group = box.query_selector_all(".widget-toggle-buttons")[k]
        group.query_selector("button:not(.mod-active):not([disabled])").click()
    elif kind == "toggle":
        box.query_selector_all(":scope > .widget-toggle-button")[k].click()
    elif kind == "checkbox":
        box.query_selector_all(".widget-checkbox input")[k].click()
    elif kind == "play":
        box.query_selector_all(".widget-play")[k].query_selector_all("button")[0].click()   # play
    else:
        raise ValueError(kind)


def move_every_control(page, index: int, respond_ms: int = 120_000, settle_ms: int = 30_000) -> ViewReport:
    """Move each control of the index-th view once; after each, wait for the caption or the plot to change, then
    give the plot ``settle_ms`` to follow the caption (it never needs it unless it is frozen)."""
    report = ViewReport(index, view_state(page, index)["caption"])
    for kind, label, k in page.evaluate(CONTROLS_JS, index):
        before = view_state(page, index)
        start = time.monotonic()
        _act(page, index, kind, k)
        check = (f"([i, before]) => {{ const v = ({VIEWS_JS})()[i];"
                 f" const now = {{caption: v.querySelector(':scope > .widget-html').innerText.trim(),"
                 f" figure: ({DIGEST_JS})(v.querySelector('.js-plotly-plot'))}};"
                 " return JSON.stringify(now.figure) !== JSON.stringify(before.figure) ? 2"
                 " : (now.caption !== before.caption ? 1 : 0); }")
        with contextlib.suppress(Exception):
            page.wait_for_function(check, arg=[index, before], timeout=respond_ms)
        with contextlib.suppress(Exception):
            page.wait_for_function(f"a => ({check})(a) === 2", arg=[index, before], timeout=settle_ms)
        if kind == "play":   # stop the animation where it is
            handle = page.evaluate_handle(f"i => ({VIEWS_JS})()[i].querySelector(':scope > .widget-hbox')", index)
            handle.as_element().query_selector_all(".widget-play")[k].query_selector_all("button")[1].click()
        kernel_idle(page)
        after = view_state(page, index)
        report.moves.append(Move(index, f"{kind} {label}".strip(), after["caption"] != before["caption"],
                                 json.dumps(after["figure"]) != json.dumps(before["figure"]),
                                 time.monotonic() - start))
    return report
