"""Design-space sweeps on Dask: one study evaluated at many device configurations, in parallel, cached.

``sweep(configs, study)`` runs ``study(SpyreConfig)`` once per configuration and returns a pandas
DataFrame, one row per configuration (its label, the value of every parameter any configuration
changes, then the study's outputs). Where it runs:

* by default on a ``distributed.LocalCluster`` of ``workers`` processes on this machine (127.0.0.1,
  no dashboard), started for the sweep and closed after it;
* ``scheduler="tcp://HOST:PORT"``: on the Dask cluster whose scheduler listens there (each worker
  needs this package importable, as ``pip install -e .[sweep]`` gives);
* ``scheduler=client``: on a ``distributed.Client`` the caller owns (it stays open);
* ``scheduler="in-process"``: a plain loop in this process, the reference the others must equal.

Every result is kept on disk per (source fingerprint, study, configuration): a sweep computes only the
configurations it has not seen from this exact code, so rerunning one, or growing it, is cheap. A study
is a picklable callable (a module-level function, or an object with a ``cache_key`` naming its data).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spyre_lab.device.config import SPYRE, SpyreConfig
from spyre_lab.studies.cache import cache_folder, read_json, source_fingerprint, write_json

if TYPE_CHECKING:
    import pandas

Changes = Mapping[str, float]
Study = Callable[[SpyreConfig], Mapping[str, Any]]
IN_PROCESS = "in-process"
TIMEOUT_S = 120.0
"""Longest wait for a cluster to start or a scheduler to answer (a sweep's own tasks may take longer)."""


def config_of(changes: Changes, base: SpyreConfig | None = None) -> SpyreConfig:
    """``base`` (the default machine when None) with ``changes`` applied, each value cast to its field's type."""
    base = SPYRE if base is None else base
    fields = {f.name for f in dataclasses.fields(SpyreConfig)}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise ValueError(f"unknown SpyreConfig field(s) {unknown}: a sweep changes SpyreConfig fields, such as "
                         f"{sorted(fields)[:6]} ... (see spyre_lab.device.config)")
    typed = {k: (int(v) if isinstance(getattr(base, k), int) and not isinstance(getattr(base, k), bool)
                 else type(getattr(base, k))(v)) for k, v in changes.items()}
    return base.replace(**typed)


def _label(changes: Changes) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, int | float) else f"{k}={v}" for k, v in changes.items()) \
        or "default"


def _points(configs: Sequence[Changes | tuple[str, Changes]]) -> list[tuple[str, dict[str, Any]]]:
    points = []
    for c in configs:
        label, changes = c if isinstance(c, tuple) else (None, c)
        if not isinstance(changes, Mapping):
            raise TypeError(f"a configuration is a dict of SpyreConfig changes or a (label, dict) pair, got {c!r}")
        config_of(changes)                                     # fail before any work starts
        points.append((label or _label(changes), dict(changes)))
    return points


def study_key(study: Study) -> str:
    """What names a study in the cache: its ``cache_key`` when it has one (a study carrying data), else its
    module and qualified name (a plain function)."""
    key = getattr(study, "cache_key", None)
    if key is None:
        module, name = getattr(study, "__module__", None), getattr(study, "__qualname__", None)
        if not module or not name or "<" in name:
            raise TypeError(f"{study!r} cannot be named in the cache: pass a module-level function, or give the "
                            "study a `cache_key` attribute (or pass cache=False)")
        key = f"{module}.{name}"
    return str(key)


def _config_key(changes: Changes) -> str:
    return json.dumps(sorted(changes.items()))


class SweepCache:
    """One study's results on one base machine under one source fingerprint: configuration -> outputs, one JSON
    file. The base is part of the name because a configuration is a set of changes to it: the same changes to
    ``measured`` and to ``datasheet`` are different machines."""

    def __init__(self, study: Study, folder: str | Path | None = None, base: SpyreConfig = SPYRE) -> None:
        name = hashlib.sha256(f"{study_key(study)}|{base!r}".encode()).hexdigest()[:12]
        self.path = cache_folder(folder) / "sweeps" / f"{source_fingerprint('sweep')}-{name}.json"
        self.results: dict[str, dict[str, Any]] = read_json(self.path) or {}
        self.dirty = False

    def get(self, changes: Changes) -> dict[str, Any] | None:
        return self.results.get(_config_key(changes))

    def put(self, changes: Changes, outputs: dict[str, Any]) -> None:
        self.results[_config_key(changes)] = outputs
        self.dirty = True

    def save(self) -> None:
        if self.dirty:
            write_json(self.path, self.results)
            self.dirty = False


