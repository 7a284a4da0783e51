"""`rayledger bench WHICH`: one entry point over every layer's benchmark."""

from __future__ import annotations

from rayledger.storage import LedgerError, ResponseCode


def group_options(args) -> dict:
    """The ``bench group`` flags as keyword arguments of ``bench_group.run``."""
    return {
        "clients": getattr(args, "clients", 4),
        "batch": getattr(args, "batch", 1000),
        "members": getattr(args, "members", 3),
        "threads": getattr(args, "threads", 64),
        "sync_flush": bool(getattr(args, "sync_flush", False)),
        "fast_path": {"on": True, "off": False}.get(getattr(args, "fast_path", None) or ""),
        "max_rounds": getattr(args, "max_rounds", None),
        "floor": not getattr(args, "no_floor", False),
        "floor_actors": getattr(args, "floor_actors", None) or "threaded",
    }


def run(which: str, args) -> dict:
    quick = bool(getattr(args, "quick", False))
    if getattr(args, "plot", None) and which != "group":
        raise LedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "--plot is for `bench group` only")
    if which == "store":
        from .store import run_store_bench

        return run_store_bench(quick=quick, gib=getattr(args, "gib", 1.0))
    if which == "replication":
        from .replication import run_replication_bench

        return run_replication_bench(entries=200_000 if quick else 2_000_000)
    if which == "group":
        from .group import run as run_group

        return run_group(
            quick=quick,
            plot=getattr(args, "plot", None),
            load_seconds=getattr(args, "load_seconds", None),
            **group_options(args),
        )
    if which == "peer":
        from .peer import run as run_peer

        return run_peer(quick=quick, **group_options(args))
    if which == "mq":
        from .mq import run as run_mq

        return run_mq(quick=quick, clients=getattr(args, "clients", 4))
    if which == "kv":
        from .kv import run as run_kv

        return run_kv(quick=quick, clients=getattr(args, "clients", 4),
                      batch=getattr(args, "batch", 1000), keys=getattr(args, "keys", None))  # fmt: skip
    if which == "membership":
        from .membership import run as run_membership

        return run_membership(quick=quick)
    if which == "core":
        from .core import run_core_bench

        return run_core_bench(cycles=10_000 if quick else 50_000)
    if which == "divergent":
        from .divergent import divergent_tail

        return divergent_tail(entries=10_000 if quick else 100_000)
    if which == "topic":
        from .topic import run as run_topic

        return run_topic(quick=quick, clients=getattr(args, "clients", 4),
                         batch=getattr(args, "batch", 1000))  # fmt: skip
    if which == "spark":
        from .spark import run_spark_bench

        return run_spark_bench(quick=quick)
    raise ValueError(f"unknown benchmark {which!r}")
