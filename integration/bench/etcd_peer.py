"""`bench peer`'s etcd side: a local etcd cluster, driven over gRPC, on the shared workload.

etcd is the reference Raft store (Go); setting rayledger beside it says how far a Python Raft
log on Ray is from a production one on the same machine and the same calls.

Cluster.  ``nodes`` (3) members of the ``etcd`` binary from ``$RAYLEDGER_ETCD`` or PATH
(Debian's etcd-server, 3.4), each on two free loopback ports (client, peer) with its own data
dir in one temporary dir, etcd's default timers (heartbeat 100 ms, election 1 s) and its
default durability: each member fsyncs its WAL before it acks, which 3.4 cannot turn off,
while rayledger's bench default flushes asynchronously (``--sync-flush`` is the like-for-like
setting).  ``--max-txn-ops`` (and ``--max-request-bytes`` where needed) are raised to fit a
batch (128 ops, 1.5 MiB by default: a 1000-entry batch would be refused).
The processes are stopped by pid (SIGTERM, then SIGKILL) and the dir removed in a
``finally``; they also get SIGTERM should this process die first (``PR_SET_PDEATHSIG``:
the followers go at once, the leader after etcd's ~7 s leadership hand-over timeout).

Client.  grpcio's generic unary calls on hand-encoded protobuf (``etcdserverpb.KV/Put``,
``/Txn``, ``/Range``, ``Maintenance/Status``): no generated stubs, no etcd client library,
nothing tied to the installed protobuf.  The callers run in this process and share one
channel (one HTTP/2 connection, as ``bench group``'s threads share one client) to the
leader's client URL: etcd pays a loopback client hop as rayledger's clients pay one through
Ray, and no follower forwards.  An append is a Put of a new key (``b/<n>``, a ``body_bytes``
value): a log appends, it does not overwrite.  A batch is one Txn holding ``batch`` Puts of
distinct keys: one request and one Raft entry, applied atomically, as rayledger's
``append_batch`` is one call carrying ``batch`` entries.

Every wait is bounded; without the binary (or grpcio) the side is skipped with one line on
stderr and ``{"skipped": why}``; a failed or stalled run yields zeros and an ``error`` field.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from .peer_workload import FIGURES, Side, Workload, _free_port, round_figures, workload

log = logging.getLogger("rayledger.bench")

ETCD_ENV = "RAYLEDGER_ETCD"
NOT_FOUND = f"etcd binary not found: apt-get install etcd-server (or set {ETCD_ENV})"
#: Loopback only, no proxy, and quick reconnects while the members come up.
CHANNEL_OPTIONS = [
    ("grpc.enable_http_proxy", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
METHODS = {
    "put": "/etcdserverpb.KV/Put",
    "txn": "/etcdserverpb.KV/Txn",
    "range": "/etcdserverpb.KV/Range",
    "status": "/etcdserverpb.Maintenance/Status",
}


# -- protobuf wire format: the few messages the bench sends and reads ----------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    """A length-delimited field (wire type 2): bytes, strings and sub-messages."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def put_request(key: bytes, value: bytes) -> bytes:
    """``PutRequest{key = 1, value = 2}``."""
    return _field(1, key) + _field(2, value)


def txn_request(puts: Sequence[tuple[bytes, bytes]]) -> bytes:
    """``TxnRequest{success = 2: [RequestOp{request_put = 2}]}``, no compare: always applied."""
    return b"".join(_field(2, _field(2, put_request(k, v))) for k, v in puts)


def range_request(key: bytes) -> bytes:
    """``RangeRequest{key = 1}``: that one key, linearizable."""
    return _field(1, key)


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        n, i, shift = n | (b & 0x7F) << shift, i + 1, shift + 7
        if not b & 0x80:
            return n, i


