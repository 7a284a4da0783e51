"""The round book's idempotent appends, sans-I/O: what a leader answers for a
retried identity, from its own log."""

from __future__ import annotations

import numpy as np
import pytest
from rayledger.actors.core.rounds import RoundBook, Spread
from rayledger.replication import ReplicationConfig
from rayledger.replication.checker import Resolution
from rayledger.storage import (
    LedgerError,
    OutcomeUnknownError,
    ResponseCode,
    SessionError,
)
from test_rounds import leader_book

C = ResponseCode


@pytest.fixture
def book() -> RoundBook:
    return leader_book(ReplicationConfig())


def _round(book: RoundBook, wall_ms: int = 1000):
    assert book.write_due()
    return book.write(wall_ms)


def _where(value: Spread) -> list[tuple[int, int]]:
    return list(zip(np.frombuffer(value.indexes, np.int64).tolist(),
                    np.frombuffer(value.terms, np.int64).tolist(), strict=True))  # fmt: skip


def test_entries_carry_the_identity_and_readers_do_not_see_it(book) -> None:
    book.admit([b"a", b"b"], "g", None, "t1", (9, 0))
    book.admit([b"plain"], "g", None, "t2")
    book.admit([b"c"], "g", None, "t3", (9, 2))  # the same session, next in this turn
    w = _round(book)
    assert w.tokens == ("t1", "t2", "t3") and w.round.first_index == 1
    store = book.logic.store
    assert [e.body for e in store.get_range(1, 5)] == [b"a", b"b", b"plain", b"c"]
    s = book.logic.sessions.sessions[9]
    assert s.last_seq == 2 and s.stamp == 1000 and [r[:3] for r in s.runs] == [[0, 1, 2], [2, 4, 1]]


def test_a_retry_of_committed_entries_is_answered_at_once(book) -> None:
    book.admit([b"a", b"b"], "g", None, "t1", (9, 0))
    w = _round(book)
    book.finish(w.rid, C.SUCCESS)
    book.admit([b"a", b"b"], "g", None, "again", (9, 0))
    [(token, value)] = book.take_settled()
    assert token == "again" and _where(value) == [(1, 3), (2, 3)]
    assert not book.write_due()  # nothing new to write
    with pytest.raises(SessionError) as e:
        book.admit([b"a", b"X"], "g", None, "bad", (9, 0))
    assert e.value.code == C.SEQUENCE_MISMATCH


def test_a_retry_of_waiting_entries_is_answered_when_they_commit(book) -> None:
    book.admit([b"a"], "g", None, "t1", (9, 0))
    w = _round(book)
    book.admit([b"a"], "g", None, "again", (9, 0))
    assert book.take_settled() == [] and book.outstanding == 2
    book.resolve(Resolution(3, 1, [(w.rid, C.SUCCESS)]))
    [(token, value)] = book.take_settled()
    assert token == "again" and _where(value) == [(1, 3)] and book.outstanding == 0


def test_a_retry_waiting_on_a_term_that_ends_is_an_unknown_outcome(book) -> None:
    book.admit([b"a"], "g", None, "t1", (9, 0))
    w = _round(book)
    book.admit([b"a"], "g", None, "again", (9, 0))
    book.logic.state.change_to_candidate(4)
    book.resolve(Resolution(-1, None, [(w.rid, C.TERM_CHANGED)]))
    [(token, value)] = book.take_settled()
    assert token == "again" and isinstance(value, OutcomeUnknownError)


def test_a_lost_round_goes_out_again_for_a_retry(book) -> None:
    """Its round ended unanswered (stored, not sent on): the retry's entries go out as a
    round of their own, with no append call in it."""
    book.admit([b"a"], "g", None, "t1", (9, 0))
    w = _round(book)
    book.finish(w.rid, C.INTERNAL_ERROR)
    book.admit([b"a"], "g", None, "again", (9, 0))
    again = _round(book)  # with the term's first entry, not committed either
    assert again.tokens == () and (again.round.first_index, again.round.last_index) == (0, 1)
    assert book.logic.store.ledger_end_index == 1  # nothing written twice
    book.resolve(Resolution(3, 1, [(again.rid, C.SUCCESS)]))
    [(token, value)] = book.take_settled()
    assert token == "again" and _where(value) == [(1, 3)]


