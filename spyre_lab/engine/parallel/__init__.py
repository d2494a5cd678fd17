"""Tensor parallelism: one worker process per card, each holding a shard of every weight and of the KV cache."""