def decode(buf: bytes) -> dict[int, list[Any]]:
    """One message level: field number -> its values (ints, or bytes to decode further)."""
    fields: dict[int, list[Any]] = {}
    i = 0
    while i < len(buf):
        tag, i = _read_varint(buf, i)
        kind, value = tag & 7, None
        if kind == 0:
            value, i = _read_varint(buf, i)
        elif kind in (1, 5):  # fixed64, fixed32
            size = 8 if kind == 1 else 4
            value, i = int.from_bytes(buf[i : i + size], "little"), i + size
        elif kind == 2:
            size, i = _read_varint(buf, i)
            value, i = buf[i : i + size], i + size
        else:
            raise ValueError(f"wire type {kind}")
        if i > len(buf):
            raise ValueError("truncated field")
        fields.setdefault(tag >> 3, []).append(value)
    return fields


def _first(fields: dict[int, list[Any]], number: int, default: Any = 0) -> Any:
    return fields.get(number, [default])[0]  # proto3 leaves zero values out


# -- the client ---------------------------------------------------------------------------


class EtcdError(Exception):
    """A failed etcd call; ``args[0]`` is the reason: a gRPC status code's name, or what was
    wrong with the answer (the workload counts failures by it)."""


class EtcdUnavailable(Exception):
    """No etcd to run (binary or grpcio missing): the side is skipped, not failed."""


@dataclass(frozen=True)
class EtcdStatus:
    member_id: int
    leader: int  # 0 while there is none
    raft_term: int
    version: str


class EtcdClient:
    """Put, Txn of puts, Range of one key and Status on one member, over one gRPC channel
    shared by every calling thread; every call has a deadline."""

    def __init__(self, target: str, timeout: float = 5.0) -> None:
        import grpc

        self.target, self.timeout, self._rpc_error = target, timeout, grpc.RpcError
        self._channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._calls = {name: self._channel.unary_unary(path) for name, path in METHODS.items()}

    def _call(self, name: str, request: bytes, timeout: float | None = None) -> dict:
        try:
            raw = self._calls[name](request, timeout=timeout or self.timeout)
        except self._rpc_error as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise EtcdError(getattr(code, "name", "RPC_ERROR"), details) from None
        try:
            return decode(raw)
        except ValueError as exc:
            raise EtcdError("MALFORMED_ANSWER", str(exc)) from None

    @staticmethod
    def _revision(resp: dict) -> int:
        revision = _first(decode(_first(resp, 1, b"")), 3)  # ResponseHeader.revision
        if revision <= 0:
            raise EtcdError("NO_REVISION", "the answer has no header revision")
        return revision

    def put(self, key: bytes, value: bytes) -> int:
        """The store's revision after the put."""
        return self._revision(self._call("put", put_request(key, value)))

    def txn_put(self, puts: Sequence[tuple[bytes, bytes]]) -> int:
        """All ``puts`` in one Txn; the revision they share."""
        resp = self._call("txn", txn_request(puts))
        ops = resp.get(3, [])  # ResponseOp{response_put = 2} each: starts with tag 0x12
        if _first(resp, 2) != 1 or len(ops) != len(puts) or any(op[:1] != b"\x12" for op in ops):
            raise EtcdError("TXN_NOT_APPLIED", f"{len(ops)} of {len(puts)} puts answered")
        return self._revision(resp)

    def get(self, key: bytes) -> tuple[bytes, int] | None:
        """``(value, mod_revision)`` of ``key``, None where it has none."""
        kvs = self._call("range", range_request(key)).get(2, [])
        if not kvs:
            return None
        kv = decode(kvs[0])  # KeyValue{key = 1, mod_revision = 3, value = 5}
        return _first(kv, 5, b""), _first(kv, 3)

    def status(self, timeout: float | None = None) -> EtcdStatus:
        resp = self._call("status", b"", timeout)
        header = decode(_first(resp, 1, b""))
        version = _first(resp, 2, b"").decode()
        return EtcdStatus(_first(header, 2), _first(resp, 4), _first(resp, 6), version)

    def close(self) -> None:
        self._channel.close()


# -- the cluster --------------------------------------------------------------------------


def locate_etcd() -> str:
    """``$RAYLEDGER_ETCD`` where set, else ``etcd`` on PATH; EtcdUnavailable otherwise."""
    path = os.environ.get(ETCD_ENV)
    if path:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        raise EtcdUnavailable(f"{ETCD_ENV}={path} is not an executable file")
    found = shutil.which("etcd")
    if found is None:
        raise EtcdUnavailable(NOT_FOUND)
    return found


