"""`rayledger bench peer`'s etcd side: the hand-encoded gRPC requests mean to etcd what they
say, a tiny run gives figures and leaves no process nor dir behind, and without the binary
the side is skipped with one line and a field.  No Ray; about 5 s with etcd installed."""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import time
import types

import pytest
from rayledger.integration.bench import etcd_peer, peer
from rayledger.integration.bench.etcd_peer import (
    NOT_FOUND,
    EtcdClient,
    EtcdCluster,
    EtcdError,
    EtcdUnavailable,
    decode,
    put_request,
    run_etcd,
    txn_request,
)
from rayledger.integration.bench.peer_workload import FIGURES, Workload


@pytest.fixture
def etcd_binary() -> str:
    pytest.importorskip("grpc")
    try:
        return etcd_peer.locate_etcd()
    except EtcdUnavailable as exc:
        pytest.skip(f"etcd binary not found ({exc})")


@pytest.fixture
def no_etcd(monkeypatch, tmp_path):
    """A PATH with no etcd on it and no RAYLEDGER_ETCD."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(etcd_peer.ETCD_ENV, raising=False)


def test_the_encoding_reads_back_as_written():
    assert etcd_peer._varint(300) == b"\xac\x02"  # protobuf's own example
    body = os.urandom(300)  # a two-byte length
    assert decode(put_request(b"k", body)) == {1: [b"k"], 2: [body]}
    ops = decode(txn_request([(b"a", b"1"), (b"b", b"2")]))[2]  # TxnRequest.success
    puts = [decode(decode(op)[2][0]) for op in ops]  # RequestOp.request_put
    assert puts == [{1: [b"a"], 2: [b"1"]}, {1: [b"b"], 2: [b"2"]}]
    with pytest.raises(ValueError):
        decode(b"\x0a\x05ab")  # a field longer than the message


def test_put_and_txn_requests_round_trip_through_etcd(etcd_binary):
    with EtcdCluster(etcd_binary, size=1, max_txn_ops=200) as cluster:
        client = EtcdClient(cluster.wait_for_leader(20.0).target, timeout=5.0)
        try:
            key, value = b"k/\x00\xff", os.urandom(300)
            revision = client.put(key, value)
            assert client.get(key) == (value, revision)
            assert client.get(b"absent") is None
            puts = [(b"t/%d" % i, os.urandom(i + 1)) for i in range(200)]
            txn_revision = client.txn_put(puts)
            assert txn_revision == revision + 1  # one Txn, one revision for all its puts
            assert [client.get(k) for k, _ in puts[::50]] == [
                (v, txn_revision) for _, v in puts[::50]
            ]
            with pytest.raises(EtcdError) as refused:  # etcd's refusals surface as errors
                client.txn_put([(b"d", b"1"), (b"d", b"2")])
            assert refused.value.args[0] == "INVALID_ARGUMENT"
            with pytest.raises(EtcdError, match="INVALID_ARGUMENT"):
                client.txn_put([(b"x/%d" % i, b"") for i in range(201)])  # over --max-txn-ops
            status = client.status()
            assert status.leader == status.member_id != 0 and status.version.startswith("3.")
        finally:
            client.close()
    assert not os.path.exists(cluster.root)


def test_a_tiny_etcd_run_gives_figures_and_leaves_nothing_running(etcd_binary, monkeypatch):
    started: list[EtcdCluster] = []
    start = EtcdCluster.start

    def recording_start(self: EtcdCluster) -> None:
        started.append(self)
        start(self)

    monkeypatch.setattr(EtcdCluster, "start", recording_start)
    dirs = os.path.join(tempfile.gettempdir(), "rayledger-etcd-*")
    dirs_before = set(glob.glob(dirs))
    load = Workload(threads=2, clients=2, batch=20, singles=10, duration=0.5, rounds=2,
                    append_timeout=5.0)  # fmt: skip
    t0 = time.monotonic()
    out = run_etcd(load=load)
    assert time.monotonic() - t0 < 30, out
    assert "error" not in out and out["fsync"] is True, out
    for name in FIGURES:
        assert out[name] > 0, (name, out)
    assert out["batch_errors"] == out["concurrent_errors"] == 0, out
    [cluster] = started
    assert len(cluster.members) == 3
    for m in cluster.members:
        assert m.proc.returncode is not None, m  # waited for: gone, not a zombie
        with pytest.raises(ProcessLookupError):
            os.kill(m.proc.pid, 0)
    assert set(glob.glob(dirs)) <= dirs_before


def test_without_etcd_the_side_is_skipped_with_one_line(no_etcd, capsys):
    out = run_etcd(quick=True)
    assert out == {"skipped": NOT_FOUND}
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"bench peer: etcd side skipped: {NOT_FOUND}"]


def test_a_bad_etcd_variable_is_named_in_the_skip(no_etcd, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(etcd_peer.ETCD_ENV, str(tmp_path / "nope"))
    out = run_etcd(quick=True)
    assert "RAYLEDGER_ETCD" in out["skipped"] and "nope" in out["skipped"], out
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_bench_peer_reports_a_skipped_etcd_and_no_etcd_ratios(no_etcd, monkeypatch, capsys):
    figures = dict.fromkeys(FIGURES, 10.0)
    monkeypatch.setattr(peer, "_require_pysyncobj", lambda: None)
    monkeypatch.setattr(peer, "run_pysyncobj", lambda **kw: dict(figures))
    group = types.ModuleType("rayledger.integration.bench.group")  # no Ray in this test
    group.run = lambda **kw: dict(figures)
    monkeypatch.setitem(sys.modules, group.__name__, group)
    out = peer.run(quick=True)
    assert out["etcd"] == {"skipped": NOT_FOUND}
    assert out["workload"]["etcd"] == NOT_FOUND
    assert out["ratio"] == dict.fromkeys(FIGURES, 1.0)  # the PySyncObj names as they were
    assert out["ratio_etcd"] == dict.fromkeys(FIGURES, None)
    assert out["rayledger_ahead_of_etcd_on_every_figure"] is None
    assert "etcd side skipped" in capsys.readouterr().err
