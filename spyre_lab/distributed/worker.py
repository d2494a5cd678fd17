"""One rank of :func:`spyre_lab.distributed.launch.run_ranks`: rendezvous, run, write the result, tear down."""

from __future__ import annotations

import datetime
import json
import runpy
import sys
from pathlib import Path

import torch.distributed as dist

import spyre_lab.distributed  # noqa: F401  (registers spyreccl)


def main(spec_json: str, out_path: str) -> None:
    spec = json.loads(spec_json)
    rank, world = spec["rank"], spec["world_size"]
    function = runpy.run_path(spec["script"])[spec["function"]]
    store = dist.FileStore(spec["store"], world)
    dist.init_process_group(spec["backend"], store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=spec["timeout_s"]))
    try:
        result = function(rank, world, *spec["args"])
    finally:
        dist.destroy_process_group()
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
