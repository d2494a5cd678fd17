"""The ``spyre-lab`` command: ``spyre-lab demo`` runs the main job and writes a report."""

from __future__ import annotations

import argparse
import sys

# the programs `spyre-lab compile` knows (spyre_lab/ktir/compile_examples.py; kept here so --help stays cheap)
COMPILE_EXAMPLES = ("softmax", "silu", "rms_norm", "mlp", "layer")


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and its flags (argparse only: building it imports nothing heavy)."""
    parser = argparse.ArgumentParser(
        prog="spyre-lab", description="spyre_lab: a modeled IBM Spyre device, compiler, runtime and engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the default model on the modeled device and print a report")
    demo.add_argument("--out", default="out", help="folder for trace.json and the report (default: out)")
    workshop = sub.add_parser("workshop", help="workshop material: `workshop build OUT` writes student and instructor "
                                                  "notebooks, `workshop grade SUBMISSIONS` grades submitted ones")
    from spyre_lab.workshop import add_arguments as _workshop_arguments

    _workshop_arguments(workshop)
    report = sub.add_parser("report", help="write one self-contained HTML file (out/report.html) with the figures "
                                           "of a run")
    report.add_argument("--out", default="out", help="folder of the run and of report.html (default: out)")
    report.add_argument("--no-run", action="store_true",
                        help="use only the files already in --out (by default a small job runs first if none is)")
    _add_reproduce(sub.add_parser("reproduce", help="the published Spyre claims against the model, each as an "
                                                    "ablation"))
    from spyre_lab.serving.cli_args import add_route_arguments, add_serve_arguments

    add_serve_arguments(sub.add_parser("serve", help="an OpenAI-compatible server (with vLLM's /metrics) for MODEL"))
    add_route_arguments(sub.add_parser("route", help="an llm-d-style router in front of engine replicas"))
    fid = sub.add_parser("fidelity", help="the model against measured and reference kernel times, on both machines")
    fid.add_argument("--json", action="store_true", help="print the result as JSON (schema spyre_lab.fidelity/1)")
    fid.add_argument("--markdown", action="store_true", help="print the Markdown of docs/fidelity.md")
    comp = sub.add_parser("compile", help="compile an example program and write each kernel as KTIR (one .mlir each)")
    comp.add_argument("--ktir", metavar="OUT", required=True, help="folder for the .mlir files")
    comp.add_argument("--example", default="softmax",
                      choices=COMPILE_EXAMPLES, help="which program (default: softmax)")
    return parser


def _add_reproduce(rep: argparse.ArgumentParser) -> None:
    rep.add_argument("--json", action="store_true", help="print the result as JSON (schema spyre_lab.reproduce/1)")
    rep.add_argument("--markdown", action="store_true", help="print the Markdown of docs/reproduce.md")
    rep.add_argument("--sweep", action="store_true", help="also sweep the unpublished device parameters")
    rep.add_argument("--full-depth", action="store_true", help="run all 40 layers instead of extending 2 and 3")
    rep.add_argument("--portable", action="store_true", help="also measure portable vs native layers (wall clock)")
    rep.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                     help="run the sweep on this Dask scheduler (default: a local cluster on this machine)")
    rep.add_argument("--workers", type=int, metavar="N", help="local cluster size for the sweep (default: cores, <= 4)")
    rep.add_argument("--fresh", action="store_true",
                     help="compute again even if this source's result is cached (results are cached by source hash)")
    rep.add_argument("--machine", choices=("measured", "datasheet"), default=None,
                     help="the modeled card: measured (fitted to the real card, default) or datasheet (peak numbers)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "compile":
        from spyre_lab.ktir.compile_examples import main as compile_main

        return compile_main(args.example, args.ktir)
    if args.command in ("serve", "route"):
        from spyre_lab.serving.cli_args import main as serving_main

        return serving_main(args)
    if args.command == "demo":
        from spyre_lab.demo import run_demo

        return run_demo(args.out)
    if args.command == "workshop" and args.workshop_command == "grade":
        from spyre_lab.workshop_grade import main as grade_main

        return grade_main(args)
    if args.command == "workshop":
        from spyre_lab.workshop import main as workshop_main

        return workshop_main(args)
    if args.command == "report":
        from spyre_lab.studies.fidelity import fidelity
        from spyre_lab.viz.report import write_report

        write_report(args.out, run=not args.no_run, fidelity=None if args.no_run else fidelity())
        return 0
    if args.command == "fidelity":
        from spyre_lab.studies.fidelity import main as fidelity_main

        return fidelity_main(args.json, args.markdown)
    if args.command == "reproduce":
        return _reproduce(args, argv)
    return 2


def _reproduce(args: argparse.Namespace, argv: list[str] | None) -> int:
    from spyre_lab.device.config import SPYRE

    if args.machine and args.machine != SPYRE.name:  # every layer binds its card at import: run afresh on the other
        return _rerun_on(args.machine, argv if argv is not None else sys.argv[1:])
    from spyre_lab.studies.reproduce import main as reproduce_main

    options = {k: v for k, v in vars(args).items() if k not in ("command", "machine")}   # flags = keywords
    return reproduce_main(**options)


def _rerun_on(machine: str, argv: list[str]) -> int:
    """This command again in a fresh interpreter whose default card is ``machine`` (``$SPYRE_LAB_MACHINE``)."""
    import os
    import subprocess

    env = dict(os.environ, SPYRE_LAB_MACHINE=machine)
    return subprocess.run([sys.executable, "-m", "spyre_lab.cli", *argv], env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
