"""Helpers of the storage tests: small configs, crash simulation, snapshots."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from rayledger.storage import FileStore, LogStore, StoreConfig

SMALL = {"data_segment_size": 4096, "index_segment_size": 32 * 8}


def small_config(data_dir: str | os.PathLike | None = None, **kw) -> StoreConfig:
    """4 KiB data segments and 8-unit index segments: rolls happen all the time."""
    return StoreConfig(data_dir=str(data_dir) if data_dir else None, **{**SMALL, **kw})


def abandon(store: FileStore) -> None:
    """Simulate a process crash: stop the flush thread with no final flush or checkpoint.

    Bytes already written stay (they are in the page cache, as after a kill);
    only the file descriptors are closed so the test does not leak them.
    """
    store.abandon()


def snapshot(store: LogStore) -> dict:
    """Everything observable about a store, to assert a refused call changed nothing."""
    snap = {
        "begin": store.ledger_begin_index,
        "end": store.ledger_end_index,
        "end_term": store.ledger_end_term,
        "committed": store.committed_index,
        "committed_pos": store.committed_pos,
        "write_pos": store.write_pos,
        "chain": store._chain,
        "entries": store.get_range(store.ledger_begin_index, store.ledger_end_index + 1),
    }
    if isinstance(store, FileStore):
        snap["files"] = dir_digest(store.dir, skip=("checkpoint",))
    return snap


def dir_digest(root: str | os.PathLike, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """{relative path: sha1} of every file under ``root``."""
    root = Path(root)
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name not in skip:
            out[str(p.relative_to(root))] = hashlib.sha1(p.read_bytes()).hexdigest()
    return out


def data_files(store_dir: str | os.PathLike) -> list[Path]:
    return sorted((Path(store_dir) / "data").iterdir())


def index_files(store_dir: str | os.PathLike) -> list[Path]:
    return sorted((Path(store_dir) / "index").iterdir())


def copy_store_dir(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    shutil.copytree(src, dst)
    return Path(dst)
