"""Benchmarks, one module per layer (store, replication, group, peer, spark); ``run`` is the entry point."""

from .run import run

__all__ = ["run"]
