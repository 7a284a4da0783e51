"""The client-session table: what a leader decides for an idempotent append,
from what its log holds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rayledger.replication.sessions import SessionTable, Verdict, born_ms, new_client_id
from rayledger.storage.codec import SESSION_DTYPE

V = Verdict


def recs(rows):
    """(index, client, seq, stamp) rows -> what the store hands the table."""
    arr = np.zeros(len(rows), SESSION_DTYPE)
    for k, (_, c, q, t) in enumerate(rows):
        arr[k] = (c, q, t, 0)
    return np.array([r[0] for r in rows], dtype=np.int64), arr


def write(t: SessionTable, rows):
    t.appended(*recs(rows))


def test_runs_merge_and_duplicates_point_at_the_originals():
    t = SessionTable(ttl_ms=1000)
    write(t, [(0, 7, 0, 10), (1, 7, 1, 10), (2, 9, 0, 10), (3, 7, 2, 11), (4, 7, 3, 11)])
    assert t.sessions[7].last_seq == 3 and t.sessions[7].runs == [[0, 0, 2, 10], [2, 3, 2, 11]]
    assert t.check(7, 4, 2, now=20).verdict is V.NEW
    c = t.check(7, 1, 2, now=20)
    assert (c.verdict, c.spans, c.known) == (V.DUPLICATE, ((1, 1), (3, 1)), 2)
    c = t.check(7, 3, 3, now=20)
    assert (c.verdict, c.spans, c.known, c.next_seq) == (V.PARTIAL, ((4, 1),), 1, 4)
    assert t.check(7, 6, 1, now=20).verdict is V.GAP
    assert t.check(9, 1, 1, now=20).verdict is V.NEW
    assert t.check(5, 0, 3, now=20).verdict is V.NEW  # a new session
    assert t.check(5, 1, 3, now=20).verdict is V.EXPIRED  # a session the log does not hold


def test_queued_appends_count_before_they_are_written():
    t = SessionTable(ttl_ms=1000)
    assert t.check(3, 5, 1, now=0, queued=4).verdict is V.NEW  # 0..4 queued in this turn
    assert t.check(3, 7, 1, now=0, queued=4).verdict is V.GAP
    write(t, [(0, 3, 0, 1)])
    assert t.check(3, 2, 1, now=1, queued=1).verdict is V.NEW
    # a retry of what is queued, not written yet: its outcome is not known yet (the client
    # asks again), never a gap (which a client takes for "not stored": it would renumber)
    assert t.check(3, 1, 2, now=1, queued=1).verdict is V.QUEUED
    assert t.check(9, 0, 1, now=1, queued=0).verdict is V.QUEUED  # a new session's first


def test_a_truncation_forgets_what_it_cut():
    t = SessionTable(ttl_ms=1000)
    write(t, [(i, 1, i, 5) for i in range(6)] + [(6, 2, 0, 5), (7, 1, 6, 5)])
    t.truncated(3)
    assert t.sessions[1].last_seq == 3 and t.sessions[1].runs == [[0, 0, 4, 5]]
    assert 2 not in t.sessions  # its only entry was cut: the session is new again
    assert t.check(1, 4, 1, now=5).verdict is V.NEW
    write(t, [(4, 1, 4, 6)])  # the same seq again, at the same index, a later stamp
    assert t.sessions[1].runs == [[0, 0, 4, 5], [4, 4, 1, 6]]  # one stamp per run
    assert t.check(1, 2, 3, now=6).spans == ((2, 2), (4, 1))


def test_sessions_expire_by_the_logs_stamps_oldest_first():
    t = SessionTable(ttl_ms=100)
    write(t, [(0, 1, 0, 0), (1, 2, 0, 50), (2, 3, 0, 120)])
    assert t.check(1, 1, 1, now=120).verdict is V.EXPIRED  # silent 120 ms > 100
    assert t.check(2, 1, 1, now=120).verdict is V.NEW
    assert 1 not in t.sessions  # forgotten as soon as the log's stamps passed its ttl
    assert t.expire(now=151) == [2] and list(t.sessions) == [3]
    write(t, [(3, 3, 1, 200)])
    assert t.next_stamp(150) == 200  # a leader's clock behind the log: the log's stamp
    assert t.next_stamp(250) == 250


def test_runs_beyond_those_kept_are_forgotten_not_rewritten():
    t = SessionTable(ttl_ms=1000, keep_runs=2)
    write(t, [(2 * i, 1, i, 0) for i in range(4)])  # four runs of one entry
    assert t.check(1, 0, 1, now=0).verdict is V.FORGOTTEN
    assert t.check(1, 3, 1, now=0).verdict is V.DUPLICATE


def test_dump_and_load_give_the_same_table():
    t = SessionTable(ttl_ms=1000)
    write(t, [(0, 1, 0, 3), (1, 2, 0, 4), (2, 1, 1, 5)])
    u = SessionTable(ttl_ms=1000)
    u.load(t.dump())
    assert u.dump() == t.dump() and list(u.sessions) == list(t.sessions)


def test_refuses_a_ttl_that_cannot_hold():
    with pytest.raises(ValueError):
        SessionTable(ttl_ms=0)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4)), min_size=1, max_size=30),
       st.integers(0, 60))  # fmt: skip
def test_the_table_answers_as_the_log_it_follows(calls, cut):
    """Against a plain model: appends of clients 0..3 in order, a truncation, then every
    possible retry is answered from exactly the entries still in the log."""
    t = SessionTable(ttl_ms=10**9)
    log, nxt = [], {}
    for client, n in calls:
        q = nxt.get(client, 0)
        assert t.check(client, q, n, now=0).verdict is V.NEW
        rows = [(len(log) + k, client, q + k, 0) for k in range(n)]
        write(t, rows)
        log += [(client, q + k) for k in range(n)]
        nxt[client] = q + n
    t.truncated(cut - 1)
    log = log[:cut]
    where = {e: i for i, e in enumerate(log)}
    for client in range(4):
        held = sorted(q for c, q in log if c == client)
        for q in held:  # answered where it is, or refused as too old: never written again
            c = t.check(client, q, 1, now=0)
            assert c.verdict in (V.DUPLICATE, V.FORGOTTEN), (client, q, c)
            if c.verdict is V.DUPLICATE:
                assert c.spans == ((where[(client, q)], 1),)
            else:
                assert q < held[-1] - t.keep_runs + 1 or not t.sessions[client].runs
        nxt_seq = held[-1] + 1 if held else 0
        assert t.check(client, nxt_seq, 1, now=0).verdict is V.NEW


def test_a_restart_rebuilds_the_table_from_the_log(tmp_path):
    from rayledger.replication.sessions import recover_sessions
    from rayledger.storage import FileStore, StoreConfig
    from rayledger.storage.codec import SESSION, SESSION_FLAG

    store = FileStore(StoreConfig(data_dir=str(tmp_path), data_segment_size=4096))
    live = recover_sessions(store, ttl_ms=10_000)
    for c in range(40):  # segments roll; a few clients, interleaved
        bodies = [SESSION.pack(c % 3 + 1, c // 3 * 2 + k, 100 + c, 0) + b"b" * 50 for k in range(2)]
        store.append_as_leader(bodies, 1, [SESSION_FLAG, SESSION_FLAG])
    store.append_as_leader([b"plain"], 1)
    store.truncate(70)
    store.close()
    again = FileStore(StoreConfig(data_dir=str(tmp_path), data_segment_size=4096))
    try:
        rebuilt = recover_sessions(again, ttl_ms=10_000)
        assert len(rebuilt) == 3 and rebuilt.last_stamp == live.last_stamp
        for c, s in live.sessions.items():  # the same sessions; the rebuild may keep runs
            r = rebuilt.sessions[c]  # the truncation took from the live table's window
            assert (r.last_seq, r.stamp) == (s.last_seq, s.stamp)
            assert all(run in r.runs for run in s.runs)
    finally:
        again.close()


def test_the_table_at_an_index_is_what_the_log_up_to_it_makes():
    t = SessionTable(ttl_ms=1000)
    write(t, [(0, 1, 0, 1), (1, 1, 1, 2), (2, 2, 0, 3), (3, 1, 2, 4)])
    at = t.at(1)
    assert [s[:3] for s in at["sessions"]] == [[1, 1, 2]] and at["last_stamp"] == 2
    assert t.sessions[1].last_seq == 2  # the table itself is untouched
    u = SessionTable(ttl_ms=1000)
    u.rebuild(at, [recs([(2, 2, 0, 3), (3, 1, 2, 4)])])
    assert u.dump() == t.dump()


def test_sessions_expired_by_an_entry_later_truncated_come_back():
    """A member whose log held an entry with a late stamp (a leader whose clock ran ahead)
    expired sessions by it; once that entry is truncated its table is again the one the
    others, which never had the entry, hold -- a retry of the session's entries is answered
    from the log, never taken as a new session's."""
    t = SessionTable(ttl_ms=100)
    write(t, [(0, 1, 0, 10), (1, 1, 1, 10), (2, 2, 0, 20)])
    t.committed(2)
    write(t, [(3, 2, 1, 500)])  # a stamp far ahead: client 1's session expires by it
    assert 1 not in t.sessions and t.check(1, 0, 1, now=500).verdict is V.EXPIRED
    others = SessionTable(ttl_ms=100)
    write(others, [(0, 1, 0, 10), (1, 1, 1, 10), (2, 2, 0, 20)])
    t.truncated(2)
    assert t.dump() == others.dump()
    assert t.check(1, 0, 2, now=30).verdict is V.DUPLICATE
    # once the expiring entry is committed, the session is gone for good
    write(t, [(3, 2, 1, 500)])
    t.committed(3)
    t.truncated(3)
    assert 1 not in t.sessions


