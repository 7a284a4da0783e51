"""ConsumerCheckpoint: the offset file alone (no Ray, no Spark)."""

from __future__ import annotations

import json

import pytest
from rayledger.integration.spark.consumer import ConsumerCheckpoint
from rayledger.storage import LedgerError, ResponseCode


def test_new_checkpoint_starts_at_zero_and_commits_atomically(tmp_path):
    path = tmp_path / "sub" / "offsets.json"
    cp = ConsumerCheckpoint(path, group="orders")
    assert cp.next_index == 0 and not path.exists()
    cp.commit(120, expected=0)
    data = json.loads(path.read_text())
    assert data["next_index"] == 120 and data["group"] == "orders" and data["runs"] == 1
    assert not list(path.parent.glob("*.tmp"))
    assert ConsumerCheckpoint(path, group="orders").next_index == 120


def test_commit_refuses_a_concurrent_run_and_going_back(tmp_path):
    path = tmp_path / "o.json"
    a, b = ConsumerCheckpoint(path, "g"), ConsumerCheckpoint(path, "g")
    a.commit(10, expected=0)
    with pytest.raises(LedgerError) as ei:
        b.commit(7, expected=0)  # b read from 0 too: committing would repeat entries 0..9
    assert ei.value.code == ResponseCode.INCONSISTENT_STATE
    with pytest.raises(LedgerError):
        a.commit(5)
    assert a.next_index == 10


def test_checkpoint_of_another_group_is_refused(tmp_path):
    path = tmp_path / "o.json"
    ConsumerCheckpoint(path, "g1").commit(3)
    with pytest.raises(LedgerError) as ei:
        ConsumerCheckpoint(path, "g2")
    assert ei.value.code == ResponseCode.UNEXPECTED_ARGUMENT


def test_damaged_checkpoint_is_an_error(tmp_path):
    path = tmp_path / "o.json"
    path.write_text('{"next_index": -4}')
    with pytest.raises(LedgerError) as ei:
        _ = ConsumerCheckpoint(path).next_index
    assert ei.value.code == ResponseCode.CORRUPT_LOG
    path.write_text("{not json")
    with pytest.raises(LedgerError):
        _ = ConsumerCheckpoint(path).next_index


def test_reset_rewinds(tmp_path):
    cp = ConsumerCheckpoint(tmp_path / "o.json", "g")
    cp.commit(50)
    cp.reset(20)
    assert cp.next_index == 20
