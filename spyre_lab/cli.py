"""The ``spyre-lab`` command: ``spyre-lab demo`` runs the main job and writes a report."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spyre-lab", description="spyre_lab: a modeled IBM Spyre device, compiler, runtime and engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the default model on the modeled device and print a report")
    demo.add_argument("--out", default="out", help="folder for trace.json and the report (default: out)")
    workshop = sub.add_parser("workshop", help="workshop material: `workshop build OUT` writes student notebooks")
    from spyre_lab.workshop import add_arguments as _workshop_arguments

    _workshop_arguments(workshop)
    report = sub.add_parser("report", help="write one self-contained HTML file (out/report.html) with the figures "
                                           "of a run")
    report.add_argument("--out", default="out", help="folder of the run and of report.html (default: out)")
    report.add_argument("--no-run", action="store_true",
                        help="use only the files already in --out (by default a small job runs first if none is)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from spyre_lab.demo import run_demo

        return run_demo(args.out)
    if args.command == "workshop":
        from spyre_lab.workshop import main as workshop_main

        return workshop_main(args)
    if args.command == "report":
        from spyre_lab.viz.report import write_report

        write_report(args.out, run=not args.no_run)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
