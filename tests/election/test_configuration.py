"""Membership as data: configurations, the single-server change
rules, and a member's view of the configurations in its log."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rayledger.election.configuration import ConfigLog, Configuration, check_change
from rayledger.storage import LedgerError, ResponseCode


def _majorities_meet(a: Configuration, b: Configuration) -> bool:
    """Every majority of ``a``'s voters shares a member with every majority of ``b``'s."""
    return a.quorum + b.quorum > len(set(a.voters) | set(b.voters))


def _code(fn) -> ResponseCode:
    with pytest.raises(LedgerError) as e:
        fn()
    return e.value.code


def test_a_configuration_knows_its_voters_learners_and_quorum() -> None:
    c = Configuration.of(["n0", "n1", "n2"], ["n3"])
    assert c.quorum == 2 and c.members == ("n0", "n1", "n2", "n3")
    assert c.role_of("n1") == "voter" and c.role_of("n3") == "learner" and c.role_of("x") is None
    assert "n3" in c and "x" not in c
    assert Configuration.decode(c.encode()) == c
    assert _code(lambda: Configuration.decode(b"{nope")) == ResponseCode.CORRUPT_LOG
    assert _code(lambda: Configuration.of([])) == ResponseCode.ILLEGAL_MEMBER_STATE
    assert _code(lambda: Configuration.of(["a"], ["a"])) == ResponseCode.UNEXPECTED_ARGUMENT


def test_changes_refuse_bad_input_and_leave_the_configuration_as_it_was() -> None:
    c = Configuration.of(["n0", "n1", "n2"], ["n3"])
    assert _code(lambda: c.with_learner("n1")) == ResponseCode.UNEXPECTED_MEMBER
    assert _code(lambda: c.with_voter("n0")) == ResponseCode.UNEXPECTED_MEMBER
    assert _code(lambda: c.without("nx")) == ResponseCode.UNKNOWN_MEMBER
    one = Configuration.of(["n0"])
    assert _code(lambda: one.without("n0")) == ResponseCode.ILLEGAL_MEMBER_STATE
    assert c == Configuration.of(["n0", "n1", "n2"], ["n3"])  # frozen: nothing changed
    assert c.with_voter("n3") == Configuration.of(["n0", "n1", "n2", "n3"])  # promoted
    assert c.without("n3").learners == () and c.without("n0").voters == ("n1", "n2")


def test_check_change_enforces_one_change_at_a_time_and_the_leaders_own_commit() -> None:
    c = Configuration.of(["n0", "n1", "n2"])
    add = c.with_learner("n3")
    assert check_change(c, add, pending=False, committed_own_term=True) == add
    code = _code(lambda: check_change(c, add, pending=True, committed_own_term=True))
    assert code == ResponseCode.CONFIG_CHANGE_IN_PROGRESS
    code = _code(lambda: check_change(c, add, pending=False, committed_own_term=False))
    assert code == ResponseCode.LEADER_NOT_READY
    two = Configuration.of(["n0", "n3", "n4"])  # n1, n2 out and n3, n4 in: four voters
    code = _code(lambda: check_change(c, two, pending=False, committed_own_term=True))
    assert code == ResponseCode.ILLEGAL_MEMBER_STATE
    assert not _majorities_meet(c, Configuration.of(["n0", "n1", "n2", "n3", "n4"]))


_ops = st.lists(
    st.tuples(st.sampled_from(["learner", "voter", "remove"]), st.integers(0, 7)), max_size=40
)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_every_single_server_change_keeps_majorities_overlapping(ops) -> None:
    """Whatever sequence of allowed changes: each configuration's majorities meet the next
    one's (so two leaders of one term would need a member voting twice)."""
    c = Configuration.of(["n0", "n1", "n2"])
    for op, k in ops:
        m = f"n{k}"
        try:
            nxt = {"learner": c.with_learner, "voter": c.with_voter, "remove": c.without}[op](m)
        except LedgerError:
            continue  # refused: nothing changes
        nxt = check_change(c, nxt, pending=False, committed_own_term=True)
        assert c.voter_change(nxt) <= 1 and _majorities_meet(c, nxt), (c, nxt)
        c = nxt


