"""Storage benchmark: ``rayledger bench store --json``.

Measures a :class:`~rayledger.storage.FileStore` in a temporary directory
(deleted afterwards) with DLedger's default segment sizes and the async flush
service running:

- ``append_entries_per_s``: 128-byte bodies, leader appends in batches of 1000;
- ``append_mb_per_s``: 4 KiB bodies, batches of 1000 (MB = 10^6 body bytes);
- ``get_entries_per_s``: random ``get(i)`` over the 128-byte log;
- ``recovery_s_per_gib``: reopening a ~``gib`` GiB log (1 KiB bodies) after a
  clean close (checkpoint-based: the index is verified, the data after the
  checkpoint is scanned), and ``crash_recovery_s_per_gib`` after a crash whose
  checkpoint is one append round stale; ``full_verify_s_per_gib`` with
  ``verify_all_on_open=True`` (every CRC re-checked).

The page cache is warm (nothing drops it); CPU seconds are reported next to wall
time because the machine may be shared.
"""

from __future__ import annotations

import logging
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from typing import Any

from rayledger.storage import FileStore, StoreConfig

log = logging.getLogger("rayledger.bench")

GIB = 1 << 30


def _timed(fn) -> tuple[float, float, Any]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def _append(store: FileStore, body: bytes, entries: int, batch: int = 1000) -> None:
    bodies = [body] * batch
    full, rest = divmod(entries, batch)
    for _ in range(full):
        store.append_as_leader(bodies, 1)
    if rest:
        store.append_as_leader(bodies[:rest], 1)


def _bench_small(root: str, entries: int, gets: int, seed: int) -> dict[str, Any]:
    """128-byte appends (async flush), then random gets over that log."""
    cfg = StoreConfig(data_dir=os.path.join(root, "small"))
    s = FileStore(cfg)
    w, c, _ = _timed(lambda: _append(s, b"m" * 128, entries))
    out: dict[str, Any] = {
        "append_entries": entries,
        "append_entries_per_s": round(entries / w),
        "append_entries_per_cpu_s": round(entries / c) if c else None,
    }
    s.flush()
    rnd = random.Random(seed)
    idx = [rnd.randrange(entries) for _ in range(gets)]
    get = s.get

    def read_all() -> None:
        for i in idx:
            get(i)

    w, c, _ = _timed(read_all)
    out.update(
        get_entries=gets,
        get_entries_per_s=round(gets / w),
        get_entries_per_cpu_s=round(gets / c) if c else None,
    )
    s.close()
    shutil.rmtree(cfg.data_dir)
    return out


def _bench_4k(root: str, mb_4k: int) -> dict[str, Any]:
    """4 KiB appends: the store's byte throughput."""
    n4k = max(1000, mb_4k * 1_000_000 // 4096)
    cfg = StoreConfig(data_dir=os.path.join(root, "big"))
    s = FileStore(cfg)
    w, c, _ = _timed(lambda: _append(s, b"k" * 4096, n4k))
    s.close()
    shutil.rmtree(cfg.data_dir)
    return {
        "append_4k_entries": n4k,
        "append_mb_per_s": round(n4k * 4096 / w / 1e6, 1),
        "append_mb_per_cpu_s": round(n4k * 4096 / c / 1e6, 1) if c else None,
    }


def _dir_gib(path: str) -> float:
    return (
        sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(path) for f in fs) / GIB
    )


def _bench_recovery(root: str, gib: float) -> dict[str, Any]:
    """Reopen a ~``gib`` GiB log of 1 KiB bodies: clean, fully verified, after a crash."""
    cfg = StoreConfig(data_dir=os.path.join(root, "recovery"))
    n_rec = max(1000, int(gib * GIB) // (1024 + 48))
    s = FileStore(cfg)
    _append(s, b"r" * 1024, n_rec)
    s.update_committed_index(n_rec - 1)
    s.close()
    size_gib = _dir_gib(cfg.data_dir)
    out: dict[str, Any] = {"recovery_log_gib": round(size_gib, 3), "recovery_entries": n_rec}
    w, c, s = _timed(lambda: FileStore(cfg))
    assert s.ledger_end_index == n_rec - 1 and not s.recovery.full_scan
    s.close()
    out["recovery_s_per_gib"] = round(w / size_gib, 3)
    out["recovery_cpu_s_per_gib"] = round(c / size_gib, 3)
    vcfg = StoreConfig(data_dir=cfg.data_dir, verify_all_on_open=True)
    w, c, s = _timed(lambda: FileStore(vcfg))
    assert s.ledger_end_index == n_rec - 1 and s.recovery.full_scan
    s.close()
    out["full_verify_s_per_gib"] = round(w / size_gib, 3)
    out["full_verify_cpu_s_per_gib"] = round(c / size_gib, 3)
    # a crash: the checkpoint lags the last round of appends
    s = FileStore(cfg)
    _append(s, b"t" * 1024, 20_000)
    s.flush()
    s.abandon()  # a crash: no final flush or checkpoint
    w, c, s = _timed(lambda: FileStore(cfg))
    assert s.ledger_end_index == n_rec + 20_000 - 1
    out["crash_recovery_s_per_gib"] = round(w / size_gib, 3)
    out["crash_recovery_scanned_entries"] = s.recovery.scanned_entries
    s.close()
    return out


def run_store_bench(
    entries: int | None = None,
    *,
    quick: bool = False,
    gib: float = 1.0,
    gets: int | None = None,
    mb_4k: int | None = None,
    data_dir: str | None = None,
    seed: int = 1,
) -> dict:
    """Run the storage benchmark and return its figures (see the module docstring)."""
    entries = entries or (200_000 if quick else 2_000_000)
    gets = gets or (50_000 if quick else 300_000)
    mb_4k = mb_4k or (100 if quick else 800)
    if quick and gib == 1.0:
        gib = 0.25
    root = tempfile.mkdtemp(prefix="rayledger-bench-", dir=data_dir)
    out: dict[str, Any] = {
        "bench": "store",
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_avg_1m_before": round(os.getloadavg()[0], 2),
    }
    try:
        out.update(_bench_small(root, entries, gets, seed))
        out.update(_bench_4k(root, mb_4k))
        out.update(_bench_recovery(root, gib))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["rss_peak_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    return out
