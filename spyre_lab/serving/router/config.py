"""EndpointPickerConfig: the router's pipeline as a file in the shape llm-d's endpoint picker reads.

    apiVersion: inference.networking.x-k8s.io/v1alpha1
    kind: EndpointPickerConfig
    plugins:                      # every plugin instance: a type, an optional name, optional parameters
    - type: healthy-filter
    - type: queue-scorer
    - type: kv-cache-utilization-scorer
    - type: prefix-cache-scorer
      parameters: {hashBlockSize: 16, maxPrefixBlocksToMatch: 256, lruCapacityPerServer: 31250}
    - type: max-score-picker
    schedulingProfiles:           # which plugins a profile runs, scorers with their weights
    - name: default
      plugins:
      - pluginRef: healthy-filter
      - pluginRef: queue-scorer
        weight: 2
      - pluginRef: kv-cache-utilization-scorer
        weight: 2
      - pluginRef: prefix-cache-scorer
        weight: 3
      - pluginRef: max-score-picker

That is the ``prefix-aware`` policy (llm-d's default weights). ``least-queue`` keeps only the queue scorer and
``round-robin`` replaces scorers and picker by ``round-robin-picker``: three configs of one pipeline, for the
ablation. spyre_lab runs one profile (the first; llm-d's single-profile handler).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spyre_lab.serving.router.scheduler import PLUGIN_TYPES, SchedulingProfile

KIND = "EndpointPickerConfig"


def _policy(plugins: list[tuple[str, float | None]], parameters: dict[str, dict] | None = None) -> dict[str, Any]:
    parameters = parameters or {}
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": KIND,
        "plugins": [{"type": t, **({"parameters": parameters[t]} if t in parameters else {})} for t, _ in plugins],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": t, **({"weight": w} if w is not None else {})} for t, w in plugins]}],
    }


POLICIES: dict[str, dict[str, Any]] = {
    "prefix-aware": _policy([("healthy-filter", None), ("queue-scorer", 2), ("kv-cache-utilization-scorer", 2),
                             ("prefix-cache-scorer", 3), ("max-score-picker", None)],
                            {"prefix-cache-scorer": {"hashBlockSize": 16, "maxPrefixBlocksToMatch": 256,
                                                     "lruCapacityPerServer": 31_250}}),
    "least-queue": _policy([("healthy-filter", None), ("queue-scorer", 1), ("max-score-picker", None)]),
    "round-robin": _policy([("healthy-filter", None), ("round-robin-picker", None)]),
}


def load_config(source: str | Path | dict[str, Any]) -> dict[str, Any]:
    """A config dict from a policy name, a YAML/JSON file or a dict; ValueError naming what is wrong."""
    if isinstance(source, dict):
        return source
    if str(source) in POLICIES:
        return POLICIES[str(source)]
    path = Path(source)
    if not path.exists():
        raise ValueError(f"{source!r} is neither a policy ({', '.join(POLICIES)}) nor an EndpointPickerConfig file")
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    import yaml

    return yaml.safe_load(text)


def build_profile(config: dict[str, Any], seed: int | None = None) -> SchedulingProfile:
    """The first scheduling profile of ``config``, its plugins instantiated with their parameters."""
    if config.get("kind") != KIND:
        raise ValueError(f"kind must be {KIND!r}, got {config.get('kind')!r}")
    instances: dict[str, Any] = {}
    for entry in config.get("plugins") or []:
        kind = entry.get("type")
        if kind not in PLUGIN_TYPES:
            raise ValueError(f"unknown plugin type {kind!r}; the types are {sorted(PLUGIN_TYPES)}")
        name = entry.get("name", kind)
        parameters = dict(entry.get("parameters") or {})
        if kind == "max-score-picker":
            parameters.setdefault("seed", seed)
        try:
            instances[name] = PLUGIN_TYPES[kind](name=name, **parameters)
        except TypeError as error:
            raise ValueError(f"plugin {name!r}: {error}") from None
    profiles = config.get("schedulingProfiles") or []
    if not profiles:
        raise ValueError("schedulingProfiles is empty; give one profile that lists its plugins")
    profile = profiles[0]
    filters, scorers, picker = [], [], None
    for ref in profile.get("plugins") or []:
        name = ref.get("pluginRef")
        if name not in instances:
            raise ValueError(f"profile {profile.get('name')!r} refers to {name!r}, which plugins does not define")
        plugin = instances[name]
        if hasattr(plugin, "filter"):
            filters.append(plugin)
        elif hasattr(plugin, "score"):
            weight = ref.get("weight", 1)
            if not isinstance(weight, int | float) or weight < 0:
                raise ValueError(f"weight of {name!r} must be a number >= 0, got {weight!r}")
            scorers.append((plugin, float(weight)))
        else:
            picker = plugin
    return SchedulingProfile(profile.get("name", "default"), filters, scorers, picker)
