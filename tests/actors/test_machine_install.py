"""Snapshot install on the member side, stepped by hand (no Ray): the machine
runner's core loads a snapshot sealed from the leader between batches, and a dispatcher's
view of its leader's log refuses reads below its begin and fetches the leader's snapshot."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from rayledger.actors.core import machine as mcore
from rayledger.actors.core.machine import Batch, Install, MachineCore, QueryVerdict, Rebase
from rayledger.actors.core.snapshot_policy import SnapshotConfig, SnapshotPolicy
from rayledger.replication import (
    DispatcherState,
    NotCached,
    PushEntryResponse,
    PushType,
    ReplicationConfig,
)
from rayledger.replication.dispatcher import (
    Activate,
    DispatcherLogic,
    Fetch,
    Fetched,
    FollowerAnswer,
    LeaderView,
)
from rayledger.replication.messages import TURN_END, LeaderInfo
from rayledger.storage import Entry, LedgerError, ResponseCode


@dataclass(frozen=True)
class Snap:
    index: int
    term: int
    files: tuple = ()


def entries(a: int, b: int) -> list[Entry]:
    return [Entry(i, 1, i * 10, b"x") for i in range(a, b)]


# ================================================================ MachineCore


def test_an_offered_snapshot_is_the_next_job_even_with_batches_due() -> None:
    c = MachineCore("n0", applied=4, max_batch=3)
    assert c.step(mcore.SnapshotOffered(20, "/snap/20"), 0) is True
    assert c.offered == Install(20, "/snap/20")
    job = c.step(mcore.NextJob(30), 0)
    assert job == Install(20, "/snap/20") and c.applying == job and c.offered is None
    assert c.step(mcore.NextJob(30), 0) is None  # one job at a time
    c.step(mcore.Installed(20, [], saved=-1), 0)
    assert c.applied == 20 and c.applying is None
    assert c.step(mcore.NextJob(30), 0) == Batch(21, 24)  # the log goes on from the snapshot


def test_an_offer_waits_for_the_batch_in_flight() -> None:
    c = MachineCore("n0", applied=4, max_batch=3)
    b = c.step(mcore.NextJob(20), 0)
    assert b == Batch(5, 8)
    assert c.step(mcore.SnapshotOffered(20, "/snap/20"), 0) is True
    assert c.step(mcore.NextJob(20), 0) is None  # the batch is still being applied
    c.step(mcore.BatchRead(b, entries(5, 8)), 0)
    assert c.step(mcore.BatchApplied(7), 0) == [] and c.applied == 7
    assert c.step(mcore.NextJob(20), 0) == Install(20, "/snap/20")


def test_a_machine_far_behind_applies_larger_batches() -> None:
    """More than CATCH_UP batches behind (a restart replaying its log), batches are
    CATCH_UP times larger: each costs a read and two hops besides its entries."""
    from rayledger.actors.core.machine import CATCH_UP

    c = MachineCore("n0", applied=4, max_batch=3)
    assert c.due(4 + CATCH_UP * 3) == (5, 8)  # not far behind
    assert c.due(5 + CATCH_UP * 3) == (5, 5 + CATCH_UP * 3)


@pytest.mark.parametrize("index", [4, 3, -1])
def test_an_offer_at_or_below_applied_is_refused(index) -> None:
    c = MachineCore("n0", applied=4)
    assert c.step(mcore.SnapshotOffered(index, "/old"), 0) is False
    assert c.offered is None
    assert c.step(mcore.NextJob(10), 0) == Batch(5, 11)


def test_an_offer_at_or_below_one_offered_or_loading_is_refused() -> None:
    c = MachineCore("n0", applied=4)
    assert c.step(mcore.SnapshotOffered(20, "/20"), 0) is True
    assert (
        c.step(mcore.SnapshotOffered(20, "/20-again"), 0) is False
        and c.step(mcore.SnapshotOffered(15, "/15"), 0) is False
    )
    assert c.offered == Install(20, "/20")
    assert c.step(mcore.SnapshotOffered(25, "/25"), 0) is True and c.offered == Install(
        25, "/25"
    )  # a newer one wins
    assert c.step(mcore.NextJob(30), 0) == Install(25, "/25")
    assert (
        c.step(mcore.SnapshotOffered(25, "/25"), 0) is False
        and c.step(mcore.SnapshotOffered(22, "/22"), 0) is False
    )  # 25 is loading
    assert c.offered is None
    assert c.step(mcore.SnapshotOffered(27, "/27"), 0) is True  # ahead of the one loading: next
    c.step(mcore.Installed(25, [], saved=-1), 0)
    assert c.step(mcore.NextJob(30), 0) == Install(27, "/27")


def test_a_failed_machine_takes_no_snapshot() -> None:
    c = MachineCore("n0", applied=4)
    c.step(mcore.MachineFailed("boom"), 0)
    assert (
        c.step(mcore.SnapshotOffered(20, "/20"), 0) is False
        and c.step(mcore.NextJob(30), 0) is None
    )


def test_installed_moves_applied_and_releases_the_queries_it_reaches() -> None:
    c = MachineCore("n0", applied=4)
    for index, token in ((10, "q10"), (20, "q20"), (21, "q21"), (40, "q40")):
        assert c.step(mcore.Query(index, token, 1000), 0) == QueryVerdict.WAIT
    c.step(mcore.SnapshotOffered(20, "/20"), 0)
    c.step(mcore.NextJob(30), 0)
    ready, gone, floor = c.step(mcore.Installed(20, [], saved=-1), 0)
    assert ready == ["q10", "q20"]
    assert gone == [] and floor == 0  # no policy: the machine's own save decides (none)
    assert c.applied == 20 and c.applying is None and c.stranded is False
    assert c.step(mcore.Query(20, "now", 1000), 0) == QueryVerdict.ANSWER
    assert c.step(mcore.BatchApplied(21), 0) == ["q21"]


def test_installed_with_a_policy_returns_the_floor_after_the_snapshot() -> None:
    policy = SnapshotPolicy(SnapshotConfig(every_entries=100, keep=1), last=3)
    c = MachineCore("n0", applied=4, snapshots=policy)
    c.step(mcore.SnapshotOffered(50, "/50"), 0)
    assert c.step(mcore.NextJob(60), 0) == Install(50, "/50")
    have = [Snap(3, 1), Snap(50, 2)]
    ready, gone, floor = c.step(mcore.Installed(50, have, saved=7), 0)
    assert ready == []
    assert gone == [Snap(3, 1)]  # the installed one is the one kept
    assert floor == 51 and policy.last == 50
    assert c.keep_from(7) == 51
    assert policy.due(60) is False and policy.due(150) is True  # counted from the install


def test_installed_with_a_policy_deletes_the_oldest_beyond_keep() -> None:
    policy = SnapshotPolicy(SnapshotConfig(every_entries=100, keep=2), last=3)
    c = MachineCore("n0", applied=4, snapshots=policy)
    c.step(mcore.SnapshotOffered(50, "/50"), 0)
    c.step(mcore.NextJob(60), 0)
    _, gone, floor = c.step(mcore.Installed(50, [Snap(1, 1), Snap(3, 1), Snap(50, 2)], saved=-1), 0)
    assert gone == [Snap(1, 1)]  # beyond the newest two
    # after the oldest snapshot kept (3 -> 4): a damaged newest one leaves the older one
    # and the log after it
    assert floor == 4


def test_installed_keeps_a_snapshot_of_ours_being_written_past_it() -> None:
    policy = SnapshotPolicy(SnapshotConfig(every_entries=10), last=-1)
    c = MachineCore("n0", applied=4, snapshots=policy)
    policy.begin(70)  # our own snapshot at 70 is being written
    c.step(mcore.SnapshotOffered(50, "/50"), 0)
    c.step(mcore.NextJob(60), 0)
    c.step(mcore.Installed(50, [Snap(50, 2)], saved=-1), 0)
    assert policy.taking == 70
    policy2 = SnapshotPolicy(SnapshotConfig(every_entries=10), last=-1)
    c2 = MachineCore("n1", applied=4, snapshots=policy2)
    policy2.begin(30)  # one below the installed snapshot is superseded
    c2.step(mcore.SnapshotOffered(50, "/50"), 0)
    c2.step(mcore.NextJob(60), 0)
    c2.step(mcore.Installed(50, [Snap(50, 2)], saved=-1), 0)
    assert policy2.taking is None


def test_a_machine_below_its_logs_begin_is_stranded_until_a_snapshot() -> None:
    c = MachineCore("n0", applied=4, max_batch=5, snapshots=SnapshotPolicy(SnapshotConfig()))
    assert c.step(mcore.NextJob(30, begin=10), 0) is None
    assert c.stranded is True and c.applying is None and c.failed is None
    assert c.step(mcore.NextJob(30, begin=10), 0) is None and c.stranded is True
    assert c.step(mcore.SnapshotOffered(12, "/12"), 0) is True
    assert c.step(mcore.NextJob(30, begin=10), 0) == Install(12, "/12")
    assert c.stranded is True  # until it is loaded
    c.step(mcore.Installed(12, [], saved=-1), 0)
    assert c.stranded is False and c.applied == 12
    assert c.step(mcore.NextJob(30, begin=10), 0) == Batch(13, 18)


def test_a_machine_that_takes_no_snapshots_rebases_to_its_logs_begin() -> None:
    """No snapshot will come: it continues after the reset log's begin (the RocketMQ commit
    log rebuilds its consume queues from there), once, between batches."""
    c = MachineCore("n0", applied=4, max_batch=5)
    assert c.step(mcore.NextJob(30, begin=10), 0) == Rebase(9)
    assert c.step(mcore.NextJob(30, begin=10), 0) is None  # one job at a time
    q = object()
    assert c.step(mcore.Query(10, q, 100), 0) == "wait"
    assert c.step(mcore.Rebased(9), 0) == [] and c.applied == 9 and c.stranded is False
    assert c.step(mcore.NextJob(30, begin=10), 0) == Batch(10, 15)
    assert c.step(mcore.BatchApplied(14), 0) == [q]


def test_a_machine_right_at_its_logs_begin_is_not_stranded() -> None:
    c = MachineCore("n0", applied=9, max_batch=5)
    assert c.step(mcore.NextJob(30, begin=10), 0) == Batch(10, 15)
    assert c.stranded is False


def test_a_stranded_machine_with_nothing_committed_is_not_flagged() -> None:
    c = MachineCore("n0", applied=4)
    assert c.step(mcore.NextJob(4, begin=10), 0) is None
    assert c.stranded is False


def test_an_offer_overtaken_by_the_batch_in_flight_is_not_loaded() -> None:
    c = MachineCore("n0", applied=4, max_batch=10)
    assert c.step(mcore.NextJob(30), 0) == Batch(5, 15)
    c.step(
        mcore.SnapshotOffered(8, "/8"), 0
    )  # ahead of applied (4), but inside the batch being applied
    c.step(mcore.BatchApplied(14), 0)
    job = c.step(mcore.NextJob(30), 0)
    assert job == Batch(15, 25)  # not Install(8, "/8"): the machine stands at 14


# ================================================================ LeaderView

INFO = LeaderInfo(term=2, begin=10, end=14, end_term=2, end_pos=1400, committed=12, water_mark=14)


def view() -> LeaderView:
    v = LeaderView(1 << 20)
    v.reset(INFO)
    return v


@pytest.mark.parametrize("read", ["get_term", "get_pos", "read_batch"])
@pytest.mark.parametrize("index", [0, 5, 9])
def test_a_read_below_the_leaders_begin_is_out_of_bounds(read, index) -> None:
    v = view()
    with pytest.raises(LedgerError) as e:
        getattr(v, read)(index)
    assert e.value.code == ResponseCode.INDEX_OUT_OF_BOUNDS
    assert not isinstance(e.value, NotCached)


@pytest.mark.parametrize(
    "read, kind", [("get_term", "meta"), ("get_pos", "meta"), ("read_batch", "batch")]
)
def test_a_read_at_or_above_the_begin_is_fetched(read, kind) -> None:
    v = view()
    with pytest.raises(NotCached) as e:
        getattr(v, read)(10)
    assert (e.value.kind, e.value.index) == (kind, 10)
    assert (v.get_term(14), v.get_pos(14)) == (2, 1400)  # what the leader told


def test_a_begin_learned_later_makes_an_older_read_out_of_bounds() -> None:
    v = view()
    with pytest.raises(NotCached):
        v.get_term(11)
    v.learn(LeaderInfo(2, 12, 14, 2, 1400, 12, 14))
    with pytest.raises(LedgerError) as e:
        v.get_term(11)
    assert e.value.code == ResponseCode.INDEX_OUT_OF_BOUNDS


def test_peek_snapshot_needs_a_fetch_and_take_forgets_it() -> None:
    v = view()
    with pytest.raises(NotCached) as e:
        v.peek_snapshot()
    assert e.value.kind == "snapshot"
    assert v.take_snapshot() is None  # nothing known: nothing to take
    snap = Snap(9, 1, (("a", 3, "h"),))
    v.snapshot = snap
    assert v.peek_snapshot() is snap and v.peek_snapshot() is snap
    assert v.take_snapshot() is snap
    with pytest.raises(NotCached):
        v.peek_snapshot()
    v.snapshot = None  # the leader has none: known, not fetched again
    assert v.peek_snapshot() is None


# ================================================================ DispatcherLogic

CFG = ReplicationConfig(install_chunk_bytes=2)


def logic() -> DispatcherLogic:
    d = DispatcherLogic("g", "n0", "n1", CFG)
    d.step(Activate(INFO), 0)
    return d


def _snapshot_fetch(d: DispatcherLogic):
    """Answer the first COMPARE with a follower whose log ends at 5 (below our begin 10):
    the next Ready fetches the leader's snapshot."""
    (cmp,) = d.step(TURN_END, 0).pushes
    assert cmp.type is PushType.COMPARE and cmp.first_index == 14
    answer = PushEntryResponse("g", "n1", 2, ResponseCode.INCONSISTENT_STATE, index=14,
                               begin_index=0, end_index=5)  # fmt: skip
    d.step(FollowerAnswer(cmp, answer), 0)
    assert d.core.state is DispatcherState.TRUNCATE
    r = d.step(TURN_END, 1)
    assert r.pushes == [] and d.need is not None and d.need.kind == "snapshot"
    assert r.fetch is not None and (r.fetch.term, r.fetch.kind) == (2, "snapshot")
    assert d.fetching
    return r.fetch


