"""Response codes and the error type every layer raises.

The codes are DLedger's ``DLedgerResponseCode`` (same names, same numbers) plus
the few rayledger needs on top (``ENTRY_TOO_LARGE``, ``CORRUPT_LOG``,
``APPEND_OUTCOME_UNKNOWN``, ``CORRUPT_SNAPSHOT``, ``CONFIG_CHANGE_IN_PROGRESS``, the
session codes of exactly-once appends).  They live in the lowest layer so that the store,
the protocol cores, the actors and the client all speak one vocabulary.
"""

from __future__ import annotations

from enum import IntEnum


class ResponseCode(IntEnum):
    UNKNOWN = -1
    SUCCESS = 200
    TIMEOUT = 300
    METADATA_ERROR = 301
    NETWORK_ERROR = 302
    UNSUPPORTED = 303
    UNKNOWN_GROUP = 400
    UNKNOWN_MEMBER = 401
    UNEXPECTED_MEMBER = 402
    EXPIRED_TERM = 403
    NOT_LEADER = 404
    NOT_FOLLOWER = 405
    INCONSISTENT_STATE = 406
    INCONSISTENT_TERM = 407
    INCONSISTENT_INDEX = 408
    INCONSISTENT_LEADER = 409
    INDEX_OUT_OF_BOUNDS = 410
    UNEXPECTED_ARGUMENT = 411
    REPEATED_REQUEST = 412
    REPEATED_PUSH = 413
    DISK_ERROR = 414
    DISK_FULL = 415
    TERM_NOT_READY = 416
    FUTURE_TIMEOUT = 417
    WAIT_QUORUM_ACK_TIMEOUT = 418
    LEADER_PENDING_FULL = 420
    ILLEGAL_MEMBER_STATE = 421
    LEADER_NOT_READY = 422
    LEADER_TRANSFERRING = 423
    REQUEST_WITH_EMPTY_BODYS = 424
    ENTRY_TOO_LARGE = 425
    CORRUPT_LOG = 426
    APPEND_OUTCOME_UNKNOWN = 427
    CORRUPT_SNAPSHOT = 428
    CONFIG_CHANGE_IN_PROGRESS = 429
    NODE_UNAVAILABLE = 430  # a node that is not alive, or already hosts a member of the group
    NO_LIVE_QUORUM = 431  # a change that would leave no majority of live voters
    # exactly-once appends: an idempotent client's session and sequence numbers
    SESSION_EXPIRED = 432  # no such session: silent longer than client_session_ttl_s
    OUT_OF_ORDER_SEQUENCE = 433  # a sequence past the session's next: an earlier one is missing
    DUPLICATE_SEQUENCE = 434  # appended long ago: its result is no longer kept
    SEQUENCE_MISMATCH = 435  # a retry whose bodies differ from what that sequence stored
    TERM_CHANGED = 501
    INTERNAL_ERROR = 500
    TAKE_LEADERSHIP_FAILED = 502


class LedgerError(Exception):
    """Base of every rayledger error; ``code`` is a :class:`ResponseCode`.

    Subclasses group the codes a caller reacts to the same way; ``LedgerError.of``
    picks the right one so an error rebuilt on the other side of a Ray call keeps
    its class.
    """

    codes: frozenset[ResponseCode] = frozenset()

    def __init__(
        self, code: ResponseCode | int, message: str = "", *, leader_id: str | None = None
    ):
        self.code = ResponseCode(code)
        self.message = message
        self.leader_id = leader_id
        super().__init__(f"[{self.code.name}] {message}" if message else f"[{self.code.name}]")

    def __reduce__(self):
        return (_rebuild, (type(self), int(self.code), self.message, self.leader_id))

    @staticmethod
    def of(
        code: ResponseCode | int, message: str = "", *, leader_id: str | None = None
    ) -> LedgerError:
        code = ResponseCode(code)
        for cls in _SUBCLASSES:
            if code in cls.codes:
                return cls(code, message, leader_id=leader_id)
        return LedgerError(code, message, leader_id=leader_id)


def _rebuild(cls, code, message, leader_id):
    return cls(code, message, leader_id=leader_id)


class InvalidRequestError(LedgerError):
    """The request itself is wrong; retrying it unchanged fails again."""

    codes = frozenset(
        {
            ResponseCode.UNEXPECTED_ARGUMENT,
            ResponseCode.REQUEST_WITH_EMPTY_BODYS,
            ResponseCode.ENTRY_TOO_LARGE,
            ResponseCode.INDEX_OUT_OF_BOUNDS,
            ResponseCode.UNKNOWN_GROUP,
            ResponseCode.UNKNOWN_MEMBER,
            ResponseCode.UNEXPECTED_MEMBER,
        }
    )


class NotLeaderError(LedgerError):
    """Sent to a member that cannot take appends now; ``leader_id`` says where to go."""

    codes = frozenset(
        {
            ResponseCode.NOT_LEADER,
            ResponseCode.LEADER_TRANSFERRING,
            ResponseCode.LEADER_NOT_READY,
            ResponseCode.LEADER_PENDING_FULL,
            ResponseCode.TERM_CHANGED,
            ResponseCode.EXPIRED_TERM,
        }
    )


class StorageError(LedgerError):
    """The disk refused or the log on it is damaged."""

    codes = frozenset(
        {
            ResponseCode.DISK_FULL,
            ResponseCode.DISK_ERROR,
            ResponseCode.CORRUPT_LOG,
            ResponseCode.CORRUPT_SNAPSHOT,
        }
    )


class LedgerTimeoutError(LedgerError):
    """A deadline passed; for appends, see :class:`OutcomeUnknownError`."""

    codes = frozenset(
        {ResponseCode.TIMEOUT, ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, ResponseCode.FUTURE_TIMEOUT}
    )


class OutcomeUnknownError(LedgerError):
    """An append may or may not have committed; the client must not blindly retry it."""

    codes = frozenset({ResponseCode.APPEND_OUTCOME_UNKNOWN})


class SessionError(LedgerError):
    """An idempotent append refused for its session or sequence; nothing was
    appended."""

    codes = frozenset(
        {
            ResponseCode.SESSION_EXPIRED,
            ResponseCode.OUT_OF_ORDER_SEQUENCE,
            ResponseCode.DUPLICATE_SEQUENCE,
            ResponseCode.SEQUENCE_MISMATCH,
        }
    )


class InconsistentStateError(LedgerError):
    codes = frozenset(
        {
            ResponseCode.INCONSISTENT_STATE,
            ResponseCode.INCONSISTENT_TERM,
            ResponseCode.INCONSISTENT_INDEX,
            ResponseCode.INCONSISTENT_LEADER,
        }
    )


_SUBCLASSES: tuple[type[LedgerError], ...] = (
    InvalidRequestError,
    NotLeaderError,
    StorageError,
    LedgerTimeoutError,
    OutcomeUnknownError,
    SessionError,
    InconsistentStateError,
)
