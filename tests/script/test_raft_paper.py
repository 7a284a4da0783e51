"""One test per claim of the Raft paper (Ongaro and Ousterhout, 2014) that applies to
rayledger, named after its section, as etcd's raft_paper_test.go does.  They drive the real
cores through the script environment (interaction.py), without Ray.

Not covered here: section 6 (membership changes: tests/simulation/test_membership_sim.py
and tests/actors/test_membership_core.py) and section 7 (snapshots:
tests/actors/test_snapshot_policy.py and the simulations).  Section 8's reads are tested
in tests/actors/test_reads_logic.py.
"""

from __future__ import annotations

import pytest
from interaction import GROUP, Env
from rayledger.election import Role
from rayledger.election.messages import HeartbeatRequest, VoteRequest, VoteResult
from rayledger.replication.checker import BecomeLeader, Report
from rayledger.replication.messages import TURN_END, Push, PushEntryRequest, PushType
from rayledger.storage import ResponseCode


def settled(n: int = 3, leader: str = "n0") -> Env:
    env = Env()
    env.run(f"add-nodes {n}")
    env.run(f"elect {leader}")
    env.run("run 500")
    return env


def role(env: Env, mid: str) -> Role:
    return env.nodes[mid].logic.state.role


def term(env: Env, mid: str) -> int:
    return env.nodes[mid].logic.state.current_term


def vote(env: Env, voter: str, candidate: str, t: int, end: tuple[int, int] = (-1, -1)):
    req = VoteRequest(group=GROUP, local_id=candidate, remote_id=voter, leader_id=candidate,
                      term=t, ledger_end_index=end[0], ledger_end_term=end[1])  # fmt: skip
    return env.nodes[voter].logic.handle_election(req, env.now)[0]


def heartbeat(env: Env, to: str, leader: str, t: int):
    req = HeartbeatRequest(group=GROUP, local_id=leader, remote_id=to, leader_id=leader, term=t)
    return env.nodes[to].logic.handle_election(req, env.now)[0]


def log_of(env: Env, mid: str) -> list[tuple[int, bytes]]:
    s = env.disks[mid][0]
    return [(s.get(i).term, bytes(s.get(i).body)) for i in range(0, s.ledger_end_index + 1)]


# -- 5.1 Raft basics ------------------------------------------------------------------------


def test_5_1_a_server_with_a_smaller_term_takes_the_larger_one():
    env = settled()
    heartbeat(env, "n1", "n2", term(env, "n1") + 5)
    env.run("tick 10 n1")
    assert term(env, "n1") == 5


def test_5_1_a_leader_that_learns_a_newer_term_reverts_to_follower_state():
    """DLedger answers a newer term TERM_NOT_READY and takes the term at its next tick."""
    env = settled()
    assert role(env, "n0") is Role.LEADER
    resp = vote(env, "n0", "n1", term(env, "n0") + 1, end=(100, 100))
    assert resp.result is VoteResult.REJECT_TERM_NOT_READY and role(env, "n0") is not Role.LEADER
    env.run("tick 10 n0")
    assert term(env, "n0") == 1


def test_5_1_a_request_with_a_stale_term_is_rejected():
    env = settled()
    env.run("partition n0 n1,n2")
    env.run("run 2000")  # n1 or n2 leads term 1
    assert max(term(env, "n1"), term(env, "n2")) == 1
    n1_end = (env.disks["n1"][0].ledger_end_index, env.disks["n1"][0].ledger_end_term)
    assert vote(env, "n1", "n0", 0, n1_end).result is VoteResult.REJECT_EXPIRED_VOTE_TERM
    assert heartbeat(env, "n1", "n0", 0).code == ResponseCode.EXPIRED_TERM
    push = PushEntryRequest(group=GROUP, leader_id="n0", remote_id="n1", term=0,
                            type=PushType.COMMIT, commit_index=0)  # fmt: skip
    (answer,) = env.nodes["n1"].logic.on_push(Push(push, None), env.now)
    assert answer[1].code == ResponseCode.EXPIRED_TERM


# -- 5.2 Leader election --------------------------------------------------------------------


def test_5_2_a_follower_stays_one_while_it_hears_from_its_leader():
    env = settled()
    env.run("run 5000")
    assert [role(env, m) for m in ("n0", "n1", "n2")] == [Role.LEADER, Role.FOLLOWER, Role.FOLLOWER]
    assert term(env, "n1") == 0


def test_5_2_a_follower_that_hears_nothing_for_an_election_timeout_becomes_a_candidate():
    env = settled()
    env.run("crash n0")
    env.run("tick 310 n1")  # heartbeat timeout: 3 x 100 ms
    assert role(env, "n1") is Role.CANDIDATE


def test_5_2_a_candidate_with_votes_from_a_majority_wins():
    env = Env()
    env.run("add-nodes 5")
    env.run("crash n3")
    env.run("crash n4")
    env.run("elect n0")
    assert role(env, "n0") is Role.LEADER  # n0, n1 and n2 of five


def test_5_2_each_server_votes_for_at_most_one_candidate_in_a_term():
    env = Env()
    env.run("add-nodes 3")
    assert vote(env, "n2", "n0", 0).result is VoteResult.ACCEPT
    assert vote(env, "n2", "n1", 0).result is VoteResult.REJECT_ALREADY_VOTED
    assert vote(env, "n2", "n0", 0).result is VoteResult.ACCEPT  # the same candidate again


