"""The vote tally of one election round: DLedger's ``voteForQuorumResponses`` counters and
the decision ladder that ``parseVoteResult`` applies to them.

Pure: answers in, a decision out, no clock or state (like etcd's ``quorum.VoteResult``).
The elector turns a decision's ``wait`` into its next vote time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .messages import ParseResult, VoteResponse, VoteResult


class Wait(enum.Enum):
    """How long to wait before the next round, on top of the usual random vote interval."""

    NONE = "none"  # no wait: passed, or vote again at once
    INTERVAL = "interval"  # the random vote interval
    PLUS_HEARTBEAT_TIMEOUT = "plus_heartbeat_timeout"  # a leader exists: give it time
    PLUS_MAX_VOTE_INTERVAL = "plus_max_vote_interval"  # others hold longer logs


@dataclass(frozen=True)
class Decision:
    result: ParseResult
    wait: Wait
    raise_term_to: int | None = None  # a member knows a larger term: become candidate there


@dataclass
class VoteTally:
    """One round's counters; the candidate's own vote is counted like any other."""

    round_id: int
    term: int
    pre_vote: bool
    started_ms: int
    deadline_ms: int
    waiting: set[str] = field(default_factory=set)
    known_max_term_in_group: int = -1
    all_num: int = 0
    valid_num: int = 0
    accepted_num: int = 0
    not_ready_term_num: int = 0
    bigger_ledger_num: int = 0
    already_has_leader: bool = False

    def count(self, resp: VoteResponse | None) -> None:
        """One voter's answer (None: the call failed)."""
        self.all_num += 1
        if resp is None:
            return
        result = resp.result
        if result is not VoteResult.UNKNOWN:
            self.valid_num += 1
        if result is VoteResult.ACCEPT:
            self.accepted_num += 1
        elif result is VoteResult.REJECT_ALREADY_HAS_LEADER:
            self.already_has_leader = True
        elif result in (
            VoteResult.REJECT_TERM_SMALL_THAN_LEDGER,
            VoteResult.REJECT_EXPIRED_VOTE_TERM,
        ):
            self.known_max_term_in_group = max(self.known_max_term_in_group, resp.term)
        elif result in (
            VoteResult.REJECT_EXPIRED_LEDGER_TERM,
            VoteResult.REJECT_SMALL_LEDGER_END_INDEX,
        ):
            self.bigger_ledger_num += 1
        elif result is VoteResult.REJECT_TERM_NOT_READY:
            self.not_ready_term_num += 1

    def done(self, members: int) -> bool:
        """Everyone answered, or the outcome can no longer change."""
        q = quorum(members)
        return (
            self.all_num >= members
            or self.already_has_leader
            or self.accepted_num >= q
            or self.accepted_num + self.not_ready_term_num >= q
        )

    def decide(self, members: int) -> Decision:
        """DLedger's parseVoteResult ladder, first match wins."""
        q = quorum(members)
        if self.known_max_term_in_group > self.term:
            return Decision(
                ParseResult.WAIT_TO_VOTE_NEXT, Wait.INTERVAL, self.known_max_term_in_group
            )
        if self.already_has_leader:
            return Decision(ParseResult.WAIT_TO_REVOTE, Wait.PLUS_HEARTBEAT_TIMEOUT)
        if self.valid_num < q:
            return Decision(ParseResult.WAIT_TO_REVOTE, Wait.INTERVAL)
        if self.valid_num - self.bigger_ledger_num < q:
            return Decision(ParseResult.WAIT_TO_REVOTE, Wait.PLUS_MAX_VOTE_INTERVAL)
        if self.accepted_num >= q:
            return Decision(ParseResult.PASSED, Wait.NONE)
        if self.accepted_num + self.not_ready_term_num >= q:
            return Decision(ParseResult.REVOTE_IMMEDIATELY, Wait.NONE)
        return Decision(ParseResult.WAIT_TO_VOTE_NEXT, Wait.INTERVAL)


def quorum(members: int) -> int:
    return members // 2 + 1
