"""The leader's membership decisions (election/membership.py), without Ray: what a request
becomes, when a learner is promoted and a replaced member removed, which lost members get
a replacement and where."""

from __future__ import annotations

import pytest
from rayledger.actors import LedgerConfig
from rayledger.election.configuration import Configuration
from rayledger.election.membership import (
    GONE,
    Membership,
    Op,
    Spawn,
    Transfer,
    check_live_quorum,
    check_node,
    choose_node,
)
from rayledger.storage import LedgerError, ResponseCode

C0 = Configuration.of(["n0", "n1", "n2"])


def _code(fn) -> ResponseCode:
    with pytest.raises(LedgerError) as e:
        fn()
    return e.value.code


def test_requests_become_single_server_configurations() -> None:
    m = Membership("n0")
    add = m.propose(C0, Op.ADD, "n3")
    assert add.learners == ("n3",) and add.joining == (("n3", ""),) and add.voters == C0.voters
    assert m.propose(C0, Op.ADD_LEARNER, "l1").joining == ()
    rep = m.propose(C0, Op.REPLACE, "n3", "n1")
    assert rep.joining == (("n3", "n1"),) and rep.replacement_of("n1") == "n3"
    assert m.propose(C0, Op.REMOVE, "n2").voters == ("n0", "n1")
    assert m.propose(add, Op.PROMOTE, "n3").voters == ("n0", "n1", "n2", "n3")
    # the leader itself leaves: it hands over first, to the voter that stores the most
    m.progress("n1", 10)
    m.progress("n2", 12)
    assert m.propose(C0, Op.REMOVE, "n0") == Transfer("n2")


def test_bad_requests_are_refused_with_their_code() -> None:
    m = Membership("n0")
    assert _code(lambda: m.propose(C0, Op.ADD, "n1")) == ResponseCode.UNEXPECTED_MEMBER
    assert _code(lambda: m.propose(C0, Op.REMOVE, "nx")) == ResponseCode.UNKNOWN_MEMBER
    assert _code(lambda: m.propose(C0, "grow", "n3")) == ResponseCode.UNEXPECTED_ARGUMENT
    assert _code(lambda: m.propose(C0, Op.ADD, "a/b")) == ResponseCode.UNEXPECTED_ARGUMENT
    assert _code(lambda: m.propose(C0, Op.REPLACE, "n3", "nx")) == ResponseCode.UNKNOWN_MEMBER
    assert _code(lambda: m.propose(C0, Op.PROMOTE, "n1")) == ResponseCode.ILLEGAL_MEMBER_STATE
    one = Configuration.of(["n0"])
    assert _code(lambda: m.propose(one, Op.REMOVE, "n0")) == ResponseCode.ILLEGAL_MEMBER_STATE
    rep = m.propose(C0, Op.REPLACE, "n3", "n1")
    code = _code(lambda: m.propose(rep, Op.REPLACE, "n4", "n1"))
    assert code == ResponseCode.CONFIG_CHANGE_IN_PROGRESS


def test_a_plan_is_carried_out_in_single_steps() -> None:
    m = Membership("n0", promote_lag=100)
    rep = m.propose(C0, Op.REPLACE, "n3", "n1")
    assert m.due(rep, 1000) is None  # no progress report from n3 yet
    m.progress("n3", 850)
    assert m.due(rep, 1000) is None  # 150 behind
    m.progress("n3", 950)
    promoted = m.due(rep, 1000)
    assert promoted.is_voter("n3") and promoted.voter_change(rep) == 1
    removed = m.due(promoted, 1000)
    assert "n1" not in removed and removed.joining == () and removed.voter_change(promoted) == 1
    assert m.due(removed, 1000) is None
    # the member to leave leads: it hands leadership to its replacement first -- once that
    # one is known caught up in this term; else to the voter caught up the furthest, and
    # with no progress known yet, not yet (seed 93306: a leader re-elected in its term
    # handed over again and again to a replacement that had fallen behind and could not win)
    leaving = Membership("n1")
    assert leaving.due(promoted, 1000) is None
    leaving.progress("n2", 990)
    assert leaving.due(promoted, 1000) == Transfer("n2")
    leaving.progress("n3", 995)
    assert leaving.due(promoted, 1000) == Transfer("n3")


