"""State-machine snapshots (issue 23, first part), without Ray: the Applier opens a machine
from its newest snapshot that verifies and the runner core says when one is due."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rayledger.actors.machine import Applier, MachineContext
from rayledger.actors.snapshot_policy import SnapshotConfig
from rayledger.integration.kv.machine import KvMachine, set_command
from rayledger.storage import Entry


def _entries(first: int, n: int) -> list[Entry]:
    out = []
    for i in range(first, first + n):
        body = set_command(f"k{i}", i).replace(b'"0000000000"', b'"%010d"' % i)
        out.append(Entry(index=i, term=1, pos=i * 100, body=body))
    return out


def _take(applier: Applier, index: int) -> None:
    """What the runner does when the core says a snapshot is due."""
    writer = applier.machine.snapshot()
    tmp = applier.snapshots.begin(index, 1)
    writer(tmp)
    applier.snapshots.commit(tmp, index, 1)
    applier.core.snapshots.taken(index, applier.snapshots.list())


def _ctx(d) -> MachineContext:
    return MachineContext("g", "n0", str(d), {})


def test_snapshots_are_due_every_n_entries_and_the_newest_k_stay(tmp_path) -> None:
    a = Applier(KvMachine(), _ctx(tmp_path), snapshots=SnapshotConfig(every_entries=10, keep=2))
    taken = []
    for first in range(0, 50, 5):
        batch = _entries(first, 5)
        a.apply(batch)
        index = a.core.snapshot_due(batch)
        if index is not None:
            _take(a, index)
            taken.append(index)
    assert taken == [9, 19, 29, 39, 49]
    gone = a.core.snapshots.taken(49, a.snapshots.list())
    assert [m.index for m in gone] == [9, 19, 29]  # beyond the newest two
    for m in gone:
        a.snapshots.delete(m)
    assert [m.index for m in a.snapshots.list()] == [39, 49]
    assert a.core.keep_from(a.saved) == 50  # the log may go up to the newest snapshot


def test_a_machine_that_lost_its_own_state_starts_from_its_newest_valid_snapshot(tmp_path):
    a = Applier(KvMachine(), _ctx(tmp_path), snapshots=SnapshotConfig(every_entries=10))
    a.apply(_entries(0, 10))
    _take(a, 9)
    a.apply(_entries(10, 10))
    _take(a, 19)
    (Path(tmp_path) / "kv.json").unlink()  # the machine's own file is gone
    newest = sorted((Path(tmp_path) / "snapshots").iterdir())[-1]
    data = json.loads((newest / "kv.json").read_text())
    data["data"]["k0"] = ["tampered", 0]
    (newest / "kv.json").write_text(json.dumps(data))  # and the newest snapshot is damaged
    b = Applier(KvMachine(), _ctx(tmp_path), snapshots=SnapshotConfig(every_entries=10))
    assert b.applied == 9  # the older, whole snapshot; the log replays from 10
    assert b.machine.query({"get": "k0"}) == [0, 0]
    assert b.machine.query({"get": "k15"}) is None
    shutil.rmtree(newest)


def test_the_byte_trigger_counts_the_applied_bodies(tmp_path) -> None:
    cfg = SnapshotConfig(every_entries=0, every_bytes=3 * len(_entries(0, 1)[0].body))
    a = Applier(KvMachine(), _ctx(tmp_path), snapshots=cfg)
    due = []
    for first in range(6):
        batch = _entries(first, 1)
        a.apply(batch)
        due.append(a.core.snapshot_due(batch))
        if due[-1] is not None:
            _take(a, due[-1])
    assert due == [None, None, 2, None, None, 5]


def test_a_machine_without_snapshots_keeps_the_log_from_what_it_saved(tmp_path) -> None:
    a = Applier(KvMachine(), _ctx(tmp_path))
    a.apply(_entries(0, 5))
    b = Applier(KvMachine(), _ctx(tmp_path))  # reopened: it saved up to 4 itself
    assert b.applied == 4 and b.core.keep_from(b.saved) == 5
