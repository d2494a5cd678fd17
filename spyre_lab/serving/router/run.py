"""Running the router: `spyre-lab route` (replicas it starts or URLs it is given) and :class:`RouterThread`."""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spyre_lab.serving.launcher import LOCALHOST, ServerProcess, ServesOnThread, make_uvicorn, watch_in_thread
from spyre_lab.serving.router.app import Router
from spyre_lab.serving.router.config import POLICIES, build_profile, load_config


def make_router(replica_urls: list[str], policy: str | Path | dict[str, Any] = "prefix-aware",
                model: str = "tiny-granite", seed: int | None = 0, scrape_interval_s: float = 0.05) -> Router:
    """A Router over ``replica_urls`` with a policy name, an EndpointPickerConfig file or a config dict."""
    name = str(policy) if isinstance(policy, str) and policy in POLICIES else "custom"
    profile = build_profile(load_config(policy), seed=seed)
    return Router(replica_urls, profile, model, name, scrape_interval_s)


@dataclass
class RouterThread(ServesOnThread):
    """A router on a thread of this process (its own event loop and port); stops after ``max_lifetime_s``."""

    router: Router
    port: int = 0
    max_lifetime_s: float | None = 600.0
    host: str = LOCALHOST

    def __post_init__(self) -> None:
        self._serve(self.router.app(), "router")


def run_router(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """`spyre-lab route`: start the replicas unless given (with engine ``options``), then serve the router."""
    with contextlib.ExitStack() as stack:
        urls = list(args.replica)
        if not urls:
            platforms = (args.replica_platforms or args.platform).split(",")
            if len(platforms) == 1:
                platforms *= args.num_replicas
            if len(platforms) != args.num_replicas:
                raise SystemExit(f"--replica-platforms names {len(platforms)} platforms for {args.num_replicas} "
                                 "replicas; give one, or one per replica")
            flags = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()
                     if k not in ("platform", "enable_prefix_caching")]
            flags += [] if options["enable_prefix_caching"] else ["--no-prefix-caching"]
            for platform in platforms:
                replica = ServerProcess(args.model, platform=platform, options=flags,
                                        max_lifetime_s=args.max_lifetime_s or 24 * 3600)
                stack.enter_context(replica)
                urls.append(replica.url)
                print(f"replica {replica.url} ({platform})", flush=True)
        router = make_router(urls, args.config or args.policy, args.model)
        server = make_uvicorn(router.app(), args.host, args.port)
        watch_in_thread(server, args.max_lifetime_s, args.exit_with_parent)
        print(f"router http://{args.host}:{args.port} ({router.policy}) over {len(urls)} replicas", flush=True)
        server.run()
    return 0
