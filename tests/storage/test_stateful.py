"""Model-based test: any sequence of operations keeps every entry what was last written there.

Tiny segments (4 KiB data, 8-unit index) make rolls, padding and index
segment boundaries happen constantly.  The file store is also closed and
reopened, crashed (no final flush or checkpoint) and reopened, and cleaned.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from rayledger.storage import EntryBatch, FileStore, LedgerError, MemoryStore, ResponseCode
from rayledger.storage.codec import HEADER_SIZE, encode_entries

from .helpers import abandon, small_config

body_st = st.binary(max_size=40).map(lambda b: b * 25)  # 0..1000 bytes, compressible shrink
batch_st = st.lists(body_st, min_size=1, max_size=6)


class StoreMachine(RuleBasedStateMachine):
    file = True

    def __init__(self):
        super().__init__()
        # crashes are simulated on the page cache, so real fsyncs would only cost time
        self._real_sync = (os.fsync, os.fdatasync)
        os.fsync = os.fdatasync = lambda fd: None
        self.dir = tempfile.mkdtemp(prefix="rl-stateful-") if self.file else None
        self.store = self._open()
        self.model: dict[int, tuple[int, bytes]] = {}
        self.begin = 0
        self.end = -1
        self.committed = -1
        self.term = 1

    def _open(self):
        if self.file:
            return FileStore(small_config(self.dir))
        return MemoryStore(small_config())

    def teardown(self):
        self.store.close()
        os.fsync, os.fdatasync = self._real_sync
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- writes -------------------------------------------------------------------
    @rule(batch=batch_st, bump=st.booleans())
    def append_leader(self, batch, bump):
        self.term += bump
        a = self.store.append_as_leader(batch, self.term)
        assert a.first_index == self.end + 1
        for k, body in enumerate(batch):
            self.model[a.first_index + k] = (self.term, body)
        self.end += len(batch)

    @rule(batch=batch_st, bump=st.booleans())
    def append_follower(self, batch, bump):
        """Encode the batch as a leader with this layout would, and push it."""
        self.term += bump
        s = self.store
        sizes = [HEADER_SIZE + len(b) for b in batch]
        positions = s._data.positions_for(sizes)
        prev = 0 if s._chain is None else s._chain
        data, _ = encode_entries(batch, self.end + 1, self.term, positions, prev)
        s.append_as_follower(EntryBatch(self.end + 1, len(batch), data))
        for k, body in enumerate(batch):
            self.model[self.end + 1 + k] = (self.term, body)
        self.end += len(batch)

    @rule(data=st.data())
    def truncate(self, data):
        low = max(self.committed, self.begin - 1)
        k = data.draw(st.integers(low, max(low, self.end)))
        self.store.truncate(k)
        for i in range(k + 1, self.end + 1):
            self.model.pop(i, None)
        self.end = min(self.end, k)

    @precondition(lambda self: self.committed >= 0)
    @rule(data=st.data())
    def truncate_below_committed_is_refused(self, data):
        k = (
            data.draw(st.integers(self.begin - 1, self.committed - 1))
            if self.committed > self.begin - 1
            else None
        )
        if k is None:
            return
        try:
            self.store.truncate(k)
        except LedgerError as e:
            assert e.code.name == "INCONSISTENT_STATE"
        else:
            raise AssertionError("truncate below the committed index went through")

    @rule(data=st.data())
    def commit(self, data):
        if self.end < self.begin:
            return
        k = data.draw(st.integers(self.begin - 1, self.end))
        got = self.store.update_committed_index(k)
        self.committed = max(self.committed, k)
        assert got == self.committed

    @rule(skip=st.integers(1, 5), pos_gap=st.integers(0, 9000))
    def reset(self, skip, pos_gap):
        begin = max(self.end, self.committed) + skip
        pos = self.store.write_pos + pos_gap
        if 0 < pos % self.store.config.data_segment_size < HEADER_SIZE:
            with pytest.raises(LedgerError) as info:  # no entry can start there
                self.store.reset(begin, pos)
            assert info.value.code == ResponseCode.UNEXPECTED_ARGUMENT
            return
        self.store.reset(begin, pos)
        self.model.clear()
        self.begin, self.end = begin, begin - 1
        self.term += 1

    # -- file store only ----------------------------------------------------------
    @precondition(lambda self: self.file)
    @rule()
    def reopen(self):
        self.store.close()
        self.store = self._open()
        assert self.store.recovery.dropped_bytes == 0

    @precondition(lambda self: self.file)
    @rule(flush=st.booleans())
    def crash_and_reopen(self, flush):
        if flush:
            self.store.flush()
        abandon(self.store)
        self.store = self._open()
        assert self.store.recovery.dropped_bytes == 0
        # the committed index may come back lower (it is checkpointed lazily), never higher
        assert self.store.committed_index <= self.committed
        self.committed = self.store.committed_index

    @precondition(lambda self: self.file)
    @rule()
    def force_clean(self):
        self.store.disk_ratio = lambda: 0.87
        try:
            self.store.clean()
        finally:
            self.store.disk_ratio = lambda: 0.1
        new_begin = self.store.ledger_begin_index
        assert new_begin - 1 <= max(self.committed, self.begin - 1)
        for i in range(self.begin, new_begin):
            self.model.pop(i, None)
        self.begin = max(self.begin, new_begin)

    # -- invariants ---------------------------------------------------------------
    @invariant()
    def matches_model(self):
        s = self.store
        assert (s.ledger_begin_index, s.ledger_end_index) == (self.begin, self.end)
        assert s.committed_index == self.committed
        if self.end >= self.begin:
            assert s.ledger_end_term == self.model[self.end][0]
            got = s.get_range(self.begin, self.end + 1)
            assert [(e.index, e.term, e.body) for e in got] == [
                (i, *self.model[i]) for i in range(self.begin, self.end + 1)
            ]
            for i in (self.begin, self.end, (self.begin + self.end) // 2):
                e = s.get(i)
                assert (e.term, e.body) == self.model[i] and e.pos == s.get_pos(i)
            t = self.model[self.end][0]
            first = min(i for i in self.model if self.model[i][0] == t)
            assert s.first_index_of_term(t) == first
        else:
            assert s.ledger_end_term == -1


class MemoryStoreMachine(StoreMachine):
    file = False


_settings = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestFileStoreModel = StoreMachine.TestCase
TestFileStoreModel.settings = _settings
TestMemoryStoreModel = MemoryStoreMachine.TestCase
TestMemoryStoreModel.settings = settings(_settings, max_examples=40)