def etcd_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        raise EtcdUnavailable(f"{binary} --version failed: {exc}") from None
    for line in out.stdout.splitlines():
        if line.startswith("etcd Version:"):
            return line.split(":", 1)[1].strip()
    raise EtcdUnavailable(f"{binary} --version said no version: {out.stdout[:200]!r}")


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it if the bench dies without its finally."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: str
    log_path: str
    proc: subprocess.Popen | None = None
    log_file: IO[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def log_tail(self, lines: int = 3) -> str:
        with contextlib.suppress(OSError), open(self.log_path, "rb") as f:
            return " | ".join(f.read().decode(errors="replace").strip().splitlines()[-lines:])
        return ""


class EtcdCluster:
    """``size`` etcd members on loopback in a temporary dir; a context manager that stops
    them and removes the dir however it is left."""

    def __init__(
        self, binary: str, size: int = 3, max_txn_ops: int = 128, max_request_bytes: int = 0
    ) -> None:
        self.binary, self.size, self.max_txn_ops = binary, size, max_txn_ops
        self.max_request_bytes = max(max_request_bytes, 1536 * 1024)  # etcd's default
        self.root: str | None = None
        self.members: list[Member] = []

    def start(self) -> None:
        self.root = tempfile.mkdtemp(prefix="rayledger-etcd-")
        ports: list[int] = []
        while len(ports) < 2 * self.size:  # distinct ports, however the kernel hands them out
            port = _free_port()
            ports += [port] if port not in ports else []
        for i in range(self.size):
            base = os.path.join(self.root, f"m{i}")
            self.members.append(
                Member(f"m{i}", ports[2 * i], ports[2 * i + 1], base, base + ".log")
            )
        cluster = ",".join(f"{m.name}=http://127.0.0.1:{m.peer_port}" for m in self.members)
        token = "rayledger-bench-" + os.urandom(4).hex()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}  # flags only
        for m in self.members:
            client, peer = f"http://127.0.0.1:{m.client_port}", f"http://127.0.0.1:{m.peer_port}"
            cmd = [self.binary, "--name", m.name, "--data-dir", m.data_dir,
                   "--listen-client-urls", client, "--advertise-client-urls", client,
                   "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                   "--initial-cluster", cluster, "--initial-cluster-state", "new",
                   "--initial-cluster-token", token, f"--max-txn-ops={self.max_txn_ops}",
                   f"--max-request-bytes={self.max_request_bytes}",
                   "--logger=zap", "--log-level=warn"]  # fmt: skip
            m.log_file = open(m.log_path, "wb")  # noqa: SIM115 -- closed in stop()
            m.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=m.log_file,
                                      stderr=subprocess.STDOUT, env=env,
                                      preexec_fn=_die_with_parent)  # fmt: skip
        log.info("etcd members started: %s", [(m.name, m.proc.pid, m.target) for m in self.members])

    def _check_alive(self) -> None:
        for m in self.members:
            if m.proc is not None and m.proc.poll() is not None:
                raise RuntimeError(
                    f"etcd member {m.name} exited ({m.proc.returncode}): {m.log_tail()}"
                )

    def wait_for_leader(self, timeout: float) -> Member:
        """The leader, once every member answers and names the same one."""
        deadline = time.monotonic() + timeout
        clients = [EtcdClient(m.target) for m in self.members]
        try:
            while time.monotonic() < deadline:
                self._check_alive()
                with contextlib.suppress(EtcdError):
                    left = min(1.0, max(0.05, deadline - time.monotonic()))
                    seen = [c.status(left) for c in clients]
                    if len({s.leader for s in seen}) == 1 and seen[0].leader:
                        return next(
                            m
                            for m, s in zip(self.members, seen, strict=True)
                            if s.member_id == s.leader
                        )
                time.sleep(0.1)
        finally:
            for c in clients:
                c.close()
        raise TimeoutError(f"no leader named by all {self.size} etcd members within {timeout:g} s")

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the members by pid one after the other, SIGKILL one still up after
        ``grace``; remove the dir.  One at a time: a leader stopped with its followers hands
        its office to one already gone and waits out etcd's request timeout (~7 s), while
        one stopped beside live members (or none) is gone in ~0.1 s."""
        for proc in [m.proc for m in self.members if m.proc is not None]:
            if proc.poll() is None:
                proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
            if proc.poll() is None:
                log.warning("etcd pid %d ignored SIGTERM for %g s: SIGKILL", proc.pid, grace)
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(3.0)
        for m in self.members:
            if m.log_file is not None:
                m.log_file.close()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> EtcdCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the side -----------------------------------------------------------------------------


def _etcd_side(client: EtcdClient, body: bytes) -> Side:
    keys = itertools.count()  # next() on it is atomic under the GIL: distinct keys per call

    def append() -> None:
        client.put(b"b/%d" % next(keys), body)

    def batch(n: int) -> tuple[int, list[str]]:
        try:
            client.txn_put([(b"b/%d" % next(keys), body) for _ in range(n)])
        except EtcdError as exc:
            return 0, [f"txn:{exc.args[0]}"]
        return n, []

    return Side(append, batch)


def _skipped(why: str) -> dict[str, Any]:
    """One line on the command line's own stderr (plain stderr outside it) and the field."""
    line = f"bench peer: etcd side skipped: {why}"
    log.info("%s", line)
    cli = sys.modules.get("rayledger.integration.cli.output")  # loaded when the CLI runs us
    if cli is not None:
        cli.error(line, show_log=False)
    else:
        print(line, file=sys.stderr, flush=True)
    return {"skipped": why}


