"""A state machine stranded below its log's begin asks the leader for a snapshot
(MachineCore.snapshot_wanted), and a dispatcher's logic fetches its leader's newest
snapshot for it though the logs match -- stepped by hand, no Ray."""

from __future__ import annotations

from dataclasses import dataclass, replace

from rayledger.actors.core import machine as mcore
from rayledger.actors.core.machine import Install, MachineCore
from rayledger.actors.core.snapshot_policy import SnapshotConfig, SnapshotPolicy
from rayledger.replication import DispatcherState, PushEntryResponse, PushType, ReplicationConfig
from rayledger.replication.dispatcher import Activate, DispatcherLogic, Fetched, FollowerAnswer
from rayledger.replication.messages import TURN_END, LeaderInfo
from rayledger.storage import ResponseCode


@dataclass(frozen=True)
class Snap:
    index: int
    term: int
    files: tuple = ()


def core(applied: int = -1) -> MachineCore:
    return MachineCore("n0", applied=applied, max_batch=5,
                       snapshots=SnapshotPolicy(SnapshotConfig()))  # fmt: skip


# ================================================================ MachineCore


def test_a_machine_below_its_logs_begin_wants_a_snapshot_at_the_point_before_it() -> None:
    c = core(applied=-1)
    assert c.snapshot_wanted(begin=114) == 113
    assert c.snapshot_wanted(begin=0) == -1  # its log holds everything it needs
    assert core(applied=112).snapshot_wanted(begin=114) == 113
    assert core(applied=113).snapshot_wanted(begin=114) == -1  # right at the begin


def test_a_machine_that_takes_no_snapshots_or_failed_wants_none() -> None:
    assert MachineCore("n0", applied=-1).snapshot_wanted(begin=114) == -1  # it rebases
    c = core()
    c.step(mcore.MachineFailed("boom"), 0)
    assert c.snapshot_wanted(begin=114) == -1


def test_it_stops_asking_once_a_snapshot_that_far_is_offered_or_loading() -> None:
    c = core()
    assert c.step(mcore.SnapshotOffered(50, "/50"), 0) is True  # not far enough
    assert c.snapshot_wanted(begin=114) == 113
    assert c.step(mcore.SnapshotOffered(2000, "/2000"), 0) is True
    assert c.snapshot_wanted(begin=114) == -1
    assert c.step(mcore.NextJob(2100, begin=114), 0) == Install(2000, "/2000")
    assert c.snapshot_wanted(begin=114) == -1  # loading
    c.step(mcore.Installed(2000, [], saved=-1), 0)
    assert c.snapshot_wanted(begin=114) == -1 and c.applied == 2000 and not c.stranded


def test_a_stranded_machine_asks_until_the_snapshot_is_loaded() -> None:
    c = core()
    assert c.step(mcore.NextJob(300, begin=114), 0) is None and c.stranded
    assert c.snapshot_wanted(begin=114) == 113
    assert c.step(mcore.SnapshotOffered(241, "/241"), 0)
    assert c.step(mcore.NextJob(300, begin=114), 0) == Install(241, "/241")
    c.step(mcore.Installed(241, [], saved=-1), 0)
    assert c.step(mcore.NextJob(300, begin=114), 0).start == 242  # applies from its log again


# ================================================================ DispatcherLogic

INFO = LeaderInfo(term=2, begin=10, end=14, end_term=2, end_pos=1400, committed=14, water_mark=14)


def test_the_logic_fetches_the_newest_snapshot_for_a_machine_that_asks() -> None:
    d = DispatcherLogic("g", "n0", "n1", ReplicationConfig(install_chunk_bytes=2))
    d.step(Activate(INFO), 0)
    (cmp,) = d.step(TURN_END, 0).pushes
    ok = PushEntryResponse("g", "n1", 2, ResponseCode.SUCCESS, index=14, begin_index=10,
                           end_index=14)  # fmt: skip
    d.step(FollowerAnswer(cmp, ok), 0)
    assert d.core.state is DispatcherState.APPEND
    (commit,) = d.step(TURN_END, 1000).pushes
    assert commit.type is PushType.COMMIT
    d.step(FollowerAnswer(commit, replace(ok, snapshot_wanted=9)), 1000)
    r = d.step(TURN_END, 1000)
    assert r.pushes == [] and r.fetch is not None and r.fetch.kind == "snapshot"
    assert r.fetch.index == 9  # the index the machine needs: the leader snapshots that far
    d.step(Fetched(r.fetch, (Snap(12, 2, (("a", 3, "h"),)), INFO)), 1001)
    (c,) = d.step(TURN_END, 1001).pushes
    assert c.type is PushType.INSTALL and c.snapshot.index == 12
    assert d.core.state is DispatcherState.INSTALL


def test_an_idle_leader_snapshots_at_once_when_a_follower_needs_one_further() -> None:
    c = MachineCore("n0", applied=140, max_batch=5,
                    snapshots=SnapshotPolicy(SnapshotConfig(every_entries=1000), last=86))  # fmt: skip
    assert c.step(mcore.SnapshotAsked(98, begin=0), 0) == 140  # idle: cut where it stands
    assert c.step(mcore.SnapshotAsked(98, begin=0), 0) is None  # one being written


def test_a_busy_machine_snapshots_after_the_batch_that_reaches_the_index() -> None:
    c = MachineCore("n0", applied=10, max_batch=5,
                    snapshots=SnapshotPolicy(SnapshotConfig(every_entries=1000)))  # fmt: skip
    batch = c.step(mcore.NextJob(committed=20), 0)
    assert c.step(mcore.SnapshotAsked(12, begin=0), 0) is None  # a batch is applying
    c.step(mcore.BatchApplied(batch.stop - 1), 0)
    assert c.step(mcore.SnapshotDue([], begin=0), 0) == 15