def test_a_learners_replacement_stays_a_learner() -> None:
    m = Membership("n0", promote_lag=10)
    with_learner = C0.with_learner("l1")
    rep = m.propose(with_learner, Op.REPLACE, "l2", "l1")
    m.progress("l2", 100)
    after = m.due(rep, 100)
    assert after.voters == C0.voters and after.learners == ("l2",) and after.joining == ()


def test_ids_are_never_reused() -> None:
    c = C0.with_learner("n3").with_voter("n3").without("n3")
    assert c.fresh_id() == "n4" and Configuration.decode(c.encode()).next_id == 4


def test_lost_members_are_replaced_on_a_free_node_one_at_a_time() -> None:
    m = Membership("n0", replace_lost_after_ms=1000)
    nodes = {"n0": "A", "n1": "B", "n2": "C"}
    assert m.lost(C0, ["A", "C", "D"], nodes, 0) is None  # B dead, not for long yet
    spawn = m.lost(C0, ["A", "C", "D"], nodes, 1500)
    assert spawn == Spawn("n3", "D", "n1", C0.with_learner("n3", replaces="n1"))
    assert m.lost(C0, ["A", "C", "D"], nodes, 1600) is None  # one at a time
    m.spawn_done("n3", ok=False)  # it failed: the next view tries again, another id
    again = m.lost(C0, ["A", "C", "D"], nodes, 1700)
    assert again.member == "n4" and again.node == "D"
    # no free node: it waits and says so
    m2 = Membership("n0", replace_lost_after_ms=0)
    assert m2.lost(C0, ["A", "C"], nodes, 0) is None and m2.waiting == ("n1",)
    assert m2.lost_count(C0) == 1
    assert Membership("n0").lost(C0, ["A"], nodes, 10**9) is None  # healing off


def test_nodes_and_live_quorum_checks() -> None:
    nodes = {"n0": "A", "n1": "B"}
    assert choose_node(["A", "B", "C"], nodes) == "C"
    assert choose_node(["A", "B"], nodes) is None
    assert choose_node(["A"], {"n0": "A"}) == "A"  # one node: that node
    assert check_node("C", ["A", "B", "C"], nodes) == "C"
    assert _code(lambda: check_node("Z", ["A", "B"], nodes)) == ResponseCode.NODE_UNAVAILABLE
    assert _code(lambda: check_node("A", ["A", "B"], nodes)) == ResponseCode.NODE_UNAVAILABLE
    after = C0.without("n2")
    assert check_live_quorum(after, ["n0", "n1"]) == after
    assert _code(lambda: check_live_quorum(after, ["n0"])) == ResponseCode.NO_LIVE_QUORUM


def test_a_replacement_removed_before_the_next_view_is_replaced_again() -> None:
    """The transport started and added the replacement, then an operator removed it before
    the leader's next view of the nodes: the lost member gets another replacement at once,
    not after ``spawn_wait_ms``."""
    m = Membership("n0", replace_lost_after_ms=0)
    nodes = {"n0": "A", "n1": "B", "n2": "C"}
    first = m.lost(C0, ["A", "C", "D"], nodes, 0)
    m.spawn_done(first.member, ok=True)  # added (as a learner replacing n1) ...
    again = m.lost(C0, ["A", "C", "D", "E"], nodes, 100)  # ... and removed meanwhile
    assert again is not None and again.replaces == "n1" and again.member != first.member


def test_a_replaced_member_leaves_only_while_a_live_majority_stays() -> None:
    """The last step of a replacement removes the old member only when the voters after it
    keep a live majority: with another voter's node lost, removing a live one would leave
    the group with no majority that can answer."""
    m = Membership("n0", replace_lost_after_ms=10_000)
    cfg = Configuration.of(["n0", "n1", "n2", "n4"]).with_learner("n3", replaces="n2")
    cfg = cfg.with_voter("n3")  # five voters, n3 caught up to replace n2
    nodes = {"n0": "A", "n1": "B", "n2": "C", "n3": "D", "n4": "E"}
    m.lost(cfg, ["A", "C", "D"], nodes, 0)  # n1's and n4's nodes are lost
    assert m.due(cfg, 100) is None  # {n0, n1, n3, n4}: 2 of 4 live, no majority: wait
    m.lost(cfg, ["A", "C", "D", "E"], nodes, 1)  # n4 is back
    assert m.due(cfg, 100) == cfg.without("n2")  # {n0, n1, n3, n4}: 3 of 4 live


