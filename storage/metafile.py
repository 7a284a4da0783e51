"""Small metadata files written atomically: temp file, fsync, rename, fsync dir.

A crash leaves either the old file or the new one, never a torn mix; this is
what the checkpoint and the member's term/vote record rely on.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from .errors import LedgerError, ResponseCode


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        code = ResponseCode.DISK_FULL if exc.errno == 28 else ResponseCode.DISK_ERROR
        raise LedgerError.of(code, f"cannot write {path}: {exc}") from exc


def fsync_dir(directory: str | os.PathLike) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, sort_keys=True).encode())


def read_json(path: str | os.PathLike) -> Any | None:
    """The JSON object at ``path``, or None when the file does not exist."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None
    except (ValueError, OSError) as exc:
        raise LedgerError.of(
            ResponseCode.CORRUPT_LOG, f"unreadable metadata file {path}: {exc}"
        ) from exc


def ensure_writable_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` if needed and prove it takes files, or raise DISK_ERROR."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        # one probe per thread: groups of one topic start from threads of one process
        probe = path / f".probe-{os.getpid()}-{threading.get_ident()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise LedgerError.of(
            ResponseCode.DISK_ERROR, f"{path} is not a writable directory: {exc}"
        ) from exc
    return path
