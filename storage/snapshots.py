"""A member's state-machine snapshots on disk: written whole or not at all,
checked by checksum when read.

Layout under the member's ``snapshots/`` directory::

    00000000000000001234-3/      one snapshot: the machine's state after entry 1234 (term 3)
        meta.json                index, term, each file's size and SHA-256, written last
        <the machine's files>
    .tmp-<index>-<term>/         one being written (removed at the next open)
    .tmp-in-<index>-<term>/      one being installed from the leader (likewise)

A snapshot is written into a ``.tmp-`` directory by the machine (any files it likes), then
:meth:`SnapshotStore.commit` hashes the files, writes ``meta.json``, fsyncs them and renames
the directory into place: a crash leaves the old snapshots and a temp directory, never a
half-written snapshot under a final name.  :meth:`SnapshotStore.verify` re-hashes a
snapshot before it is loaded; a damaged one is skipped (logged) in favour of an older one.
Which snapshots to keep and when to take one is decided elsewhere
(:class:`~rayledger.actors.core.snapshot_policy.SnapshotPolicy`).

A snapshot travels to a lagging follower as one byte stream: its files in ``meta.json``
order, cut into chunks at any offset.  The leader reads a chunk with :meth:`read`; the
follower writes it with :meth:`write_at` into the directory :meth:`begin_install` made
and seals it with :meth:`commit` against the leader's sizes and checksums, so a damaged
transfer is refused (CORRUPT_SNAPSHOT) and never becomes a snapshot.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import LedgerError, ResponseCode
from .metafile import atomic_write_json, fsync_dir, read_json

SESSIONS_FILE = "rayledger-sessions.json"
"""The client sessions' table a state machine's snapshot carries beside the machine's own
files (:class:`~rayledger.replication.sessions.SessionTable` as of the snapshot's index)."""


def write_sessions(directory: str | os.PathLike, table: dict) -> None:
    """Write a snapshot's session table into its directory before it is sealed: its
    checksum is then the snapshot's like any of its files'."""
    with open(os.path.join(directory, SESSIONS_FILE), "w") as f:
        json.dump(table, f)


def with_sessions(writer: Callable[[str], None], table: dict) -> Callable[[str], None]:
    """The writer of a machine's snapshot that also writes the client sessions as of the
    cut (``table``): an idempotent client's retry after an install is still recognised."""

    def write(path: str) -> None:
        writer(path)
        write_sessions(path, table)

    return write


def read_sessions(directory: str | os.PathLike) -> dict:
    """A sealed snapshot's session table (verify its checksum first: a damaged table may
    still parse)."""
    with open(os.path.join(directory, SESSIONS_FILE)) as f:
        return json.load(f)


log = logging.getLogger("rayledger.storage")

META = "meta.json"
_TMP = ".tmp-"


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """One committed snapshot: the state after entry ``index`` of ``term``."""

    index: int
    term: int
    files: tuple[tuple[str, int, str], ...]  # (relative path, size, sha256 hex)
    path: str

    @property
    def nbytes(self) -> int:
        return sum(size for _, size, _ in self.files)


def _name(index: int, term: int) -> str:
    return f"{index:020d}-{term}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _spans(files, offset: int, n: int):
    """``(name, offset in file, bytes)`` for stream bytes ``[offset, offset + n)``."""
    start = 0
    for name, size, _ in files:
        end = start + size
        if offset < end and n > 0:
            at = offset - start
            take = min(n, size - at)
            yield name, at, take
            offset += take
            n -= take
        start = end


def _disk_error(what: str, exc: OSError) -> LedgerError:
    code = ResponseCode.DISK_FULL if exc.errno == 28 else ResponseCode.DISK_ERROR
    return LedgerError.of(code, f"{what}: {exc}")


class SnapshotStore:
    """The ``snapshots/`` directory of one member."""

    def __init__(self, directory: str | os.PathLike, owner: bool = True):
        """``owner``: the member's own store, which removes what a crash left half-written;
        another reader (an operator, a test) passes False and touches nothing."""
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            for p in self.dir.iterdir() if owner else ():  # a crash mid-snapshot left it
                if p.name.startswith(_TMP):
                    shutil.rmtree(p, ignore_errors=True)
        except OSError as exc:
            raise _disk_error(f"cannot open snapshots in {self.dir}", exc) from exc

    def begin(self, index: int, term: int) -> str:
        """A fresh empty directory the machine writes snapshot ``index`` into."""
        tmp = self.dir / f"{_TMP}{_name(index, term)}"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        except OSError as exc:
            raise _disk_error(f"cannot start snapshot {index}", exc) from exc
        return str(tmp)

    def commit(self, tmp: str, index: int, term: int, expect: tuple | None = None) -> SnapshotMeta:
        """Seal what the machine wrote in ``tmp`` as snapshot ``index``: checksums, fsync,
        ``meta.json`` last, then the rename that makes it visible.  ``expect``: the files
        (name, size, sha256) an installed snapshot must hold exactly; anything else is
        CORRUPT_SNAPSHOT and ``tmp`` is removed."""
        src = Path(tmp)
        final = self.dir / _name(index, term)
        try:
            files = []
            for p in sorted(src.rglob("*")):
                if p.is_file() and p != src / META:
                    fd = os.open(p, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    files.append((str(p.relative_to(src)), p.stat().st_size, _sha256(p)))
            if expect is not None and sorted(map(tuple, expect)) != sorted(files):
                shutil.rmtree(src, ignore_errors=True)
                raise LedgerError.of(
                    ResponseCode.CORRUPT_SNAPSHOT,
                    f"snapshot {index} (term {term}) arrived damaged: its files or checksums "
                    "differ from the leader's",
                )
            atomic_write_json(src / META, {"index": index, "term": term,
                                           "files": [list(f) for f in files]})  # fmt: skip
            if final.exists():  # the same snapshot again (a retry): the new one wins
                shutil.rmtree(final)
            os.replace(src, final)
            fsync_dir(self.dir)
        except OSError as exc:
            shutil.rmtree(src, ignore_errors=True)
            raise _disk_error(f"cannot write snapshot {index}", exc) from exc
        return SnapshotMeta(index, term, tuple(files), str(final))

    # -- moving a snapshot to another member ---------------------------------------------------
    def read(self, meta: SnapshotMeta, offset: int, n: int) -> bytes:
        """Bytes ``[offset, offset + n)`` of snapshot ``meta`` as one stream (its files in
        order); CORRUPT_SNAPSHOT when it is gone (a newer one replaced it) or shorter."""
        out = bytearray()
        base = Path(meta.path)
        try:
            for name, at, take in _spans(meta.files, offset, n):
                with open(base / name, "rb") as f:
                    f.seek(at)
                    got = f.read(take)
                if len(got) != take:
                    raise OSError(f"{name} is shorter than its {take} bytes at {at}")
                out += got
        except OSError as exc:
            raise LedgerError.of(
                ResponseCode.CORRUPT_SNAPSHOT, f"cannot read snapshot {meta.index}: {exc}"
            ) from exc
        return bytes(out)

    def begin_install(self, index: int, term: int, files) -> str:
        """An empty directory for snapshot ``index`` arriving from the leader, with its
        ``files`` created empty (a file of 0 bytes gets no chunk)."""
        tmp = self.dir / f"{_TMP}in-{_name(index, term)}"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            for name, _, _ in files:
                p = tmp / name
                if tmp.resolve() not in p.resolve().parents:
                    raise LedgerError.of(
                        ResponseCode.CORRUPT_SNAPSHOT,
                        f"snapshot file {name!r} leaves its directory",
                    )
                p.parent.mkdir(parents=True, exist_ok=True)
                p.touch()
        except OSError as exc:
            raise _disk_error(f"cannot start installing snapshot {index}", exc) from exc
        return str(tmp)

    def write_at(self, tmp: str, files, offset: int, data: bytes) -> None:
        """Write stream bytes ``data`` at ``offset`` into the installing directory."""
        base = Path(tmp)
        view = memoryview(data)
        try:
            for name, at, take in _spans(files, offset, len(data)):
                with open(base / name, "r+b") as f:
                    f.seek(at)
                    f.write(view[:take])
                view = view[take:]
        except OSError as exc:
            raise _disk_error(f"cannot write snapshot chunk at {offset}", exc) from exc

    def seal(self, index: int, term: int, write: Callable[[str], None]) -> SnapshotMeta:
        """Snapshot ``index``: ``write(dir)`` fills a fresh directory, which is then sealed
        (:meth:`commit`); a write or seal that fails leaves nothing behind."""
        tmp = self.begin(index, term)
        try:
            write(tmp)
            return self.commit(tmp, index, term)
        except OSError as exc:
            self.abort(tmp)
            raise _disk_error(f"cannot write snapshot {index}", exc) from exc
        except BaseException:
            self.abort(tmp)
            raise

    def abort(self, tmp: str) -> None:
        shutil.rmtree(tmp, ignore_errors=True)

    def list(self) -> list[SnapshotMeta]:
        """The committed snapshots, oldest first (a directory without a readable
        ``meta.json`` is no snapshot: it is logged and left out)."""
        out = []
        for p in sorted(self.dir.iterdir()):
            if p.name.startswith(_TMP) or not p.is_dir():
                continue
            try:
                m = read_json(p / META)
            except LedgerError as exc:
                log.warning("snapshot %s has an unreadable meta.json, skipped: %s", p, exc)
                continue
            if m is None:
                log.warning("snapshot %s has no meta.json, skipped", p)
                continue
            files = tuple((str(f), int(s), str(h)) for f, s, h in m["files"])
            out.append(SnapshotMeta(int(m["index"]), int(m["term"]), files, str(p)))
        out.sort(key=lambda m: m.index)
        return out

    def verify(self, meta: SnapshotMeta) -> str | None:
        """Why snapshot ``meta`` is damaged (a file missing, of another size or checksum),
        or None when it is whole."""
        base = Path(meta.path)
        for name, size, digest in meta.files:
            p = base / name
            try:
                if p.stat().st_size != size:
                    return f"{name} has {p.stat().st_size} bytes, not {size}"
                if _sha256(p) != digest:
                    return f"{name} fails its checksum"
            except OSError as exc:
                return f"{name}: {exc}"
        return None

    def delete(self, meta: SnapshotMeta) -> None:
        shutil.rmtree(meta.path, ignore_errors=True)
