"""Store settings, with DLedger's defaults (DLedgerConfig)."""

from __future__ import annotations

from dataclasses import dataclass

from .codec import HEADER_SIZE, INDEX_UNIT
from .errors import LedgerError, ResponseCode


@dataclass
class StoreConfig:
    """How one member keeps its log.

    ``data_dir`` None means an in-memory store (DLedger's ``memory`` store type).
    Every member of a group must use the same segment sizes: a follower stores
    each entry at exactly the leader's position.
    """

    data_dir: str | None = None
    data_segment_size: int = 1024 * 1024 * 1024  # DLedger mappedFileSizeForEntryData
    index_segment_size: int = INDEX_UNIT * 5 * 1024 * 1024  # mappedFileSizeForEntryIndex
    max_entry_size: int | None = None  # body bytes; None: 4 MiB, or what fits one segment
    flush_interval_ms: int = 10  # flushFileInterval
    sync_flush: bool = False
    checkpoint_interval_ms: int = 1000  # checkPointInterval ... DLedger uses 3000
    file_reserved_hours: float = 72.0
    delete_when: int = 4  # hour of day at which expired segments are removed
    disk_space_ratio_to_check_expired: float = 0.70
    disk_space_ratio_to_force_clean: float = 0.85
    disk_full_ratio: float = 0.90
    verify_all_on_open: bool = False  # verify every CRC on open, not just after the checkpoint

    def __post_init__(self) -> None:
        def bad(msg: str) -> LedgerError:
            return LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, f"StoreConfig: {msg}")

        if self.data_segment_size < HEADER_SIZE * 4:
            raise bad(f"data_segment_size {self.data_segment_size} is too small")
        if self.index_segment_size < INDEX_UNIT or self.index_segment_size % INDEX_UNIT:
            raise bad(f"index_segment_size must be a positive multiple of {INDEX_UNIT}")
        if self.max_entry_size is None:
            self.max_entry_size = min(4 * 1024 * 1024, self.data_segment_size - HEADER_SIZE)
        if not 0 < self.max_entry_size <= self.data_segment_size - HEADER_SIZE:
            raise bad("max_entry_size must be positive and fit in one data segment with its header")
        if self.flush_interval_ms <= 0 or self.checkpoint_interval_ms <= 0:
            raise bad("flush and checkpoint intervals must be positive")
        if self.file_reserved_hours < 0 or not 0 <= self.delete_when <= 23:
            raise bad("file_reserved_hours must be >= 0 and delete_when an hour 0..23")
        ratios = (
            self.disk_space_ratio_to_check_expired,
            self.disk_space_ratio_to_force_clean,
            self.disk_full_ratio,
        )
        if not all(0 < r <= 1 for r in ratios) or not ratios[0] <= ratios[1] <= ratios[2]:
            raise bad("need 0 < check_expired <= force_clean <= disk_full <= 1")
