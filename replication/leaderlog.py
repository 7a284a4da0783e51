"""What a leader's dispatcher reads of its leader's log (:class:`LeaderLog`), and the
signal that a read must wait for the shell to fetch (:class:`NotCached`): the dispatcher
core never blocks on a read."""

from __future__ import annotations

from typing import Any, Protocol


class NotCached(Exception):
    """A :class:`LeaderLog` lacks what the core asked for (a dispatcher's cached view of its
    leader's log): ``kind`` is ``"batch"`` or ``"meta"`` at ``index``, or ``"snapshot"``.  The core stops,
    keeps what it built, records the need in :attr:`EntryDispatcher.need`, and the shell
    fetches it and asks again -- the core itself never blocks."""

    def __init__(self, kind: str, index: int, count: int | None = None):
        super().__init__(kind, index, count)
        self.kind = kind
        self.index = index
        self.count = count  # for a batch: at most this many entries (a resend's exact range)


class LeaderLog(Protocol):
    """What a dispatcher reads from its leader's log; :class:`~rayledger.storage.LogStore` fits.

    A cache of the leader's log may raise :class:`NotCached` from any read.

    A log may also offer the leader's newest snapshot, for followers below its
    begin: ``peek_snapshot()`` returns it (index, term, files) or None, and
    ``take_snapshot()`` returns it and forgets it, so that the next install asks afresh.
    A log without these offers none.
    """

    ledger_begin_index: int
    ledger_end_index: int
    committed_index: int

    def get_term(self, index: int) -> int: ...

    def get_pos(self, index: int) -> int: ...

    def read_batch(self, start: int, max_bytes: int, max_count: int) -> Any: ...


def batch_bytes(batch: Any) -> int:
    """Bytes of a batch; a stand-in for an EntryBatch may offer ``nbytes`` instead of ``data``."""
    n = getattr(batch, "nbytes", None)
    if n is None:
        data = getattr(batch, "data", None)
        n = len(data) if data is not None else 0
    return n