def test_a_config_log_follows_appends_truncations_compactions_and_resets() -> None:
    base = Configuration.of(["n0", "n1", "n2"])
    log = ConfigLog.initial(base.voters)
    assert log.latest() == base and not log.pending(-1)
    c1 = base.with_learner("n3")
    log.appended(10, c1)
    assert log.latest() == c1 and log.pending(9) and not log.pending(10)  # acted on uncommitted
    assert log.committed(9) == base and log.committed(10) == c1
    assert _code(lambda: log.appended(10, c1)) == ResponseCode.INCONSISTENT_INDEX
    c2 = c1.with_voter("n3")
    log.appended(20, c2)
    assert log.truncated(15) is True and log.latest() == c1  # the uncommitted one is gone
    assert log.truncated(15) is False
    log.appended(16, c2)
    log.compacted(17)  # both entries left the log: the later one becomes the base
    assert log.base == c2 and log.base_index == 16 and log.entries == []
    again = ConfigLog.from_json(log.to_json())
    assert again == log and again.latest() == c2
    c3 = Configuration.of(["n1", "n2", "n3"])
    assert log.reset(c3, 40) is True and log.latest() == c3 and log.latest_index() == 40


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_a_store_tells_its_config_watch_of_every_configuration_entry(kind, tmp_path) -> None:
    """Leader appends, follower appends (the vectorised check and the entry-by-entry one),
    truncations, resets and compactions reach the member's ConfigLog, and it is saved."""
    from rayledger.election.configuration import CONFIG_CHANNEL, ConfigWatch
    from rayledger.storage import FileStore, MemoryStore, StoreConfig

    def store(name: str):
        if kind == "memory":
            return MemoryStore(StoreConfig(data_segment_size=4096))
        return FileStore(StoreConfig(data_dir=str(tmp_path / name), data_segment_size=4096))

    base = Configuration.of(["n0", "n1", "n2"])
    c1, c2 = base.with_learner("n3"), base.with_learner("n3").with_voter("n3")
    leader, follower = store("l"), store("f")
    saved: list[dict] = []
    lw, fw = ConfigWatch(ConfigLog(base)), ConfigWatch(ConfigLog(base, save=saved.append))
    leader.watch_channel(CONFIG_CHANNEL, lw)
    follower.watch_channel(CONFIG_CHANNEL, fw)
    leader.append_as_leader([b"a", b"b"], 1)
    leader.append_as_leader([c1.encode()], 1, channel=CONFIG_CHANNEL)
    leader.append_as_leader([b"c" * 50] * 30, 1)  # rolls segments: the slow check
    leader.append_as_leader([c2.encode()], 2, channel=CONFIG_CHANNEL)
    assert lw.log.latest() == c2 and [i for i, _ in lw.log.entries] == [2, 33]
    for first in (0, 3, 33):  # the follower gets the leader's bytes in three batches
        end = {0: 2, 3: 32, 33: 33}[first]
        follower.append_as_follower(leader.read_batch(first, max_count=end - first + 1))
    assert fw.log.entries == lw.log.entries and saved[-1] == fw.log.to_json()
    assert follower.get(2).channel == CONFIG_CHANNEL and follower.get(3).channel == 0
    follower.truncate(20)  # the uncommitted change is gone: the member acts on c1 again
    assert fw.log.latest() == c1 and ConfigLog.from_json(saved[-1]).latest() == c1
    follower.update_committed_index(10)
    follower.reset(40, leader.get_pos(33) + 4096)  # a reset past everything it held
    assert fw.log.entries == [] and fw.log.base == c1 and fw.log.base_index == 2
    for s in (leader, follower):
        s.close()
