"""Attach a driver to a running Ray cluster: shared by the command line and the export."""

from __future__ import annotations

from rayledger.storage import LedgerError, ResponseCode

NAMESPACE = "rayledger"


def connect(address: str | None) -> None:
    """``ray.init`` on the cluster at ``address`` (default: the running one), quietly."""
    import ray

    if ray.is_initialized():
        return
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
            f"no Ray cluster at {address or 'auto'}; start one with `ray start --head`"
            " or pass --address",
        ) from exc
