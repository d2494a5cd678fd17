"""Measure what a learner meets: Run All in JupyterLab on a loaded core, then every control of every view moved.

For each notebook, ``--passes`` times (default 5): a fresh kernel, Run > Run All Cells with a CPU hog pinned to the
kernel's core (``--pin-browser``: the browser shares it too), then each control of each view moved once. A view is
*moved* in a pass when a control changed its plot; *frozen* when its caption followed the controls and its plot
followed none of them (the symptom of a plot that stopped receiving the kernel's updates). Prints a
table per notebook: views, views moved / frozen over all passes, the Run-All wall time (median, max), and how many
times the browser logged anywidget's set-up timeout. For measurement, not CI (the browser test is
``tests/browser/test_jupyterlab.py``).

    python scripts/check_views_in_browser.py                         # every tutorial and notebook
    python scripts/check_views_in_browser.py tutorials/04_work_division.ipynb notebooks/playground.ipynb
    python scripts/check_views_in_browser.py --passes 1 --no-load tests/browser/all_views.ipynb
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIN_BROWSER = False   # --pin-browser: the browser shares the loaded core too (a slow learner laptop)
sys.path.insert(0, str(ROOT / "tests" / "browser"))

import labdriver  # noqa: E402


def _shutdown_kernels(url: str) -> None:
    """Every kernel and session stopped, so the next pass starts a fresh kernel."""
    for what in ("sessions", "kernels"):
        with urllib.request.urlopen(f"{url}/api/{what}", timeout=30) as response:
            for item in json.loads(response.read()):
                request = urllib.request.Request(f"{url}/api/{what}/{item['id']}", method="DELETE")
                urllib.request.urlopen(request, timeout=60).close()


def one_pass(playwright, url: str, name: str, core: int | None) -> dict:
    browser = labdriver.launch(playwright, core if PIN_BROWSER else None)
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    page.set_default_timeout(300_000)
    failures = []
    page.on("console", lambda m: failures.append(m.text) if labdriver.ANYWIDGET_FAILURE in m.text else None)
    page.on("pageerror", lambda e: failures.append(str(e)) if labdriver.ANYWIDGET_FAILURE in str(e) else None)
    try:
        labdriver.open_notebook(page, url, name)
        wall = labdriver.run_all(page)
        labdriver.wait_for_plots(page)
        reports = [labdriver.move_every_control(page, i) for i in range(labdriver.view_count(page))]
    finally:
        browser.close()
        _shutdown_kernels(url)
    return {"wall_s": wall, "views": len(reports), "moved": sum(r.moved for r in reports),
            "frozen": sum(r.frozen for r in reports), "anywidget_timeouts": len(failures),
            "frozen_views": [r.caption[:60] for r in reports if r.frozen],
            "moves": [m.__dict__ for r in reports for m in r.moves]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="notebooks (default: every one in tutorials/ and notebooks/)")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--core", type=int, default=0, help="the core the kernel, the browser and the hog share")
    parser.add_argument("--no-load", action="store_true", help="no CPU hog and no pinning")
    parser.add_argument("--pin-browser", action="store_true", help="pin the browser to the loaded core as well")
    parser.add_argument("--json", type=Path, help="also write every pass's details here")
    parser.add_argument("--source", type=Path, default=ROOT, help="the checkout whose spyre_lab the kernels import")
    args = parser.parse_args(argv)
    # a timeout's SIGTERM still stops the hog, the server and the browser this script started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    reason = labdriver.missing()
    if reason:
        raise SystemExit(reason)
    given = [Path(p).resolve() for p in args.paths] or [ROOT / "tutorials", ROOT / "notebooks"]
    paths = [n for p in given for n in (sorted(p.glob("*.ipynb")) if p.is_dir() else [p])]
    core = None if args.no_load else args.core
    global PIN_BROWSER
    PIN_BROWSER = args.pin_browser
    from playwright.sync_api import sync_playwright

    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root, home = Path(tmp) / "root", Path(tmp) / "home"
        root.mkdir()
        names = labdriver.copy_notebooks(paths, root)
        lab = labdriver.jupyterlab(root, home, core, args.source.resolve())
        with lab as url, labdriver.cpu_hog(core), sync_playwright() as p:
            for name in names:
                results[name] = []
                for n in range(args.passes):
                    start = time.monotonic()
                    try:
                        result = one_pass(p, url, name, core)
                    except Exception as error:  # a pass that could not finish is reported, not hidden
                        result = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
                    result["pass_s"] = time.monotonic() - start
                    results[name].append(result)
                    print(f"{name} pass {n + 1}: {json.dumps({k: v for k, v in result.items() if k != 'moves'})}",
                          flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(f"\n{'notebook':<36} {'views':>5} {'moved':>7} {'frozen':>7} {'Run-All s (median/max)':>24} "
          f"{'anywidget timeouts':>19} {'errors':>6}")
    bad = 0
    for name, runs in results.items():
        ok = [r for r in runs if "error" not in r]
        views = max((r["views"] for r in ok), default=0)
        moved = sum(r["moved"] for r in ok)
        frozen = sum(r["frozen"] for r in ok)
        walls = [r["wall_s"] for r in ok]
        wall = f"{statistics.median(walls):.0f} / {max(walls):.0f}" if walls else "-"
        total = views * len(ok)
        bad += frozen + (len(runs) - len(ok))
        print(f"{name:<36} {views:>5} {moved:>3}/{total:<3} {frozen:>3}/{total:<3} {wall:>24} "
              f"{sum(r['anywidget_timeouts'] for r in ok):>19} {len(runs) - len(ok):>6}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
