"""The KV store: the machine's put, delete, compare-and-set and scans,
and KVClient on a real group."""

from __future__ import annotations

import itertools

import pytest
from rayledger.integration.kv import (
    KVChange,
    KVClient,
    KvMachine,
    cas_command,
    delete_command,
    put_command,
    value_bytes,
)
from rayledger.storage import Entry, LedgerError, ResponseCode


def _apply(m: KvMachine, bodies: list[bytes], first: int = 0) -> None:
    m.apply([Entry(index=first + i, term=1, pos=0, body=b) for i, b in enumerate(bodies)])


def test_put_delete_cas_and_scan_on_the_machine() -> None:
    m = KvMachine()
    _apply(m, [put_command("a/1", b"x"), put_command("a/2", b"\x00\xff"), put_command("b", b"y"),
               cas_command("a/1", b"x", b"z"), cas_command("a/1", b"x", b"w"),
               cas_command("c", None, b"new"), delete_command("b")])  # fmt: skip
    assert value_bytes(m.query({"get": "a/1"})[0]) == b"z"
    assert [m.query({"cas": i}) for i in (3, 4, 5)] == [True, False, True]
    assert [(k, value_bytes(v)) for k, v, _ in m.query({"scan": "a/"})] == [
        ("a/1", b"z"), ("a/2", b"\x00\xff")]  # fmt: skip
    assert m.query({"get": "b"}) is None and value_bytes(m.query({"get": "c"})[0]) == b"new"


def test_the_machine_state_and_cas_outcomes_survive_a_snapshot(tmp_path) -> None:
    m = KvMachine()
    _apply(m, [put_command("k", b"v"), cas_command("k", b"v", b"w")])
    m.snapshot()(str(tmp_path))
    back = KvMachine()
    back.load_snapshot(str(tmp_path), 1)
    assert value_bytes(back.query({"get": "k"})[0]) == b"w" and back.query({"cas": 1}) is True


@pytest.mark.ray
def test_a_kv_client_puts_gets_swaps_and_scans(ray_session, group_name, tmp_path) -> None:
    kv = KVClient.create(group_name, members=3, store_dir=str(tmp_path))
    try:
        r1 = kv.put("cfg/a", b"1")
        r2 = kv.put("cfg/b", b"2")
        assert r2 > r1
        assert kv.get("cfg/a") == b"1" and kv.get("missing") is None
        assert kv.cas("cfg/a", b"1", b"10") is True
        assert kv.cas("cfg/a", b"1", b"11") is False
        assert kv.cas("lock", None, b"me") is True and kv.cas("lock", None, b"you") is False
        kv.delete("cfg/b")
        assert kv.scan("cfg/") == [("cfg/a", b"10")]
        for m in kv.group.members:
            assert kv.get("cfg/a", consistency="committed", member=m) in (b"1", b"10")
        assert kv.get("cfg/a", consistency="lease") == b"10"
        again = KVClient.connect(group_name)
        assert again.scan("") == [("cfg/a", b"10"), ("lock", b"me")]
        again.close()
        # every change of cfg/ in commit order: the swap that failed is no change
        seen = list(itertools.islice(kv.watch("cfg/", from_index=0), 4))
        assert [(c.op, c.key, c.value) for c in seen] == [
            ("put", "cfg/a", b"1"), ("put", "cfg/b", b"2"), ("put", "cfg/a", b"10"),
            ("delete", "cfg/b", None)]  # fmt: skip
        assert seen[0].revision == r1 and seen[1].revision == r2
        later = kv.watch("cfg/", from_index=seen[-1].revision + 1)
        rev = kv.put("cfg/c", b"3")
        assert next(later) == KVChange(rev, "put", "cfg/c", b"3")
        for bad in (lambda: kv.put("", b"x"), lambda: kv.put("k", "str"),
                    lambda: kv.scan(3)):  # fmt: skip
            with pytest.raises(LedgerError) as e:
                bad()
            assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT
    finally:
        kv.close()
        kv.group.shutdown(delete_data=True)
