"""Finding a platform by name: the built-in cpu and spyre, plus every installed plugin.

Platforms are discovered through the entry-point group ``spyre_lab.platform_plugins`` (as vLLM
uses ``vllm.platform_plugins``), so a third-party package can add one without touching spyre_lab.
The built-in two are listed here as well, so a source checkout that was never pip-installed finds them.
"""

from __future__ import annotations

import importlib.metadata

from spyre_lab.engine.platforms.base import Platform

PLUGIN_GROUP = "spyre_lab.platform_plugins"

BUILTIN = {
    "cpu": "spyre_lab.engine.platforms.cpu:CpuPlatform",
    "spyre": "spyre_lab.engine.platforms.spyre:SpyrePlatform",
}


def available_platforms() -> dict[str, importlib.metadata.EntryPoint]:
    """Name -> entry point for every platform plugin installed (plus the built-in cpu and spyre)."""
    found = {
        name: importlib.metadata.EntryPoint(name=name, value=value, group=PLUGIN_GROUP)
        for name, value in BUILTIN.items()
    }
    for entry_point in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        found[entry_point.name] = entry_point
    return found


def resolve_platform(platform: str | Platform, **options) -> Platform:
    """A Platform instance from a name (looked up in the plugin group) or an instance (returned as is)."""
    if isinstance(platform, Platform):
        if options:
            raise ValueError(f"platform options {sorted(options)} need a platform name, not an instance")
        return platform
    plugins = available_platforms()
    if platform not in plugins:
        raise ValueError(
            f"unknown platform {platform!r}; installed: {sorted(plugins)}. A package adds one with an entry point "
            f'in group "{PLUGIN_GROUP}", e.g. mine = "my_pkg.platform:MyPlatform"'
        )
    try:
        platform_class = plugins[platform].load()
    except ImportError as error:
        raise ValueError(f"platform {platform!r} is installed but cannot be imported: {error}") from error
    if not (isinstance(platform_class, type) and issubclass(platform_class, Platform)):
        raise ValueError(f"entry point {platform!r} must name a Platform subclass, got {platform_class!r}")
    return platform_class(**options)
