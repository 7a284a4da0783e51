"""Every private Ray API rayledger uses, in one place, behind a version check.

Ray's private names (compiled-graph internals, underscore compile options, the GCS
key-value store) change between releases without notice.  rayledger is tested with one
Ray (:data:`TESTED_RAY`); the first use of a private API checks the installed one and
stops with a clear ``UNSUPPORTED`` error when it differs, rather than failing later in
an obscure way.  ``RAYLEDGER_ALLOW_UNTESTED_RAY=1`` lets a user try another Ray anyway
(a warning is logged once).

Users of these APIs: the compiled steady-state path (:mod:`.fastpath`: loop registry,
compile options) and injected link faults that follow a member across restarts
(:mod:`.faults`: the GCS key-value store).  Plain actor calls use only public Ray.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from rayledger.storage import LedgerError, ResponseCode

log = logging.getLogger("rayledger.actors")

TESTED_RAY = "2.60.0"
ALLOW_ENV = "RAYLEDGER_ALLOW_UNTESTED_RAY"

_checked = False


def check_ray_version(version: str | None = None) -> None:
    """Raise ``UNSUPPORTED`` unless the installed Ray (or ``version``) is the tested one,
    or the user allowed another one with ``RAYLEDGER_ALLOW_UNTESTED_RAY=1``."""
    global _checked
    if version is None:
        if _checked:
            return
        import ray

        version = ray.__version__
    if version != TESTED_RAY:
        if os.environ.get(ALLOW_ENV) != "1":
            raise LedgerError.of(
                ResponseCode.UNSUPPORTED,
                f"rayledger uses private Ray APIs tested with ray {TESTED_RAY}, but ray "
                f"{version} is installed: install ray=={TESTED_RAY}, or set {ALLOW_ENV}=1 to "
                "try this one (the fast path and persistent link faults may break)",
            )
        log.warning("ray %s is not the tested %s (%s=1)", version, TESTED_RAY, ALLOW_ENV)
    _checked = True


# -- compiled graphs ----------------------------------------------------------------------
def compile_options(max_inflight: int, buffer_bytes: int) -> dict[str, Any]:
    """Keyword arguments for ``dag.experimental_compile`` (its underscore options)."""
    check_ray_version()
    return {
        "enable_asyncio": True,
        "_max_inflight_executions": max_inflight,
        "_buffer_size_bytes": buffer_bytes,
    }


def install_loop_registry() -> None:
    """Record, on the actor instance, the task lists of the compiled-graph loops it runs.

    Ray starts a participant's loop with ``do_exec_tasks(actor, tasks, ...)`` looked up by
    name in this process, so wrapping it here is enough.  :func:`reset_loops` closes the
    channels of recorded loops, which makes them return.
    """
    check_ray_version()
    import ray.dag.compiled_dag_node as cdn

    orig = cdn.do_exec_tasks
    if getattr(orig, "_rayledger", False):
        return

    def do_exec_tasks(self, tasks, *args, **kwargs):
        loops = self.__dict__.setdefault("_cg_loops", [])
        loops.append(tasks)
        try:
            return orig(self, tasks, *args, **kwargs)
        finally:
            if tasks in loops:
                loops.remove(tasks)

    do_exec_tasks._rayledger = True  # type: ignore[attr-defined]
    cdn.do_exec_tasks = do_exec_tasks


def reset_loops(actor: Any) -> int:
    """Make every compiled-graph loop this actor runs return; how many there were."""
    loops = list(actor.__dict__.get("_cg_loops", []))
    if not loops:
        return 0
    import ray.dag.compiled_dag_node as cdn

    for tasks in loops:
        try:
            cdn.do_cancel_executable_tasks(actor, tasks)
        except Exception as exc:  # a channel already closed
            log.debug("closing a compiled-graph loop: %s", exc)
    return len(loops)


# -- the cluster's key-value store (GCS) --------------------------------------------------
def kv_put(key: str, value: str, namespace: str) -> None:
    check_ray_version()
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, value, namespace=namespace)


def kv_del(key: str, namespace: str) -> None:
    check_ray_version()
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(key, namespace=namespace)


def kv_keys(prefix: str, namespace: str) -> list[str]:
    """The keys stored under ``prefix``."""
    check_ray_version()
    from ray.experimental import internal_kv

    return sorted(
        k.decode() if isinstance(k, bytes) else k
        for k in internal_kv._internal_kv_list(prefix, namespace=namespace)
    )


def kv_get(key: str, namespace: str) -> bytes | None:
    """The value stored at ``key``; raises when no Ray is connected."""
    check_ray_version()
    from ray.experimental import internal_kv

    return internal_kv._internal_kv_get(key, namespace=namespace)