def test_a_snapshots_table_leaves_out_expiries_by_later_entries():
    """The table a snapshot at ``index`` carries is the one the log up to ``index`` makes:
    sessions expired by later, uncommitted entries are in it."""
    t = SessionTable(ttl_ms=100)
    write(t, [(0, 1, 0, 10), (1, 2, 0, 20)])
    write(t, [(2, 2, 1, 500)])  # expires client 1's session; not committed
    at = t.at(1)
    assert [row[0] for row in at["sessions"]] == [1, 2]
    assert t.at(2)["sessions"][0][0] == 2 and len(t.at(2)["sessions"]) == 1


def test_a_retry_of_a_first_entry_that_outlived_its_session_is_never_stored_again():
    """A session whose first entry is in the log expires a TTL after that entry's stamp;
    the client retrying it (an unknown outcome) is then refused, not taken for a new
    session: the id says the session began too long ago to be new."""
    ttl = 3000
    t = SessionTable(ttl_ms=ttl)
    client = new_client_id(10_000, 5)
    assert born_ms(client) == 10_000 and client > 0
    assert t.check(client, 0, 1, now=10_000).verdict is V.NEW
    write(t, [(0, client, 0, 10_000)])
    other = new_client_id(13_500, 6)
    write(t, [(1, other, 0, 13_500)])  # a TTL later: the first session expires by it
    assert client not in t.sessions
    c = t.check(client, 0, 1, now=t.last_stamp)
    assert c.verdict is V.EXPIRED  # (NEW would store the first entry a second time)
    # a session begun less than half a TTL before the log's stamps may start
    assert t.check(new_client_id(12_000, 7), 0, 1, now=t.last_stamp).verdict is V.NEW
    assert t.check(new_client_id(11_999, 7), 0, 1, now=t.last_stamp).verdict is V.EXPIRED


