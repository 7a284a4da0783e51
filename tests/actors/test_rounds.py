"""RoundBook (actors/core/rounds.py): group commit into rounds, as the Ray member and the
simulation both run it."""

from __future__ import annotations

import pytest
from rayledger.actors.core.member_logic import MemberLogic
from rayledger.actors.core.rounds import RoundBook
from rayledger.election import ElectionConfig, MemoryTermStore
from rayledger.replication import ReplicationConfig
from rayledger.replication.checker import Resolution
from rayledger.storage import (
    LedgerError,
    MemoryStore,
    OutcomeUnknownError,
    ResponseCode,
    StoreConfig,
)

C = ResponseCode


def leader_book(replication: ReplicationConfig) -> RoundBook:
    """The round book of a member that leads term 3 and has taken office."""
    store = MemoryStore(StoreConfig(data_segment_size=1 << 20, index_segment_size=32 << 10))
    m = MemberLogic("g", "n0", ["n0", "n1", "n2"], store, ElectionConfig(), replication,
                    MemoryTermStore(term=3))  # fmt: skip
    m.state.change_to_leader(3)
    m.leadership()
    m.checker_counts(3, m.config_log.latest_index())  # its checker was set up for the term
    assert m.mark_ready(3)
    return RoundBook(m)


@pytest.fixture
def book() -> RoundBook:
    return leader_book(ReplicationConfig(max_pending_requests_num=2))


def test_appends_of_one_turn_become_one_round(book) -> None:
    book.admit([b"a"], "g", None, "t1")
    book.admit([b"b", b"c"], "g", None, "t2")
    assert book.write_due() and not book.write_due()  # one write per turn
    w = book.write()
    assert w.error is None and w.tokens == ("t1", "t2")
    assert (w.round.first_index, w.round.last_index) == (1, 3)  # 0 is the term's entry
    assert book.outstanding == 2 and book.of_term(3) == [(w.rid, w.round)]
    fin = book.finish(w.rid, C.SUCCESS)
    assert fin.ok and fin.calls == (("t1", 1, 1), ("t2", 2, 3))
    assert book.logic.store.committed_index == 3  # read-your-writes
    assert book.outstanding == 0 and book.finish(w.rid, C.SUCCESS) is None


def test_while_a_round_waits_appends_queue_and_go_out_as_one(book) -> None:
    book.admit([b"a"], "g", None, "t1")
    book.write_due()
    first = book.write()
    book.admit([b"b"], "g", None, "t2")
    book.admit([b"c"], "g", None, "t3")
    assert not book.write_due()  # MAX_ROUNDS rounds wait
    book.finish(first.rid, C.SUCCESS)
    assert book.write_due()
    assert book.write().tokens == ("t2", "t3")


def test_a_failed_round_is_an_unknown_outcome(book) -> None:
    book.admit([b"a"], "g", None, "t1")
    book.write_due()
    w = book.write()
    fin = book.finish(w.rid, C.TERM_CHANGED)
    assert not fin.ok
    exc = fin.unknown(1, 1, "n0", "n1")
    assert isinstance(exc, OutcomeUnknownError) and exc.code == C.TERM_CHANGED
    assert exc.leader_id == "n1" and "outcome is unknown" in exc.message
    assert book.logic.store.committed_index == -1


def test_the_pending_limit_counts_queued_and_waiting_calls(book) -> None:
    for k in range(3):
        book.admit([b"x"], "g", None, k)
    with pytest.raises(LedgerError) as e:
        book.admit([b"y"], "g", None, "over")
    assert e.value.code == C.LEADER_PENDING_FULL
    assert [q[0] for q in book.queue] == [0, 1, 2]


def test_a_refused_write_keeps_no_round(book) -> None:
    book.admit([b"a"], "g", None, "t1")
    book.logic.state.change_to_candidate(4)  # deposed before the write
    book.write_due()
    w = book.write()
    assert w.round is None and w.error.code == C.NOT_LEADER and w.tokens == ("t1",)
    assert book.rounds == {} and book.outstanding == 0