def test_the_snapshot_is_fetched_then_sent_in_chunks() -> None:
    d = logic()
    fetch = _snapshot_fetch(d)
    assert d.step(TURN_END, 2).fetch is None  # one fetch in flight
    snap = Snap(12, 2, (("a", 3, "h"),))
    d.step(Fetched(fetch, (snap, INFO)), 3)
    assert not d.fetching and d.view.peek_snapshot() is snap
    (c,) = d.step(TURN_END, 4).pushes
    assert c.type is PushType.INSTALL and c.snapshot.index == 12
    assert (c.snapshot.offset, c.snapshot.length, c.snapshot.total) == (0, 2, 3)
    with pytest.raises(NotCached):  # taken: the next install fetches afresh
        d.view.peek_snapshot()


def test_a_fetched_none_snapshot_means_the_plain_reset() -> None:
    d = logic()
    fetch = _snapshot_fetch(d)
    d.step(Fetched(fetch, (None, INFO)), 3)
    d.view.meta[10] = (2, 1000)  # the entry the reset names (else another fetch)
    (tr,) = d.step(TURN_END, 4).pushes
    assert tr.type is PushType.TRUNCATE and tr.reset and tr.first_index == 10
    assert (tr.entry_term, tr.entry_pos) == (2, 1000)