@given(born=st.integers(0, 50_000), ahead=st.integers(0, 1500), later=st.integers(0, 60_000))
def test_no_session_that_stored_an_entry_starts_again_once_expired(born, ahead, later):
    """Whatever the times: a client clock at most half a TTL ahead of its leader's stamp,
    and any later stamp that expired the session, its first sequence is never NEW again."""
    ttl = 3000
    t = SessionTable(ttl_ms=ttl)
    client = new_client_id(born + ahead, 1)  # the client's clock runs ``ahead``
    write(t, [(0, client, 0, born)])  # the leader stamps its first entry at ``born``
    write(t, [(1, new_client_id(0, 2), 0, born + later)])
    if client not in t.sessions:
        assert t.check(client, 0, 1, now=t.last_stamp).verdict is V.EXPIRED


def test_a_batch_cut_in_the_middle_leaves_the_table_its_remaining_entries_make():
    """A follower takes several rounds (several stamps) in one batch, and a restart takes
    the whole log at once: a truncation inside that batch must leave the table the kept
    entries make -- the expiry by a kept entry's stamp stays, a cut entry's stamp goes."""
    t = SessionTable(ttl_ms=100)
    write(t, [(0, 1, 0, 10)])
    t.committed(0)
    write(
        t, [(1, 2, 0, 20), (2, 2, 1, 200), (3, 2, 2, 300)]
    )  # entry 2's stamp expires client 1's session
    t.truncated(2)
    kept = SessionTable(ttl_ms=100)
    write(kept, [(0, 1, 0, 10)])
    write(kept, [(1, 2, 0, 20)])
    write(kept, [(2, 2, 1, 200)])
    assert t.dump() == kept.dump()
    assert 1 not in t.sessions and t.sessions[2].stamp == 200


