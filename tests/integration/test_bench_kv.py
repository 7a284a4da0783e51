"""`bench kv`'s load helpers against a real KV group: what they count is what was done."""

from __future__ import annotations

import uuid

import pytest
from rayledger.integration.bench.kv import _threads_puts
from rayledger.integration.kv import KVClient

pytestmark = pytest.mark.ray


def test_puts_from_threads_are_counted_after_they_ran(ray_session, tmp_path) -> None:
    kv = KVClient.create(f"t-benchkv-{uuid.uuid4().hex[:8]}", members=3, store_dir=str(tmp_path))
    try:
        kv.put("warm", b"x")  # a leader that serves: the second below is all puts
        rate, refused = _threads_puts(kv, 4, 1.0)
        held = kv.client.query({"keys": True})
        done = sum(1 for k in held if k.startswith("threads/"))
        assert refused == 0 and done > 0
        assert 0.5 * done <= rate <= 1.5 * done  # puts per second over about one second
    finally:
        kv.close()
        kv.group.shutdown(delete_data=True)
