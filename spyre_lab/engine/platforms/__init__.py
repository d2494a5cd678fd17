"""Platforms: the only engine code that knows a device; each registers its layer replacements (see base.py)."""