def test_a_restart_expires_by_committed_entries_for_good():
    """A member restarting with a committed log rebuilds its table from it: sessions that
    committed entries expired are forgotten for good (a truncation cannot reach them)."""
    t = SessionTable(ttl_ms=100)
    t.committed(3)
    write(t, [(0, 1, 0, 10), (1, 2, 0, 20), (2, 2, 1, 500), (3, 2, 2, 510)])
    assert 1 not in t.sessions and t._expired == []
    t.truncated(2)
    assert 1 not in t.sessions


def test_entries_a_snapshot_holds_do_not_count_twice_when_a_reset_log_fills_in():
    """A member installs a leader's snapshot at index 3 while its log restarts at the
    leader's begin, 0: the leader then sends entries 0..3 again.  The snapshot's table
    already holds them; counted again they would bring back sessions it had expired."""
    full = SessionTable(ttl_ms=100)
    rows = [(0, 1, 0, 10), (1, 2, 0, 20), (2, 2, 1, 200), (3, 2, 2, 210)]
    write(full, rows)
    assert 1 not in full.sessions
    t = SessionTable(ttl_ms=100)
    t.reset(0)
    t.rebuild(full.at(3), [], covered=3)
    write(t, rows)  # the reset log fills in below the snapshot
    write(t, [(4, 2, 3, 220)])
    write(full, [(4, 2, 3, 220)])
    assert t.dump() == full.dump()


def test_a_table_that_lacks_the_sessions_below_a_reset_starts_no_session_until_it_has_them():
    """A log reset to begin at 50 with no snapshot table there (the member's own was found
    damaged): a session this table lacks may be one whose entries lie below 50, so a young
    first append is neither new nor expired -- it waits (UNKNOWN) until a snapshot's table
    at 49 or later is loaded.  Later sequences of a session it lacks are refused as ever."""
    born = new_client_id(1_000, 1)
    t = SessionTable(ttl_ms=10_000)
    write(t, [(10, 5, 0, 900)])
    t.reset(50)
    assert t.unknown_upto == 49 and not t.sessions
    assert t.check(born, 0, 1, now=1_200).verdict is V.UNKNOWN
    assert t.check(born, 3, 1, now=1_200).verdict is V.EXPIRED
    again = SessionTable(ttl_ms=10_000)
    again.load(t.dump())  # a snapshot taken meanwhile says it lacks them too
    assert again.check(born, 0, 1, now=1_200).verdict is V.UNKNOWN
    leader = SessionTable(ttl_ms=10_000)
    write(leader, [(10, 5, 0, 900), (49, born, 0, 1_100)])
    t.rebuild(leader.at(49), [], covered=49)  # the leader's snapshot at 49 came
    assert t.unknown_upto == -1
    assert t.check(born, 0, 1, now=1_200).verdict is V.DUPLICATE
    assert t.check(new_client_id(1_150, 2), 0, 1, now=1_200).verdict is V.NEW