def test_a_change_of_voters_needs_a_live_majority_after_it() -> None:
    """The leader refuses an operator's change that leaves its voters without a majority on
    live nodes as far as it knows (NO_LIVE_QUORUM), whoever asks: the group could never
    commit again, nor change back."""
    m = Membership("n0", replace_lost_after_ms=10_000)
    m.lost(C0, ["A", "C"], {"n0": "A", "n1": "B", "n2": "C"}, 0)  # n1's node is lost
    assert _code(lambda: m.check_live(C0, C0.without("n0"))) == ResponseCode.NO_LIVE_QUORUM
    assert m.check_live(C0, C0.without("n1")) == C0.without("n1")  # the lost one may go
    assert m.check_live(C0, C0.with_learner("n3")) == C0.with_learner("n3")  # voters kept


def test_a_replacement_stopped_as_failed_but_added_all_the_same_is_removed() -> None:
    """The transport stopped a replacement whose add it took for failed, though the add
    went through: the learner would never catch up and its plan never end.  The leader
    removes it, and the next view of the nodes replaces the lost member again."""
    m = Membership("n0", replace_lost_after_ms=0)
    nodes = {"n0": "A", "n1": "B", "n2": "C"}
    spawn = m.lost(C0, ["A", "C", "D"], nodes, 0)
    m.spawn_done(spawn.member, ok=False)
    added = spawn.config  # the add went through all the same
    removed = m.stopped_spawns(added)
    assert removed == added.without(spawn.member) and removed.voters == C0.voters
    assert removed.members == C0.members and not removed.joining
    assert m.stopped_spawns(removed) is None  # removed: nothing more to do
    again = m.lost(C0, ["A", "C", "D", "E"], nodes, 100)
    assert again is not None and again.replaces == "n1"


def test_a_later_leader_removes_a_stopped_replacement_it_learns_of_from_the_view() -> None:
    """The leader that stopped a replacement whose add went through crashed before it
    removed it: the next leader knows nothing of that, but Ray's view says the learner's
    process is GONE.  It removes the learner, and the lost member is replaced again
    (before: the plan stood for good, and the lost member was never replaced)."""
    first = Membership("n0", replace_lost_after_ms=0)
    nodes = {"n0": "A", "n1": "B", "n2": "C"}
    spawn = first.lost(C0, ["A", "C", "D"], nodes, 0)
    added = spawn.config  # added, then stopped as failed by a leader that is gone now
    later = Membership("n2", replace_lost_after_ms=0)
    view = {**nodes, spawn.member: "D"}
    assert later.stopped_spawns(added, view) is None  # it runs: its plan goes on
    assert later.lost(added, ["A", "C", "D", "E"], view, 10) is None  # under way
    view[spawn.member] = GONE
    removed = later.stopped_spawns(added, view)
    assert removed == added.without(spawn.member)
    again = later.lost(removed, ["A", "C", "D", "E"], nodes, 20)
    assert again is not None and again.replaces == "n1" and again.member != spawn.member


def test_a_replacement_whose_change_may_be_written_is_not_stopped() -> None:
    """A replacement whose change ended unknown (no commit seen in time, or the term ended)
    may be in the log and be promoted: stopping it could leave the voters without a
    majority (the all-features simulation: voters n0 (lost), n1, n2 and the stopped n5, two
    of four left for good).  A change refused before it was written stops it."""
    nodes = {"n0": "A", "n1": "B", "n2": "C"}
    for code in (ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, ResponseCode.TERM_CHANGED):
        m = Membership("n0", replace_lost_after_ms=0)
        spawn = m.lost(C0, ["A", "C", "D"], nodes, 0)
        assert m.spawn_done(spawn.member, ok=False, code=code) is False
        assert m.stopped_spawns(spawn.config) is None  # kept, as a member if it is one
    for code in (ResponseCode.NOT_LEADER, ResponseCode.NO_LIVE_QUORUM, None):
        m = Membership("n0", replace_lost_after_ms=0)
        spawn = m.lost(C0, ["A", "C", "D"], nodes, 0)
        assert m.spawn_done(spawn.member, ok=False, code=code) is True
    assert Membership("n0").spawn_done("n9", ok=True) is False


@pytest.mark.parametrize(("lost_s", "every_s"), [(60.0, 5.0), (24.0, 2.0), (8.0, 1.0), (0.0, 1.0)])
def test_the_leader_looks_at_the_nodes_a_twelfth_of_the_loss_time(lost_s, every_s) -> None:
    assert LedgerConfig(replace_lost_after_s=lost_s).node_watch_interval_s() == every_s