def test_a_snapshot_answer_of_another_term_or_none_is_dropped() -> None:
    d = logic()
    fetch = _snapshot_fetch(d)
    snap = Snap(12, 2)
    d.step(Fetched(Fetch(1, "snapshot", -1, 0, 0), (snap, INFO)), 3)  # an older term
    assert not d.fetching
    with pytest.raises(NotCached):
        d.view.peek_snapshot()
    d.step(Fetched(fetch, None), 3)  # the member no longer leads term 2
    with pytest.raises(NotCached):
        d.view.peek_snapshot()
    again = d.step(TURN_END, 4).fetch
    assert again is not None and again.kind == "snapshot"


def test_a_failed_snapshot_fetch_is_tried_again_later() -> None:
    d = logic()
    fetch = _snapshot_fetch(d)
    d.step(Fetched(fetch, failed=True), 10)
    assert d.step(TURN_END, 11).fetch is None
    again = d.step(TURN_END, 60).fetch
    assert again is not None and again.kind == "snapshot"


def test_the_snapshot_answer_teaches_the_view_the_leaders_begin() -> None:
    d = logic()
    fetch = _snapshot_fetch(d)
    moved = LeaderInfo(2, 13, 14, 2, 1400, 13, 14)
    d.step(Fetched(fetch, (Snap(12, 2, (("a", 1, "h"),)), moved)), 3)
    assert d.view.ledger_begin_index == 13
    with pytest.raises(LedgerError) as e:
        d.view.get_term(12)
    assert e.value.code == ResponseCode.INDEX_OUT_OF_BOUNDS