def test_a_restart_of_a_compacted_log_lacks_the_sessions_below_its_begin(tmp_path):
    """The table a restart rebuilds from a log that begins at 2 lacks what the entries
    before it held until a snapshot's table is loaded (MemberLogic does that next)."""
    from rayledger.replication.sessions import recover_sessions
    from rayledger.storage import FileStore, StoreConfig

    store = FileStore(StoreConfig(data_dir=str(tmp_path)))
    try:
        assert recover_sessions(store, ttl_ms=1_000).unknown_upto == -1
        store.reset(2, 0)
        assert recover_sessions(store, ttl_ms=1_000).unknown_upto == 1
    finally:
        store.close()


def test_a_truncation_that_cuts_every_run_kept_leaves_the_stamp_of_the_newest_entry_kept():
    """A session's oldest runs fall out of the window kept; a truncation then cuts every run
    still kept.  Its stamp must go back to its newest remaining entry's, as on a member that
    never had the cut entries: the cut entries' later stamp would keep it alive longer."""
    t = SessionTable(ttl_ms=10_000, keep_runs=2)
    write(t, [(0, 7, 0, 100), (1, 9, 0, 100), (2, 7, 1, 200)])  # two runs of 7 kept
    write(t, [(3, 7, 2, 5_000), (4, 9, 1, 5_000), (5, 7, 3, 5_000)])  # the first falls out
    assert t.sessions[7].runs[0][1] == 3
    t.truncated(2)
    s = t.sessions[7]
    assert (s.last_seq, s.stamp, s.runs) == (1, 200, [])
    never = SessionTable(ttl_ms=10_000, keep_runs=2)
    write(never, [(0, 7, 0, 100), (1, 9, 0, 100), (2, 7, 1, 200)])
    assert {c: (x.last_seq, x.stamp) for c, x in t.sessions.items()} == {
        c: (x.last_seq, x.stamp) for c, x in never.sessions.items()
    }
    again = SessionTable(ttl_ms=10_000, keep_runs=2)
    again.load(t.dump())  # a snapshot carries it
    assert again.sessions[7].before == t.sessions[7].before


def test_a_session_brought_back_by_a_truncation_loses_its_own_cut_entries_too():
    """Client 7 writes at 5 and 6; a later entry of client 9 at 8 expires it; a truncation
    to 4 cuts all three.  Client 7 comes back from the expired list -- and its entries are
    gone with the rest, so it is not in the table at all, as on a member that never had
    them."""
    t = SessionTable(ttl_ms=100)
    write(t, [(0, 9, 0, 10), (5, 7, 0, 20), (6, 7, 1, 20), (8, 9, 1, 500)])
    assert 7 not in t.sessions  # expired by entry 8's stamp
    t.truncated(4)
    never = SessionTable(ttl_ms=100)
    write(never, [(0, 9, 0, 10)])
    assert {c: (s.last_seq, s.stamp) for c, s in t.sessions.items()} == {
        c: (s.last_seq, s.stamp) for c, s in never.sessions.items()
    }


def test_a_truncation_below_a_snapshot_keeps_what_the_table_took_from_it():
    """A member installs the leader's snapshot at 10 while its own log, not reset, holds an
    old leader's entries from 4 on; the leader then cuts them (a TRUNCATE to 3).  The
    sessions of entries up to 10 came from the snapshot: committed, they stay."""
    leader = SessionTable(ttl_ms=10_000)
    write(leader, [(5, 7, 0, 100), (9, 7, 1, 200), (10, 8, 0, 200)])
    t = SessionTable(ttl_ms=10_000)
    t.rebuild(leader.at(10), [], covered=10)
    t.truncated(3)
    assert t.dump() == leader.dump()


def test_a_session_expired_then_written_again_comes_back_as_it_was_when_both_are_cut():
    """Client 7's session is expired by entry 8 (another client's, much later); a leader
    that never expired it writes client 7's next sequence at 9.  A truncation to 6 cuts
    both: client 7 is back at its last entry kept, 5."""
    t = SessionTable(ttl_ms=100)
    write(t, [(0, 9, 0, 10), (5, 7, 0, 20), (8, 9, 1, 500), (9, 7, 1, 500)])
    t.truncated(6)
    never = SessionTable(ttl_ms=100)
    write(never, [(0, 9, 0, 10), (5, 7, 0, 20)])
    assert {c: (s.last_seq, s.stamp) for c, s in t.sessions.items()} == {
        c: (s.last_seq, s.stamp) for c, s in never.sessions.items()
    }


