"""The `spyre-lab serve` and `spyre-lab route` command lines (argparse only: importing this module is cheap)."""

from __future__ import annotations

import argparse

POLICIES = ("prefix-aware", "least-queue", "round-robin")


def _engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--platform", default="cpu", help="engine platform: cpu or spyre (default: cpu)")
    parser.add_argument("--max-num-seqs", type=int, default=16, help="requests batched in one decode step")
    parser.add_argument("--max-model-len", type=int, default=None, help="prompt + output tokens of one request")
    parser.add_argument("--num-kv-blocks", type=int, default=None, help="KV-cache blocks (default: all fit)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    parser.add_argument("--no-prefix-caching", action="store_true", help="turn the engine's prefix cache off")


def _lifetime_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--max-lifetime-s", type=float, default=None, help="stop by itself after this many seconds")
    parser.add_argument("--exit-with-parent", action="store_true", help="stop when the starting process exits")


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default="tiny-granite", help="embedded model name or a HF folder")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None, help="the model id clients send (default: MODEL)")
    _engine_arguments(parser)
    _lifetime_arguments(parser)


def add_route_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default="tiny-granite", help="the model the replicas serve")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--replica", action="append", default=[], metavar="URL",
                        help="a running replica's base URL (repeat); without any, --num-replicas are started")
    parser.add_argument("--num-replicas", type=int, default=3, help="replicas to start when no --replica is given")
    parser.add_argument("--replica-platforms", default=None,
                        help="comma-separated platform per started replica, e.g. cpu,cpu,spyre (default: --platform)")
    parser.add_argument("--policy", choices=POLICIES, default="prefix-aware",
                        help="prefix-aware: llm-d's filter -> weighted scorers -> max-score picker (default)")
    parser.add_argument("--config", default=None, help="an EndpointPickerConfig file (YAML or JSON)")
    _engine_arguments(parser)
    _lifetime_arguments(parser)


def engine_options(args: argparse.Namespace) -> dict:
    options = dict(platform=args.platform, max_num_seqs=args.max_num_seqs, block_size=args.block_size,
                   enable_prefix_caching=not args.no_prefix_caching)
    if args.max_model_len is not None:
        options["max_model_len"] = args.max_model_len
    if args.num_kv_blocks is not None:
        options["num_kv_blocks"] = args.num_kv_blocks
    return options


def main(args: argparse.Namespace) -> int:
    if args.command == "serve":
        from spyre_lab.serving.launcher import run_server

        run_server(args.model, args.port, args.host, args.served_model_name, args.max_lifetime_s,
                   args.exit_with_parent, **engine_options(args))
        return 0
    from spyre_lab.serving.router.run import run_router

    return run_router(args, engine_options(args))