def test_a_configuration_change_is_a_round_of_its_own_on_its_channel(book) -> None:
    """The leader appends a configuration as its own round, acts on it at once, and takes
    no other change until it commits; none before its term's first entry committed
    (Ongaro's fix)."""
    from rayledger.election.configuration import CONFIG_CHANNEL, Configuration

    m = book.logic
    add = Configuration.of(["n0", "n1", "n2"], ["n3"])
    with pytest.raises(LedgerError) as e:
        book.admit_config(add, "c1")  # its term's entry (0) is not committed yet
    assert e.value.code == C.LEADER_NOT_READY
    m.on_committed(3, 0)
    book.admit([b"a"], "g", None, "t1")
    book.admit_config(add, "c1")
    with pytest.raises(LedgerError) as e:
        book.admit_config(add.with_voter("n3"), "c2")  # one at a time
    assert e.value.code == C.CONFIG_CHANGE_IN_PROGRESS
    assert book.write_due()
    cfg = book.write()  # the change first, alone (a steady load never starves it)
    assert cfg.tokens == ("c1",) and m.store.get(1).channel == CONFIG_CHANNEL
    with pytest.raises(LedgerError) as e:
        book.admit_config(add.with_voter("n3"), "c2")  # appended, not committed
    assert e.value.code == C.CONFIG_CHANGE_IN_PROGRESS
    book.finish(cfg.rid, C.SUCCESS)
    assert book.write_due()
    plain = book.write()  # then the client's entries
    assert plain.tokens == ("t1",) and m.store.get(2).channel == 0
    assert m.state.peers == ("n0", "n1", "n2", "n3") and m.state.voters == ("n0", "n1", "n2")
    book.finish(plain.rid, C.SUCCESS)
    with pytest.raises(LedgerError) as e:  # committed, but the checker may count the old
        book.admit_config(add.with_voter("n3"), "c2")  # voters: two changes apart then
    assert e.value.code == C.CONFIG_CHANGE_IN_PROGRESS
    book.resolve(Resolution(3, None, [], config_index=1))  # it counts the change now
    book.admit_config(add.with_voter("n3"), "c2")  # the next one may come


def test_queued_appends_and_changes_are_refused_when_the_term_ends(book) -> None:
    """Nothing admitted in a term is written in another: appends and a change queued
    behind a round when the leader is deposed get NOT_LEADER (nothing stored), so an
    idempotent retry committed by the next leader is never written again by this one."""
    from rayledger.election.configuration import Configuration

    m = book.logic
    m.on_committed(3, 0)
    book.admit([b"a"], "g", None, "t1")
    book.write_due()
    book.write()  # a round waits
    book.admit([b"b"], "g", None, "t2", ident=(7, 0))
    book.admit_config(Configuration.of(["n0", "n1", "n2"], ["n3"]), "c1")
    book.settle_term()
    assert book.settled == [] and len(book.queue) == 1  # still leading: nothing settled
    m.state.change_to_candidate(4)
    book.settle_term()
    assert [(t, e.code) for t, e in book.take_settled()] == [
        ("t2", C.NOT_LEADER),
        ("c1", C.NOT_LEADER),
    ]
    assert book.queue == [] and not book.config_queued and not book.write_due()


def test_with_max_rounds_two_rounds_wait_side_by_side_and_finish_in_any_order(book) -> None:
    """``LedgerConfig.max_rounds``: a second round goes out while the first
    waits; a third waits for one of them."""
    book.max_rounds = 2
    spans = []
    for tok in ("t1", "t2"):
        book.admit([tok.encode()], "g", None, tok)
        assert book.write_due()
        spans.append(book.write())
    book.admit([b"t3"], "g", None, "t3")
    assert not book.write_due()  # two rounds wait
    assert book.finish(spans[1].rid, C.SUCCESS).ok  # the later one first
    assert book.write_due() and book.write().tokens == ("t3",)


@pytest.mark.parametrize("bad", [0, -1, 65, 1.5, True, "2"])
def test_max_rounds_out_of_range_is_a_coded_error(bad) -> None:
    from rayledger.actors.config import LedgerConfig
    from rayledger.storage import LedgerError

    with pytest.raises(LedgerError) as err:
        LedgerConfig(max_rounds=bad)
    assert err.value.code == C.UNEXPECTED_ARGUMENT and "max_rounds" in err.value.message
