"""`rayledger bench WHICH`: one entry point over every layer's benchmark."""

from __future__ import annotations


def run(which: str, args) -> dict:
    quick = bool(getattr(args, "quick", False))
    if which == "store":
        from .bench import run_store_bench

        return run_store_bench(quick=quick, gib=getattr(args, "gib", 1.0))
    if which == "replication":
        from .bench_replication import run_replication_bench

        return run_replication_bench(entries=200_000 if quick else 2_000_000)
    if which == "group":
        from .bench_group import run as run_group

        return run_group(quick=quick)
    if which == "spark":
        from .spark import run_spark_bench

        return run_spark_bench(quick=quick)
    raise ValueError(f"unknown benchmark {which!r}")
