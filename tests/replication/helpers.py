"""Small builders shared by the replication unit tests."""

from __future__ import annotations

from rayledger.election import MemberState, MemoryTermStore
from rayledger.replication import PushEntryRequest, PushEntryResponse, PushType, ReplicationConfig
from rayledger.storage import MemoryStore, ResponseCode, StoreConfig

GROUP = "g"
LEADER = "l"
FOLLOWER = "f"
OTHER = "x"
PEERS = [LEADER, FOLLOWER, OTHER]


def store_with(terms: list[int], tag: bytes = b"e", size: int = 10) -> MemoryStore:
    """A store whose entry ``i`` has term ``terms[i]`` and body ``tag + i`` padded to ``size``."""
    store = MemoryStore(StoreConfig(data_segment_size=1 << 20, index_segment_size=32 * 1024))
    i = 0
    while i < len(terms):
        j = i
        while j < len(terms) and terms[j] == terms[i]:
            j += 1
        bodies = [(tag + str(k).encode()).ljust(size, b".") for k in range(i, j)]
        store.append_as_leader(bodies, terms[i])
        i = j
    return store


def follower_state(term: int = 2, leader: str | None = LEADER) -> MemberState:
    st = MemberState(GROUP, FOLLOWER, PEERS, MemoryTermStore(term=term))
    if leader is not None:
        st.change_to_follower(term, leader)
    return st


def push(kind: PushType, term: int = 2, **kw) -> PushEntryRequest:
    return PushEntryRequest(
        group=GROUP, leader_id=LEADER, remote_id=FOLLOWER, term=term, type=kind, **kw
    )


def append_req(
    leader_store: MemoryStore, first: int, count: int, term: int = 2, commit: int = -1
) -> PushEntryRequest:
    batch = leader_store.read_batch(first, max_count=count)
    return push(
        PushType.APPEND,
        term,
        first_index=first,
        count=batch.count,
        batch=batch,
        commit_index=commit,
    )


def resp(
    code: ResponseCode = ResponseCode.SUCCESS,
    index: int = -1,
    begin: int = 0,
    end: int = -1,
    term: int = 2,
) -> PushEntryResponse:
    return PushEntryResponse(
        GROUP, FOLLOWER, term, code, index=index, begin_index=begin, end_index=end
    )


def config(**kw) -> ReplicationConfig:
    return ReplicationConfig(**kw)