def evaluate(changes: Changes, study: Study, base: SpyreConfig) -> dict[str, Any]:
    """One configuration's outputs (runs on a worker): ``study`` at ``base`` with ``changes``. The base travels
    with the task, so a worker whose own default machine differs (another ``SPYRE_LAB_MACHINE``) agrees."""
    out = study(config_of(changes, base))
    if not isinstance(out, Mapping):
        raise TypeError(f"a study returns a dict of outputs, {study_key(study)} returned {type(out).__name__}")
    return dict(out)


def sweep(configs: Sequence[Changes | tuple[str, Changes]], study: Study, *, scheduler: Any = None,
          workers: int = 2, progress: bool = True, cache: bool | str | Path = True,
          timeout: float = TIMEOUT_S, base: SpyreConfig | None = None) -> pandas.DataFrame:
    """``study`` at every configuration, on Dask; one DataFrame row per configuration, in the given order.

    ``configs``: dicts of ``SpyreConfig`` changes, or (label, dict) pairs. ``scheduler``: None (a local
    cluster of ``workers`` processes), ``"tcp://HOST:PORT"``, a ``distributed.Client`` or ``"in-process"``.
    ``cache``: True (the default folder), a folder, or False. ``base``: the machine the changes apply to (the
    default machine when None). ``df.attrs`` says how many rows came from the cache and the source
    fingerprint they belong to.
    """
    import pandas as pd

    base = SPYRE if base is None else base
    points = _points(configs)
    store = SweepCache(study, None if cache is True else cache, base) if cache else None
    outputs: list[dict[str, Any] | None] = [store.get(c) if store else None for _, c in points]
    missing = [i for i, o in enumerate(outputs) if o is None]
    try:
        for i, out in _run(study, base, [points[i][1] for i in missing], scheduler, workers, progress, timeout):
            outputs[missing[i]] = out
            if store:
                store.put(points[missing[i]][1], out)
    finally:
        if store:
            store.save()
    swept = list(dict.fromkeys(k for _, c in points for k in c))
    rows = [{"label": label, **{k: changes.get(k, getattr(base, k)) for k in swept}, **out}
            for (label, changes), out in zip(points, outputs, strict=True)]
    frame = pd.DataFrame(rows)
    frame.attrs.update(cached=len(points) - len(missing), computed=len(missing),
                       source=source_fingerprint("sweep"), parameters=swept, machine=base.name)
    return frame


def _run(study: Study, base: SpyreConfig, changes: list[dict[str, Any]], scheduler: Any, workers: int,
         progress: bool, timeout: float):
    """Yield (index into ``changes``, outputs) as each configuration finishes, wherever ``scheduler`` says."""
    from tqdm.auto import tqdm

    if not changes:
        return
    with tqdm(total=len(changes), desc="sweep", unit="config", disable=not progress) as bar:
        if scheduler == IN_PROCESS:
            for i, c in enumerate(changes):
                yield i, evaluate(c, study, base)
                bar.update(1)
            return
        with _client(scheduler, workers, timeout) as client:
            from distributed import as_completed

            shared = client.scatter(study, broadcast=True, hash=False)   # sent to each worker once, not per task
            futures = client.map(evaluate, changes, study=shared, base=base, pure=False)
            index = {f.key: i for i, f in enumerate(futures)}
            for future in as_completed(futures):
                yield index[future.key], future.result()
                bar.update(1)


class _client:
    """A Dask client for ``scheduler``; whatever this opened (client, local cluster) is closed on exit."""

    def __init__(self, scheduler: Any, workers: int, timeout: float) -> None:
        self.scheduler, self.workers, self.timeout = scheduler, workers, timeout
        self.owned: list[Any] = []

    def __enter__(self) -> Any:
        from distributed import Client, LocalCluster

        if isinstance(self.scheduler, Client):
            return self.scheduler
        if isinstance(self.scheduler, str):
            if not self.scheduler.startswith(("tcp://", "tls://", "inproc://", "ws://", "wss://")):
                raise ValueError(f"scheduler {self.scheduler!r}: give a Dask scheduler address such as "
                                 f"tcp://HOST:8786, or {IN_PROCESS!r} to run in this process")
            client = Client(self.scheduler, timeout=self.timeout)
        elif self.scheduler is None:
            if self.workers < 1:
                raise ValueError(f"workers must be at least 1, got {self.workers}")
            cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address=None, env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
            self.owned.append(cluster)
            client = Client(cluster, timeout=self.timeout)
        else:
            raise TypeError(f"scheduler must be None, an address, a distributed.Client or {IN_PROCESS!r}; "
                            f"got {self.scheduler!r}")
        self.owned.insert(0, client)
        return client

    def __exit__(self, *exc: object) -> None:
        for thing in self.owned:
            thing.close()
