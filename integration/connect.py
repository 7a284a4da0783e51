"""Attach a driver to a running Ray cluster: shared by the command line and the export."""

from __future__ import annotations

import socket

from rayledger.storage import LedgerError, ResponseCode

NAMESPACE = "rayledger"


def _probe(address: str, timeout_s: float = 3.0) -> None:
    """Fail fast when nothing listens at ``host:port`` (``ray.init`` would retry for minutes)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise LedgerError(
            ResponseCode.UNEXPECTED_ARGUMENT,
            f"--address must be HOST:PORT or auto, got {address!r}",
        )
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise LedgerError(
            ResponseCode.NETWORK_ERROR, f"no Ray cluster at {address} ({exc.strerror or exc})"
        ) from exc


def connect(address: str | None) -> None:
    """``ray.init`` on the cluster at ``address`` (default: the running one), quietly."""
    import ray

    if ray.is_initialized():
        return
    if address and address not in ("auto", "local") and "://" not in address:
        _probe(address)
    try:
        ray.init(
            address=address or "auto",
            namespace=NAMESPACE,
            log_to_driver=False,
            configure_logging=False,
        )
    except ConnectionError as exc:
        raise LedgerError(
            ResponseCode.NETWORK_ERROR,
            f"no Ray cluster at {address or 'auto'} ({exc})",
        ) from exc
