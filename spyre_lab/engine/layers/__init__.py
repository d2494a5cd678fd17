"""Portable layers: plain-torch building blocks a model is written in, which a platform may replace (CustomOp)."""