def test_a_table_lacking_sessions_takes_sessions_begun_after_its_bound_and_first_calls():
    """Lacking the sessions below 50, the table's first stamped entry after them (at 52,
    stamped 2_000) bounds their stamps: a session begun more than half a TTL after that
    cannot be one of them, nor can one whose first call was never answered unknown.  A
    retry of a first entry begun before the bound waits (UNKNOWN)."""
    t = SessionTable(ttl_ms=10_000)
    t.reset(50)
    old = new_client_id(1_500, 1)
    assert t.check(old, 0, 1, now=1_600).verdict is V.UNKNOWN
    assert t.check(old, 0, 1, now=1_600, maybe_stored=False).verdict is V.NEW
    write(t, [(52, 9, 0, 2_000)])
    assert t.unknown_bound == (52, 2_000)
    assert t.check(new_client_id(6_900, 2), 0, 1, now=7_000).verdict is V.UNKNOWN
    assert t.check(new_client_id(7_001, 2), 0, 1, now=7_100).verdict is V.NEW
    assert t.check(old, 0, 1, now=2_000).verdict is V.UNKNOWN
    assert t.next_stamp(0) == 2_000  # never below the stamps of the sessions lacked


def test_a_table_lacking_sessions_knows_them_once_committed_stamps_show_them_expired():
    """Every session lacked was stamped by 2_000: a committed entry stamped more than a
    TTL later has expired them all (a member that held them forgot them there), so the
    table no longer lacks any.  Not before that entry is committed: a truncation of it
    would bring them back on the member that held them."""
    t = SessionTable(ttl_ms=1_000)
    t.reset(50)
    write(t, [(52, 9, 0, 2_000), (53, 9, 1, 2_500)])
    assert t.unknown_upto == 49
    write(t, [(54, 9, 2, 3_001)])
    assert t.unknown_upto == 49  # not committed yet
    t.truncated(53)
    t.committed(60)
    assert t.unknown_upto == 49  # the entry that expired them is gone
    write(t, [(54, 9, 2, 3_002)])
    assert t.unknown_upto == -1 and t.unknown_bound is None  # committed already
    u = SessionTable(ttl_ms=1_000)
    u.reset(50)
    write(u, [(52, 9, 0, 2_000), (53, 9, 1, 3_001)])
    u.committed(52)
    assert u.unknown_upto == 49
    u.committed(53)
    assert u.unknown_upto == -1


def test_the_bound_of_the_sessions_lacked_goes_with_a_truncation_and_a_snapshot():
    """A truncation that cuts the entry bounding the sessions lacked leaves no bound until
    the next stamped entry; a snapshot's table carries the bound below its index, and one
    rebuilt from it whose stamps run a TTL past that bound lacks nothing."""
    t = SessionTable(ttl_ms=1_000)
    t.reset(50)
    write(t, [(52, 9, 0, 2_000)])
    t.truncated(51)
    assert t.unknown_upto == 49 and t.unknown_bound is None
    write(t, [(52, 8, 0, 1_900), (53, 8, 1, 2_950)])
    assert t.unknown_bound == (52, 1_900)
    assert t.at(51)["unknown_bound"] is None  # a snapshot below the bound has none
    doc = t.at(53)
    assert doc["unknown_bound"] == [52, 1_900] and doc["unknown_upto"] == 49
    again = SessionTable(ttl_ms=1_000)
    again.rebuild(doc, [], covered=53)
    assert again.unknown_upto == -1  # 2_950 > 1_900 + TTL, and committed
    t.truncated(52)
    write(t, [(53, 8, 1, 2_800)])
    again.rebuild(t.at(53), [], covered=53)
    assert again.unknown_upto == 49 and again.unknown_bound == (52, 1_900)