def run_etcd(
    quick: bool = False,
    threads: int = 64,
    clients: int = 4,
    batch: int = 1000,
    body_bytes: int = 128,
    nodes: int = 3,
    load: Workload | None = None,
) -> dict[str, Any]:
    """The etcd side (see the module's docstring); ``load`` overrides the sizes (tests)."""
    w = load or Workload.sized(quick, threads, clients, batch, body_bytes)
    try:
        binary = locate_etcd()
        version = etcd_version(binary)
        try:
            import grpc  # noqa: F401
        except ImportError:
            raise EtcdUnavailable("grpcio not installed: pip install '.[etcd]'") from None
    except EtcdUnavailable as exc:
        return _skipped(str(exc))
    out: dict[str, Any] = {
        "nodes": nodes,
        "body_bytes": w.body_bytes,
        **dict.fromkeys(FIGURES, 0.0),
    }
    out.update(version=version, binary=binary, fsync=True, setup=(
        f"etcd {version}, {nodes} members on loopback, WAL fsynced (etcd's default), callers in "
        f"the bench process over one gRPC channel to the leader, batch = one Txn of {w.batch} puts"
    ))  # fmt: skip
    txn_bytes = 2 * w.batch * (w.body_bytes + 32)  # a Txn of ``batch`` puts, with room
    cluster = EtcdCluster(binary, nodes, max(128, w.batch), txn_bytes)
    client, phase = None, "start"
    try:
        cluster.start()
        phase, t0 = "election", time.monotonic()
        leader = cluster.wait_for_leader(30.0)
        out.update(election_s=round(time.monotonic() - t0, 2), leader=leader.name)
        client = EtcdClient(leader.target, timeout=w.append_timeout)
        term = client.status().raft_term
        phases = workload(_etcd_side(client, os.urandom(w.body_bytes)), w)
        for phase in ("single", "concurrent", "batch"):  # noqa: B007
            out.update(next(phases))
        now = client.status()
        out["leader_stable"] = now.leader == now.member_id and now.raft_term == term
    except Exception as exc:  # a failed peer run is a result
        out["error"] = f"etcd failed during {phase}: {exc}"
    finally:
        if client is not None:
            client.close()
        cluster.stop()
    idle = [k for k in FIGURES if not out[k] > 0]
    if idle and "error" not in out:
        out["error"] = f"etcd acked nothing for {', '.join(idle)}: {out.get('failures')}"
    if "error" in out:
        log.warning("%s", out["error"])
    return round_figures(out)
