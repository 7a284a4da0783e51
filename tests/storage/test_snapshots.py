"""SnapshotStore (storage/snapshots.py): a snapshot is on disk whole or not at all, and a
damaged one is found by its checksums."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rayledger.storage import LedgerError, ResponseCode
from rayledger.storage.snapshots import SnapshotStore


def _write(store: SnapshotStore, index: int, term: int, files: dict[str, bytes]):
    def write(path: str) -> None:
        for name, data in files.items():
            (Path(path) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(path) / name).write_bytes(data)

    return store.seal(index, term, write)


def test_a_committed_snapshot_lists_and_verifies(tmp_path) -> None:
    s = SnapshotStore(tmp_path / "snapshots")
    meta = _write(s, 1234, 3, {"state.bin": b"x" * 5000, "sub/keys": b"abc"})
    (got,) = s.list()
    assert (got.index, got.term, got.nbytes) == (1234, 3, 5003)
    assert {f for f, _, _ in got.files} == {"state.bin", "sub/keys"} and got == meta
    assert s.verify(got) is None
    assert (Path(got.path) / "state.bin").read_bytes() == b"x" * 5000


def test_snapshots_list_oldest_first_and_a_crash_mid_write_leaves_none(tmp_path) -> None:
    s = SnapshotStore(tmp_path)
    _write(s, 20, 2, {"a": b"2"})
    _write(s, 3, 1, {"a": b"1"})
    s.begin(40, 2)  # the member died while the machine wrote it
    assert [m.index for m in SnapshotStore(tmp_path).list()] == [3, 20]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]  # cleared on open


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove"])
def test_a_damaged_snapshot_is_found(tmp_path, damage: str) -> None:
    s = SnapshotStore(tmp_path)
    meta = _write(s, 7, 1, {"state": bytes(range(256)) * 40})
    p = Path(meta.path) / "state"
    if damage == "flip":
        data = bytearray(p.read_bytes())
        data[100] ^= 0xFF
        p.write_bytes(bytes(data))
    elif damage == "truncate":
        p.write_bytes(p.read_bytes()[:-1])
    else:
        p.unlink()
    assert s.verify(s.list()[0]) is not None


def test_a_directory_without_meta_is_no_snapshot(tmp_path) -> None:
    s = SnapshotStore(tmp_path)
    _write(s, 5, 1, {"a": b"1"})
    bad = _write(s, 9, 1, {"a": b"2"})
    (Path(bad.path) / "meta.json").unlink()
    assert [m.index for m in s.list()] == [5]
    (Path(s.list()[0].path) / "meta.json").write_text("{not json")
    assert s.list() == []


def test_a_snapshot_dir_that_cannot_be_made_is_a_coded_error(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(LedgerError) as e:
        SnapshotStore(blocker / "snapshots")
    assert e.value.code == ResponseCode.DISK_ERROR


def test_delete_removes_a_snapshot(tmp_path) -> None:
    s = SnapshotStore(tmp_path)
    a = _write(s, 1, 1, {"a": b"1"})
    _write(s, 2, 1, {"a": b"2"})
    s.delete(a)
    assert [m.index for m in s.list()] == [2]
