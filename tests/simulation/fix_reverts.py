"""Each safety fix, reverted on its own: the simulation must catch every one of them.

``revert(name)`` is a context manager that puts back the behaviour the fix replaced (by
patching the shipped cores in this process only), so that a sweep can show the fix is what
keeps it safe (docs/SAFETY.md's table).  ``REVERTS`` names them all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rayledger.actors.logic import MemberLogic
from rayledger.actors.reads import ReadIndexLogic
from rayledger.actors.round_path import RoundPath
from rayledger.actors.rounds import RoundBook
from rayledger.replication.sessions import Session, SessionTable


def _checker_config(patch: Callable) -> None:
    """The checker learns a change only through the role lock, and the next change is
    admitted on the commits of a checker that may lag."""
    patch(RoundPath, "_config_in", lambda self, first, last: None)
    patch(MemberLogic, "checker_counts_latest", lambda self: True)


def _term_queue(patch: Callable) -> None:
    """Appends queued when a term ends stay queued for the member's next term."""
    patch(RoundBook, "settle_term", lambda self, force=False: None)


def _read_expire(patch: Callable) -> None:
    """A round confirmed at once on expiry trips an assertion (the readers are lost)."""
    real = ReadIndexLogic.expire

    def expire(self, now_ms):
        sends, expired, confirmed = real(self, now_ms)
        assert not confirmed
        return sends, expired, confirmed

    patch(ReadIndexLogic, "expire", expire)
    _keep_round(patch, reset_lease=True)


def _keep_round(patch: Callable, reset_lease: bool) -> None:
    """A change keeps the round in flight counted under the old voters."""

    def configure(self, voters, now_ms=0):
        self.others = [p for p in voters if p != self.self_id]
        self.quorum = len(voters) // 2 + 1
        self._own = 1 if self.self_id in voters else 0
        if reset_lease:
            self._lease = (-1, -1)
        return [], []

    patch(ReadIndexLogic, "configure", configure)


def _lease_config(patch: Callable) -> None:
    """A lease confirmed by the old voters survives configuration changes."""
    _keep_round(patch, reset_lease=False)


def _session_expiry(patch: Callable) -> None:
    """Sessions expired by an entry later truncated stay forgotten, and a run keeps the
    stamp of its last entry even after a truncation cuts that entry."""

    def expire_at(self, index):
        self.expire(self.last_stamp)

    def run(self, client, first_seq, first_index, count, stamp):
        s = self.sessions.pop(client, None)
        if s is None:
            s = Session(first_seq - 1, stamp)
        runs = s.runs
        last = runs[-1] if runs else None
        if last is not None and last[0] + last[2] == first_seq and last[1] + last[2] == first_index:
            last[2] += count
            last[3] = stamp
        else:
            runs.append([first_seq, first_index, count, stamp])
            if len(runs) > self.keep_runs:
                del runs[0]
        s.last_seq = first_seq + count - 1
        s.stamp = max(s.stamp, stamp)
        self.sessions[client] = s

    patch(SessionTable, "_expire_at", expire_at)
    patch(SessionTable, "_run", run)


REVERTS: dict[str, Callable[[Callable], None]] = {
    "checker-config": _checker_config,
    "term-queue": _term_queue,
    "read-expire": _read_expire,
    "lease-config": _lease_config,
    "session-expiry": _session_expiry,
}


@contextlib.contextmanager
def revert(name: str) -> Iterator[None]:
    """Run the body with fix ``name`` reverted (``REVERTS``), then put it back."""
    undo: list[tuple[object, str, object]] = []

    def patch(owner: object, attr: str, value: object) -> None:
        undo.append((owner, attr, owner.__dict__[attr]))
        setattr(owner, attr, value)

    try:
        REVERTS[name](patch)
        yield
    finally:
        for owner, attr, value in reversed(undo):
            setattr(owner, attr, value)
