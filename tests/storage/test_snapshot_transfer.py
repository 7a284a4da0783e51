"""SnapshotStore as both ends of a snapshot install: the leader reads a snapshot
as one byte stream cut into chunks, the follower writes them at their offsets and seals the
result against the leader's sizes and checksums."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rayledger.storage import LedgerError, ResponseCode
from rayledger.storage.snapshots import SnapshotMeta, SnapshotStore

# in meta order (sorted by path) they are: state.bin, state.empty, sub/keys, z-last
FILES = {
    "z-last": b"Z" * 33,
    "state.bin": bytes(range(256)) * 9 + b"tail",  # 2308 bytes
    "state.empty": b"",
    "sub/keys": b"k1=v1\nk2=v2\n",
}
TOTAL = sum(len(v) for v in FILES.values())


def _write(store: SnapshotStore, index: int, term: int, files: dict[str, bytes]):
    def write(path: str) -> None:
        for name, data in files.items():
            (Path(path) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(path) / name).write_bytes(data)

    return store.seal(index, term, write)


def _stream(meta: SnapshotMeta) -> bytes:
    """The files of ``meta`` in its order, read straight from disk."""
    return b"".join((Path(meta.path) / name).read_bytes() for name, _, _ in meta.files)


def _chunks(store: SnapshotStore, meta: SnapshotMeta, size: int) -> list[tuple[int, bytes]]:
    out, offset = [], 0
    while offset < meta.nbytes:
        n = min(size, meta.nbytes - offset)
        data = store.read(meta, offset, n)
        assert len(data) == n
        out.append((offset, data))
        offset += n
    return out


def _tmp_dirs(d: Path) -> list[str]:
    return [p for p in os.listdir(d) if p.startswith(".tmp-")]


@pytest.fixture
def leader(tmp_path) -> tuple[SnapshotStore, SnapshotMeta]:
    s = SnapshotStore(tmp_path / "leader")
    return s, _write(s, 120, 3, FILES)


def test_the_snapshot_lists_every_file_with_its_size(leader) -> None:
    _, meta = leader
    assert {name: size for name, size, _ in meta.files} == {k: len(v) for k, v in FILES.items()}
    assert [name for name, _, _ in meta.files] == ["state.bin", "state.empty", "sub/keys", "z-last"]
    assert meta.nbytes == TOTAL == 2308 + 0 + 12 + 33


@pytest.mark.parametrize("size", [1, 7, 1000, TOTAL, TOTAL + 500])
def test_chunks_of_any_size_read_the_files_concatenated_in_meta_order(leader, size) -> None:
    s, meta = leader
    want = b"".join(FILES[name] for name, _, _ in meta.files)
    assert len(want) == TOTAL and want == _stream(meta)
    assert want != b"".join(FILES.values())  # the order is meta's, not the writer's
    chunks = _chunks(s, meta, size)
    assert b"".join(data for _, data in chunks) == want
    assert len(chunks) == -(-TOTAL // size)  # ceil: every chunk full but the last


def test_a_read_past_the_end_gives_what_is_left(leader) -> None:
    s, meta = leader
    assert s.read(meta, TOTAL - 5, 100) == _stream(meta)[-5:]
    assert s.read(meta, TOTAL, 10) == b""


def test_a_read_inside_one_file_and_across_the_empty_one(leader) -> None:
    s, meta = leader
    names = [name for name, _, _ in meta.files]
    stream = _stream(meta)
    start = 0
    for name, size, _ in meta.files:  # each file alone, by its offset in the stream
        assert s.read(meta, start, size) == FILES[name]
        start += size
    # a chunk that spans the boundary around the empty file
    i = names.index("state.empty")
    at = sum(size for _, size, _ in meta.files[:i])
    assert s.read(meta, at - 3, 6) == stream[at - 3 : at + 3]


@pytest.mark.parametrize("size", [1, 7, 1000, TOTAL + 1])
def test_chunks_written_at_their_offsets_seal_an_identical_snapshot(tmp_path, leader, size):
    s, meta = leader
    f = SnapshotStore(tmp_path / "follower")
    tmp = f.begin_install(meta.index, meta.term, meta.files)
    assert Path(tmp).is_dir() and Path(tmp).parent == f.dir
    assert (Path(tmp) / "state.empty").is_file() and (Path(tmp) / "sub" / "keys").is_file()
    for offset, data in _chunks(s, meta, size):
        f.write_at(tmp, meta.files, offset, data)
    got = f.commit(tmp, meta.index, meta.term, expect=meta.files)
    assert (got.index, got.term, got.nbytes) == (120, 3, TOTAL)
    assert sorted(got.files) == sorted(meta.files)
    for name, data in FILES.items():
        assert (Path(got.path) / name).read_bytes() == data
    assert f.verify(got) is None
    assert f.list() == [got]
    assert not Path(tmp).exists() and _tmp_dirs(f.dir) == []


def test_chunks_written_out_of_order_still_seal(tmp_path, leader) -> None:
    s, meta = leader
    f = SnapshotStore(tmp_path / "follower")
    tmp = f.begin_install(meta.index, meta.term, meta.files)
    for offset, data in reversed(_chunks(s, meta, 7)):
        f.write_at(tmp, meta.files, offset, data)
    got = f.commit(tmp, meta.index, meta.term, expect=meta.files)
    assert f.verify(got) is None and _stream(got) == _stream(meta)


@pytest.mark.parametrize("where", [0, 2307, 2308, TOTAL - 1])
def test_a_flipped_byte_is_refused_and_leaves_nothing(tmp_path, leader, where) -> None:
    s, meta = leader
    f = SnapshotStore(tmp_path / "follower")
    tmp = f.begin_install(meta.index, meta.term, meta.files)
    data = bytearray(s.read(meta, 0, TOTAL))
    data[where] ^= 0x01
    f.write_at(tmp, meta.files, 0, bytes(data))
    with pytest.raises(LedgerError) as e:
        f.commit(tmp, meta.index, meta.term, expect=meta.files)
    assert e.value.code == ResponseCode.CORRUPT_SNAPSHOT
    assert f.list() == []
    assert not Path(tmp).exists() and _tmp_dirs(f.dir) == []
    assert os.listdir(f.dir) == []


def test_a_missing_chunk_is_refused(tmp_path, leader) -> None:
    s, meta = leader
    f = SnapshotStore(tmp_path / "follower")
    tmp = f.begin_install(meta.index, meta.term, meta.files)
    for offset, data in _chunks(s, meta, 1000)[:-1]:  # the last chunk never arrives
        f.write_at(tmp, meta.files, offset, data)
    with pytest.raises(LedgerError) as e:
        f.commit(tmp, meta.index, meta.term, expect=meta.files)
    assert e.value.code == ResponseCode.CORRUPT_SNAPSHOT
    assert f.list() == [] and _tmp_dirs(f.dir) == []


def test_a_stray_file_is_refused(tmp_path, leader) -> None:
    s, meta = leader
    f = SnapshotStore(tmp_path / "follower")
    tmp = f.begin_install(meta.index, meta.term, meta.files)
    f.write_at(tmp, meta.files, 0, s.read(meta, 0, TOTAL))
    (Path(tmp) / "extra").write_bytes(b"?")
    with pytest.raises(LedgerError) as e:
        f.commit(tmp, meta.index, meta.term, expect=meta.files)
    assert e.value.code == ResponseCode.CORRUPT_SNAPSHOT
    assert f.list() == [] and _tmp_dirs(f.dir) == []


def test_reading_a_deleted_snapshot_is_corrupt(leader) -> None:
    s, meta = leader
    assert s.read(meta, 0, 4) == b"\x00\x01\x02\x03"
    s.delete(meta)
    with pytest.raises(LedgerError) as e:
        s.read(meta, 0, 4)
    assert e.value.code == ResponseCode.CORRUPT_SNAPSHOT


def test_reading_a_shortened_snapshot_is_corrupt(leader) -> None:
    s, meta = leader
    last = meta.files[-1][0]
    p = Path(meta.path) / last
    p.write_bytes(p.read_bytes()[:-1])
    with pytest.raises(LedgerError) as e:
        s.read(meta, TOTAL - 4, 4)
    assert e.value.code == ResponseCode.CORRUPT_SNAPSHOT


@pytest.mark.parametrize("name", ["../x", "sub/../../x", "/etc/x"])
def test_begin_install_refuses_a_file_outside_its_directory(tmp_path, name) -> None:
    f = SnapshotStore(tmp_path / "follower")
    with pytest.raises(LedgerError) as e:
        f.begin_install(5, 1, (("ok", 1, "0" * 64), (name, 3, "0" * 64)))
    assert e.value.code == ResponseCode.CORRUPT_SNAPSHOT
    assert not (tmp_path / "x").exists() and not (tmp_path / "follower" / "x").exists()
    assert f.list() == []


def test_an_install_dir_left_by_a_crash_is_removed_on_open(tmp_path, leader) -> None:
    _, meta = leader
    f = SnapshotStore(tmp_path / "follower")
    tmp = f.begin_install(meta.index, meta.term, meta.files)
    assert Path(tmp).is_dir()
    again = SnapshotStore(tmp_path / "follower")
    assert not Path(tmp).exists() and again.list() == []


# ---------------------------------------------------------------- found while writing these
# Both failed before the fix: commit compared the leader's files sorted as strings with its
# own in path order, and skipped every file named meta.json, not only its own.


def test_a_directory_and_a_file_sharing_a_prefix_install_intact(tmp_path) -> None:
    s = SnapshotStore(tmp_path / "leader")
    meta = _write(s, 5, 1, {"state/part": b"1", "state.json": b"22"})
    assert [name for name, _, _ in meta.files] == ["state/part", "state.json"]  # Path order
    f = SnapshotStore(tmp_path / "follower")
    tmp = f.begin_install(meta.index, meta.term, meta.files)
    f.write_at(tmp, meta.files, 0, s.read(meta, 0, meta.nbytes))
    got = f.commit(tmp, meta.index, meta.term, expect=meta.files)
    assert f.verify(got) is None and _stream(got) == _stream(meta)


def test_a_machine_file_named_meta_json_in_a_subdirectory_is_part_of_the_snapshot(tmp_path):
    s = SnapshotStore(tmp_path / "leader")
    meta = _write(s, 5, 1, {"sub/meta.json": b"machine data", "x": b"y"})
    assert sorted(name for name, _, _ in meta.files) == ["sub/meta.json", "x"]