def test_a_call_cut_short_is_answered_from_the_log_and_appended_for_the_rest(book) -> None:
    book.admit([b"a", b"b"], "g", None, "t1", (9, 0))
    w = _round(book)
    book.finish(w.rid, C.INTERNAL_ERROR)
    book.logic.store.truncate(1)  # as if this leader had only the first entry of the call
    book.admit([b"a", b"b", b"c"], "g", None, "again", (9, 0))
    rest = _round(book)
    assert rest.round.first_index == 2 and rest.round.last_index == 3
    fin = book.finish(rest.rid, C.SUCCESS)
    assert fin.calls == ()  # the whole answer is settled, not the round's
    [(token, value)] = book.take_settled()
    assert token == "again" and _where(value) == [(1, 3), (2, 3), (3, 3)]


def test_bad_identities_are_refused_and_nothing_is_queued(book) -> None:
    book.admit([b"a"], "g", None, "t1", (9, 0))
    for ident, code in (((9, 5), C.OUT_OF_ORDER_SEQUENCE), ((8, 4), C.SESSION_EXPIRED)):
        with pytest.raises(LedgerError) as e:
            book.admit([b"x"], "g", None, "bad", ident)
        assert e.value.code == code
    limit = book.logic.store.config.max_entry_size
    with pytest.raises(LedgerError) as e:
        book.admit([b"x" * (limit - 10)], "g", None, "big", (9, 1))  # fits, not with the prefix
    assert e.value.code == C.ENTRY_TOO_LARGE
    assert [q[0] for q in book.queue] == ["t1"]


def test_a_session_silent_past_its_ttl_expires(book) -> None:
    ttl = book.logic.sessions.ttl_ms
    book.admit([b"a"], "g", None, "t1", (9, 0))
    book.finish(_round(book, wall_ms=1000).rid, C.SUCCESS)
    book.admit([b"b"], "g", None, "t2", (5, 0))
    book.finish(_round(book, wall_ms=1000 + ttl + 1).rid, C.SUCCESS)
    with pytest.raises(SessionError) as e:
        book.admit([b"c"], "g", None, "late", (9, 1))
    assert e.value.code == C.SESSION_EXPIRED
    assert 9 not in book.logic.sessions.sessions  # forgotten: the table stays bounded


def test_a_body_an_append_hook_stamped_still_matches_its_retry(book) -> None:
    """The RocketMQ layer stamps offsets into a body as it is written: the retry carries
    the body as sent, and is checked against the CRC the prefix keeps of it."""

    def stamp(index, pos, body):
        body[0:1] = b"#"

    book.logic.store.add_append_hook(stamp)
    book.admit([b"abc"], "g", None, "t1", (9, 0))
    book.finish(_round(book).rid, C.SUCCESS)
    assert book.logic.store.get(1).body == b"#bc"
    book.admit([b"abc"], "g", None, "again", (9, 0))
    [(token, value)] = book.take_settled()
    assert token == "again" and _where(value) == [(1, 3)]
    with pytest.raises(SessionError):
        book.admit([b"#bc"], "g", None, "other", (9, 0))


def test_the_session_ttl_is_a_group_setting() -> None:
    from rayledger.actors import LedgerConfig

    assert LedgerConfig().replication.client_session_ttl_ms == 3_600_000
    assert LedgerConfig(client_session_ttl_s=90).replication.client_session_ttl_ms == 90_000
    for bad in (0, -1, "1", True):
        with pytest.raises(LedgerError) as e:
            LedgerConfig(client_session_ttl_s=bad)
        assert e.value.code == C.UNEXPECTED_ARGUMENT


def test_a_retry_of_an_append_still_queued_is_an_unknown_outcome_not_a_gap(book) -> None:
    """A client's retry reaches the leader while its first call still waits to be written
    (a round in flight holds the queue): it is told the outcome is not known yet, so it asks
    again under the same identity -- a gap would have it renumber a body about to be stored."""
    book.admit([b"a"], "g", None, "t1", ident=(5, 0))
    book.write_due()
    book.write()  # a round waits
    book.admit([b"b"], "g", None, "t2", ident=(5, 1))  # queued behind it
    with pytest.raises(OutcomeUnknownError) as e:
        book.admit([b"b"], "g", None, "t2-retry", ident=(5, 1))
    assert e.value.code == C.REPEATED_REQUEST
