"""LedgerClient: appends and committed reads against whichever member leads.

It follows ``NOT_LEADER`` answers (and probes members when it has no hint)
until its deadline.  It retries an append only when the append certainly did
not happen (the member refused it before storing anything); when a call's
outcome is unknown — the member died or the quorum wait failed mid-call — it
raises :class:`OutcomeUnknownError` instead of risking a silent duplicate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import ray
from rayledger.storage import (
    Entry,
    LedgerError,
    NotLeaderError,
    OutcomeUnknownError,
    ResponseCode,
)

from .member import NAMESPACE, actor_name
from .types import AppendResult

log = logging.getLogger("rayledger.actors")

_RETRY_BEFORE_STORE = {
    ResponseCode.NOT_LEADER,
    ResponseCode.LEADER_NOT_READY,
    ResponseCode.LEADER_TRANSFERRING,
    ResponseCode.LEADER_PENDING_FULL,
    ResponseCode.DISK_FULL,
}


class LedgerClient:
    def __init__(self, group: str, members: Sequence[str], timeout_s: float = 30.0):
        self.group = group
        self.members = list(members)
        self.timeout_s = timeout_s
        self._handles: dict[str, object] = {}
        self._leader: str | None = None
        self._probe = 0

    @classmethod
    def connect(cls, group: str, timeout_s: float = 30.0) -> LedgerClient:
        """A client for a running group, from any driver or Ray job."""
        from .group import group_members

        if not ray.is_initialized():
            ray.init(address="auto", namespace=NAMESPACE)
        members = group_members(group)
        if not members:
            raise LedgerError.of(ResponseCode.UNKNOWN_GROUP, f"no group named {group!r} is running")
        return cls(group, members, timeout_s=timeout_s)

    def _handle(self, member: str):
        h = self._handles.get(member)
        if h is None:
            h = ray.get_actor(actor_name(self.group, member), namespace=NAMESPACE)
            self._handles[member] = h
        return h

    def _target(self) -> str:
        """The member believed to lead; asks every member's status when there is no belief.

        Appends go only to a member that says it leads, so a probe never lands an
        append on a member that is restarting (whose outcome would be unknown).
        """
        if self._leader is None:
            self._leader = self._find_leader()
        if self._leader is None:
            self._probe += 1
            return self.members[self._probe % len(self.members)]
        return self._leader

    def _find_leader(self) -> str | None:
        refs = {}
        for m in self.members:
            try:
                refs[m] = self._handle(m).status.remote()
            except ValueError:
                continue
        best = None
        for m, ref in refs.items():
            try:
                s = ray.get(ref, timeout=1.0)
            except Exception:
                continue
            if (
                s.role is not None
                and s.role.value == "LEADER"
                and (best is None or s.term > best[0])
            ):
                best = (s.term, m)
        return best[1] if best else None

    # -- appends ------------------------------------------------------------------------------
    def append(self, body: bytes, timeout_s: float | None = None) -> AppendResult:
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT, f"body must be bytes, not {type(body).__name__}"
            )
        return self.append_batch([body], timeout_s)[0]

    def append_batch(
        self, bodies: Sequence[bytes], timeout_s: float | None = None
    ) -> list[AppendResult]:
        """Append a batch as one unit; returns once the whole batch is committed."""
        if isinstance(bodies, (bytes, bytearray, memoryview, str)) or not isinstance(
            bodies, Sequence
        ):
            raise LedgerError.of(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"bodies must be a list of bytes, not {type(bodies).__name__}",
            )
        bodies = list(bodies)
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        delay = 0.01
        last: Exception | None = None
        while True:
            if self._leader is None:
                self._leader = self._find_leader()
                if self._leader is None:
                    if time.monotonic() > deadline:
                        raise LedgerError.of(
                            ResponseCode.TIMEOUT,
                            f"no leader of {self.group!r} before the deadline: {last}",
                        )
                    time.sleep(0.05)
                    continue
            target = self._leader
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LedgerError.of(
                    ResponseCode.TIMEOUT,
                    f"no leader of {self.group!r} took the append before the deadline: {last}",
                )
            try:
                ref = self._handle(target).append.remote(bodies, self.group, target)
            except ValueError as exc:  # actor not found (gone)
                last = exc
                self._leader = None
                time.sleep(delay)
                continue
            try:
                out = ray.get(ref, timeout=remaining)
                return [AppendResult(i, t, p) for i, t, p in out]
            except OutcomeUnknownError:
                # stored by the leader but not acknowledged by a quorum: never retry it
                self._leader = None
                raise
            except LedgerError as exc:
                last = exc
                if exc.code not in _RETRY_BEFORE_STORE:
                    raise
                if isinstance(exc, NotLeaderError) and exc.leader_id and exc.leader_id != target:
                    self._leader = exc.leader_id
                    continue
                if exc.code == ResponseCode.NOT_LEADER:
                    self._leader = None
            except ray.exceptions.GetTimeoutError as exc:
                ray.cancel(ref)
                raise OutcomeUnknownError(
                    ResponseCode.APPEND_OUTCOME_UNKNOWN,
                    f"append to {target} did not finish before the deadline; it may still commit",
                ) from exc
            except (
                ray.exceptions.ActorDiedError,
                ray.exceptions.ActorUnavailableError,
                ray.exceptions.RayActorError,
            ) as exc:
                self._leader = None
                raise OutcomeUnknownError(
                    ResponseCode.APPEND_OUTCOME_UNKNOWN,
                    f"member {target} failed during the append ({type(exc).__name__}); it may still commit",
                ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    # -- reads --------------------------------------------------------------------------------
    def _read_call(self, method: str, *args):
        deadline = time.monotonic() + self.timeout_s
        last: Exception | None = None
        tried = 0
        while time.monotonic() < deadline:
            target = self._target()
            try:
                return ray.get(
                    getattr(self._handle(target), method).remote(*args),
                    timeout=max(0.1, deadline - time.monotonic()),
                )
            except NotLeaderError as exc:
                if exc.leader_id and exc.leader_id != target and tried < 3 * len(self.members):
                    self._leader = exc.leader_id
                    tried += 1
                    continue
                raise
            except LedgerError:
                raise
            except (ray.exceptions.RayError, ValueError) as exc:
                last = exc
                self._leader = None
                tried += 1
                if tried % len(self.members) == 0:
                    time.sleep(0.05)
        raise LedgerError.of(
            ResponseCode.TIMEOUT, f"no member of {self.group!r} answered {method}: {last}"
        )

    def get(self, index: int) -> Entry:
        """The committed entry at ``index``."""
        return self._read_call("get", index)

    def read(self, start: int, stop: int) -> list[Entry]:
        """Committed entries with ``start <= index < stop``."""
        return self._read_call("read", start, stop)

    def committed_index(self) -> int:
        return self._read_call("committed_index")
