"""State-machine snapshots, without Ray: the Applier opens a machine
from its newest snapshot that verifies and the runner core says when one is due."""

from __future__ import annotations

import shutil
from pathlib import Path

from machinecheck import apply
from rayledger.actors.core import machine as mcore
from rayledger.actors.core.snapshot_policy import SnapshotConfig
from rayledger.actors.machine import Applier, MachineContext, StateMachine
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
        apply(a, batch)
        index = a.core.step(mcore.SnapshotDue(batch), 0)
        if index is not None:
            _take(a, index)
            taken.append(index)
    assert taken == [9, 19, 29, 39, 49]
    gone = a.core.snapshots.taken(49, a.snapshots.list())
    assert [m.index for m in gone] == [9, 19, 29]  # beyond the newest two
    for m in gone:
        a.snapshots.delete(m)
    assert [m.index for m in a.snapshots.list()] == [39, 49]
    # the log may go up to the oldest snapshot kept: a damaged newest one leaves the
    # older one and the log after it
    assert a.core.keep_from(a.saved) == 40


def test_a_restarted_machine_starts_from_its_newest_valid_snapshot(tmp_path):
    """The KV machine keeps no file of its own: a restart loads the newest snapshot that
    verifies -- here the newest is damaged, so the older one -- and the log replays after."""
    a = Applier(KvMachine(), _ctx(tmp_path), snapshots=SnapshotConfig(every_entries=10))
    apply(a, _entries(0, 10))
    _take(a, 9)
    apply(a, _entries(10, 10))
    _take(a, 19)
    assert Applier(KvMachine(), _ctx(tmp_path)).core.applied == 19  # the newest, when whole
    newest = sorted((Path(tmp_path) / "snapshots").iterdir())[-1]
    raw = bytearray((newest / "kv.arrow").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (newest / "kv.arrow").write_bytes(bytes(raw))  # the newest snapshot is damaged
    b = Applier(KvMachine(), _ctx(tmp_path), snapshots=SnapshotConfig(every_entries=10))
    assert b.core.applied == 9  # the older, whole snapshot; the log replays from 10
    assert b.machine.query({"get": "k0"}) == [0, 0]
    assert b.machine.query({"get": "k15"}) is None
    shutil.rmtree(newest)


def test_the_byte_trigger_counts_the_applied_bodies(tmp_path) -> None:
    cfg = SnapshotConfig(every_entries=0, every_bytes=3 * len(_entries(0, 1)[0].body))
    a = Applier(KvMachine(), _ctx(tmp_path), snapshots=cfg)
    due = []
    for first in range(6):
        batch = _entries(first, 1)
        apply(a, batch)
        due.append(a.core.step(mcore.SnapshotDue(batch), 0))
        if due[-1] is not None:
            _take(a, due[-1])
    assert due == [None, None, 2, None, None, 5]


class _SavingMachine(StateMachine):
    """A machine that saves where it stands itself and takes no snapshots."""

    def open(self, ctx: MachineContext) -> int:
        self.path = Path(ctx.data_dir) / "applied"
        return int(self.path.read_text()) if self.path.exists() else -1

    def apply(self, entries: list[Entry]) -> None:
        self.path.write_text(str(entries[-1].index))


def test_a_machine_without_snapshots_keeps_the_log_from_what_it_saved(tmp_path) -> None:
    a = Applier(_SavingMachine(), _ctx(tmp_path))
    apply(a, _entries(0, 5))
    assert a.snapshots is None and a.shelf is None
    b = Applier(_SavingMachine(), _ctx(tmp_path))  # reopened: it saved up to 4 itself
    assert b.core.applied == 4 and b.core.keep_from(b.saved) == 5


def test_the_kv_snapshot_is_sorted_and_holds_values_of_every_kind(tmp_path) -> None:
    from rayledger.integration.kv.machine import put_command, read_snapshot

    m = KvMachine()
    bodies = [set_command("b", {"n": [1, None]}), put_command("a", b"\x00\xff"),
              set_command("c", "s"), put_command("d", b"")]  # fmt: skip
    m.apply([Entry(index=i, term=1, pos=0, body=b) for i, b in enumerate(bodies)])
    m.snapshot()(str(tmp_path))
    data, applied, cas = read_snapshot(str(tmp_path / "kv.arrow"))
    assert list(data) == ["a", "b", "c", "d"] and applied == 3 and cas == {}
    assert data == m.data and data["a"] == (b"\x00\xff", 0) and data["b"] == ({"n": [1, None]}, 0)


def test_the_machine_never_sees_configuration_entries(tmp_path) -> None:
    """An entry on the configuration channel is the group's; the machine applies the
    client entries around it and stands past it."""
    from rayledger.election.configuration import CONFIG_CHANNEL, Configuration

    a = Applier(KvMachine(), _ctx(tmp_path))
    seen = []
    inner = a.machine.apply
    a.machine.apply = lambda es: (seen.extend(e.index for e in es), inner(es))  # type: ignore[method-assign]
    batch = _entries(0, 3)
    cfg = Entry(index=3, term=1, pos=300, body=Configuration.of(["a"]).encode(),
                channel=CONFIG_CHANNEL)  # fmt: skip
    apply(a, [*batch, cfg, *_entries(4, 2)])
    assert seen == [0, 1, 2, 4, 5] and a.core.applied == 5
    apply(a, [Entry(index=6, term=1, pos=600, body=b"{}", channel=CONFIG_CHANNEL)])
    assert seen == [0, 1, 2, 4, 5] and a.core.applied == 6