def test_5_2_a_candidate_that_hears_from_a_leader_of_its_term_becomes_a_follower():
    env = Env()
    env.run("add-nodes 3")
    assert role(env, "n1") is Role.CANDIDATE
    heartbeat(env, "n1", "n0", 0)
    assert role(env, "n1") is Role.FOLLOWER and env.nodes["n1"].logic.state.leader_id == "n0"


def test_5_2_split_votes_resolve_with_randomized_timeouts():
    env = Env()
    env.run("add-nodes 5")
    env.run("run 5000")  # everyone campaigns on its own random timer
    leaders = [m for m in env.nodes if role(env, m) is Role.LEADER]
    assert len(leaders) == 1


# -- 5.3 Log replication --------------------------------------------------------------------


def test_5_3_an_entry_commits_once_a_majority_stores_it():
    env = settled(5)
    env.run("partition n0,n1,n2 n3,n4")
    env.run("propose n0 x")
    env.run("run 300")
    assert env.disks["n0"][0].committed_index == 1  # n0, n1, n2 of five
    assert env.disks["n3"][0].ledger_end_index == 0


def test_5_3_a_follower_refuses_entries_whose_predecessor_it_does_not_hold():
    env = settled()
    leader_log = env.disks["n0"][0]
    env.run("crash n2")
    env.run("propose n0 a b")
    env.run("run 300")
    batch = leader_log.read_batch(2)  # entry 2 without entry 1 before it on n2
    push = PushEntryRequest(group=GROUP, leader_id="n0", remote_id="n2", term=0,
                            type=PushType.APPEND, first_index=2, count=1, batch=batch)  # fmt: skip
    env.run("restart n2")
    env.run("tick 100 n0")
    env.run("stabilize")
    before = env.disks["n2"][0].ledger_end_index
    assert before < push.first_index - 1, "n2 already holds entry 1: nothing tested"
    answers = env.nodes["n2"].logic.on_push(Push(push, None), env.now)
    # queued (no answer yet) or refused, never written after a gap nor acknowledged
    assert env.disks["n2"][0].ledger_end_index == before
    assert all(resp.code != ResponseCode.SUCCESS for _, resp in answers), answers


def test_5_3_the_leader_forces_its_log_on_followers():
    env = settled()
    env.run("partition n0 n1,n2")
    env.run("propose n0 orphan")
    env.run("run 2000")
    env.run("propose n1 kept")
    env.run("run 300")
    env.run("heal")
    env.run("run 500")
    assert log_of(env, "n0") == log_of(env, "n1") == log_of(env, "n2")
    assert b"orphan" not in [body for _, body in log_of(env, "n0")]


# -- 5.4 Safety -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "end, result",
    [
        ((5, 0), VoteResult.REJECT_EXPIRED_LEDGER_TERM),  # the voter's last term is newer
        ((0, 1), VoteResult.REJECT_SMALL_LEDGER_END_INDEX),  # same last term, shorter log
        ((1, 1), VoteResult.ACCEPT),  # as up to date as the voter
    ],
)
def test_5_4_1_a_voter_refuses_a_candidate_whose_log_is_less_up_to_date(end, result):
    env = settled()
    env.run("partition n0 n1,n2")
    env.run("run 2000")
    new = next(m for m in ("n1", "n2") if role(env, m) is Role.LEADER)
    voter = "n1" if new == "n2" else "n2"
    assert log_of(env, voter)[-1][0] == 1  # the voter's log ends at (1, term 1)
    t = term(env, voter) + 1
    first = vote(env, voter, "n0", t, end).result  # a newer term: DLedger takes it first
    env.run(f"tick 10 {voter}")
    again = vote(env, voter, "n0", t, end).result
    assert (first if result is not VoteResult.ACCEPT else again) is result


def test_5_4_2_entries_of_an_older_term_commit_only_with_one_of_the_current_term():
    """Figure 8: counting replicas never commits an older term's entry by itself."""
    env = settled()
    checker = env.nodes["n0"].checker
    store = env.disks["n0"][0]
    env.run("partition n0,n1 n2")
    env.run("propose n0 x")  # index 1, term 0
    env.run("deliver n1")  # n1 stores it; its answer is still in flight
    env.run("partition n0 n1,n2")
    env.run("run 2000")  # n1 leads term 1 and commits x with its own empty entry
    assert env.disks["n1"][0].committed_index == 2
    # a leader of term 2 whose water marks show a majority on an older entry only
    checker.step(BecomeLeader(2, 3, env.nodes["n0"].logic.leader_info()), env.now)
    checker.step(Report(2, "n1", 1), env.now)
    committed = checker.step(TURN_END, env.now).committed_index
    assert committed < 1 or store.get_term(committed) == 2


def test_5_5_a_push_delivered_twice_changes_nothing():
    env = settled()
    env.run("propose n0 once")
    pushes = [m for m in env.flight if isinstance(m.payload, PushEntryRequest) and m.dst == "n1"]
    env.run("run 300")
    log = log_of(env, "n1")
    env.nodes["n1"].logic.on_push(Push(pushes[0].payload, None), env.now)
    assert log_of(env, "n1") == log
