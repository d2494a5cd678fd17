"""Serving a fleet: round-robin vs least-queue vs prefix-aware routing over engine replicas, in one run.

    .venv/bin/python benchmarks/bench_serving.py [--replicas 3] [--requests 120] [--rate 12] [SECTION ...]

Starts ``--replicas`` `spyre-lab serve` processes (tiny-granite, cpu platform, 127.0.0.1, each with a small KV
cache of ``--num-kv-blocks`` blocks so that not every system prompt fits on every replica), then for each
section and each policy: clears the replicas' prefix caches (``POST /reset_prefix_cache``), starts a router
with that policy, sends the same workload at Poisson arrivals (``--rate`` requests/s, at most 32 in flight,
every request streamed, ``--max-tokens`` tokens, ``ignore_eos``) and reports, measured on this machine's wall
clock: output tokens/s, TTFT and ITL p50/p99, the prefix-cache hit rate the replicas counted
(``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``) and the requests each replica served.

1. shared-prefix     ``--prefixes`` system prompts x many users: what prefix-aware routing is for;
2. no-shared-prefix  the control: prompts of the same lengths sharing nothing (routing cannot help the cache).

Everything is bounded (request count, in-flight cap, per-run timeout) and every server stops at the end.
``--out FILE`` saves the whole run as JSON (what ``spyre_lab.viz.RouterView`` draws).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from sections import chosen, parser

from spyre_lab.serving import ServerProcess
from spyre_lab.serving.load import run_load, shared_prefix_workload, summarize, unique_prefix_workload
from spyre_lab.serving.router.run import RouterThread, make_router

POLICY_ORDER = ("round-robin", "least-queue", "prefix-aware")


def run_section(name: str, workload: list[dict], replicas: list[str], args, record: dict) -> list[dict]:
    """Every policy on one workload (cold prefix caches each time); one summary row per policy."""
    rows = []
    for policy in POLICY_ORDER:
        for url in replicas:
            httpx.post(f"{url}/reset_prefix_cache", timeout=10).raise_for_status()
        router = make_router(replicas, policy, seed=args.seed)
        with RouterThread(router, max_lifetime_s=args.timeout + 60) as thread:
            run = run_load(thread.url, workload, replicas, rate=args.rate, max_tokens=args.max_tokens,
                           timeout_s=args.timeout, seed=args.seed)
        run["decisions"] = router.decisions
        summary = summarize(run)
        record.setdefault(name, {})[policy] = {**run, "summary": summary}
        rows.append({"policy": policy, **summary})
    return rows


def print_rows(rows: list[dict], replicas: list[str]) -> None:
    names = [u.split("://")[1] for u in replicas]
    print(f"{'policy':>13} {'req':>4} {'err':>4} {'tok/s':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} "
          f"{'ITL p99':>8} {'hit rate':>8}  requests per replica")
    for row in rows:
        load = "/".join(str(row["per_replica"].get(n, 0)) for n in names)
        print(f"{row['policy']:>13} {row['requests']:4d} {row['errors']:4d} {row['tokens_per_s']:7.1f} "
              f"{row['ttft_p50_ms']:7.1f}ms {row['ttft_p99_ms']:7.1f}ms {row['itl_p50_ms']:6.2f}ms "
              f"{row['itl_p99_ms']:6.1f}ms {row['prefix_hit_rate']:8.1%}  {load}")
    by = {r["policy"]: r for r in rows}
    rr, pa = by["round-robin"], by["prefix-aware"]
    print(f"  prefix-aware vs round-robin: hit rate {pa['prefix_hit_rate']:.1%} vs {rr['prefix_hit_rate']:.1%} "
          f"({(pa['prefix_hit_rate'] - rr['prefix_hit_rate']) * 100:+.1f} points); TTFT p50 {pa['ttft_p50_ms']:.1f} "
          f"vs {rr['ttft_p50_ms']:.1f} ms wall ({pa['ttft_p50_ms'] / rr['ttft_p50_ms']:.2f}x)")


def shared_prefix(args) -> list[dict]:
    """--prefixes system prompts shared by many users (prefix-aware routing's case)"""
    return shared_prefix_workload(args.requests, args.prefixes, seed=args.seed)


def no_shared_prefix(args) -> list[dict]:
    """the control: prompts of the same lengths, none sharing a prefix with another"""
    return unique_prefix_workload(args.requests, seed=args.seed + 1)


def main() -> int:
    sections = {"shared-prefix": shared_prefix, "no-shared-prefix": no_shared_prefix}
    p = parser(__doc__, sections)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--requests", type=int, default=120, help="requests per policy and section")
    p.add_argument("--rate", type=float, default=12.0, help="Poisson arrival rate, requests/s")
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--prefixes", type=int, default=8, help="system prompts of the shared-prefix workload")
    p.add_argument("--num-kv-blocks", type=int, default=40, help="KV blocks per replica (16 tokens each)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds one policy's run may take at most")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="save the run as JSON (for RouterView)")
    args = p.parse_args()
    names = chosen(args.sections, sections)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    flags = ["--max-model-len", "256", "--num-kv-blocks", str(args.num_kv_blocks), "--max-num-seqs", "16"]
    record: dict = {"config": {k: v for k, v in vars(args).items() if k != "sections"}, "runs": {}}
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(args.replicas) as pool:
        starting = [pool.submit(ServerProcess, "tiny-granite", options=flags, max_lifetime_s=1800)
                    for _ in range(args.replicas)]
        replicas = [stack.enter_context(f.result(timeout=300)).url for f in starting]
        record["config"]["replicas"] = [u.split("://")[1] for u in replicas]
        for name in names:
            workload = sections[name](args)
            print(f"\n== {name}: {args.requests} requests at {args.rate:g}/s Poisson, {args.replicas} replicas, "
                  f"{args.num_kv_blocks} KV blocks each (times are wall clock on this machine)", flush=True)
            print_rows(run_section(name, workload, replicas, args, record["runs"]), replicas)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record))
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
