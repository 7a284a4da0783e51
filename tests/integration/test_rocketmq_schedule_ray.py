"""Delay-level messages on a real 3-member group with its schedule service: delivered to
their real queue after their delay and not before, once each, in order per level -- also
through a leader kill and a kill of the service itself."""

from __future__ import annotations

import os
import signal
import time

import pytest
import ray
from groupcheck import TEST_CONFIG, wait_until
from rayledger.actors.naming import NAMESPACE
from rayledger.election import Role
from rayledger.integration.rocketmq import CommitLog, PutMessageStatus
from rayledger.integration.rocketmq.schedule_service import service_name

pytestmark = pytest.mark.ray

LEVELS = "1s 3s 10s"  # short delays: level 1 is 1 s, level 2 is 3 s


@pytest.fixture
def delayed(ray_session, tmp_path, group_name):
    log = CommitLog.create(
        group_name, 3, store_dir=str(tmp_path / "mq"), config=TEST_CONFIG, delay_levels=LEVELS
    )
    yield log
    log.shutdown(delete_data=True)


def bodies(log: CommitLog, topic: str, q: int) -> list[bytes]:
    return [m.body for m in log.pull(topic, q, 0, 1000).messages]


def put_delayed(log: CommitLog, topic: str, q: int, level: int, n: int, tag: str) -> list[bytes]:
    out = []
    for k in range(n):
        body = f"{tag}-L{level}-{k}".encode()
        r = log.put_message(topic, q, body, tags=f"t{level}", keys=f"{tag}{k}",
                            properties={"custom": "kept"}, delay_level=level)  # fmt: skip
        assert r.ok, r
        out.append(body)
    return out


def test_delayed_messages_reach_their_queue_after_their_delay_once_in_order(delayed):
    log = delayed
    start = time.monotonic()
    l1 = put_delayed(log, "T", 0, 1, 5, "a")
    l2 = put_delayed(log, "T", 1, 2, 5, "b")
    assert bodies(log, "T", 0) == [] and bodies(log, "T", 1) == []  # parked, not delivered
    assert log.put_message("T", 0, b"x", delay_level=4).status is PutMessageStatus.MESSAGE_ILLEGAL
    wait_until(lambda: bodies(log, "T", 0) == l1, 20, "level 1 delivered")
    assert bodies(log, "T", 1) == [] or time.monotonic() - start >= 3  # level 2 still waits
    wait_until(lambda: bodies(log, "T", 1) == l2, 20, "level 2 delivered")
    assert time.monotonic() - start >= 3
    time.sleep(1.0)  # the service keeps running: nothing comes twice
    pulled = log.pull("T", 0, 0, 100).messages
    assert [m.body for m in pulled] == l1 and [m.queue_offset for m in pulled] == list(range(5))
    m = pulled[0]
    assert (m.tags, m.keys, m.properties["custom"]) == ("t1", "a0", "kept")
    assert not {"REAL_TOPIC", "REAL_QID", "DELAY"} & set(m.properties)
    assert m.properties["DELAY_OFFSET"] == "1:0"
    assert log.query_message("T", "a3")[0].body == l1[3]
    assert log.schedule_offsets() == {1: (5, 5), 2: (5, 5), 3: (0, 0)}
    for member in log.group.members:  # every member queued them, once
        assert [x.body for x in log.pull("T", 0, 0, 100, member=member).messages] == l1


def test_pending_delayed_messages_are_delivered_once_after_a_leader_kill(delayed):
    log = delayed
    l1 = put_delayed(log, "T", 0, 1, 4, "before")
    l2 = put_delayed(log, "T", 1, 2, 4, "before")
    wait_until(lambda: len(bodies(log, "T", 0)) >= 2, 20, "some of level 1 delivered")
    leader = log.group.wait_for_leader()
    term = max(s.term for s in log.group.status().values())
    log.group.kill(leader)
    wait_until(
        lambda: any(s.role is Role.LEADER and s.term > term for s in log.group.status().values()),
        30, "a new leader",
    )  # fmt: skip
    l1 += put_delayed(log, "T", 0, 1, 3, "after")
    wait_until(lambda: bodies(log, "T", 0) == l1, 30, lambda: f"level 1: {bodies(log, 'T', 0)}")
    wait_until(lambda: bodies(log, "T", 1) == l2, 30, lambda: f"level 2: {bodies(log, 'T', 1)}")
    time.sleep(1.0)
    assert bodies(log, "T", 0) == l1 and bodies(log, "T", 1) == l2
    assert log.schedule_offsets()[1] == (7, 7)


@pytest.mark.chaos  # long run; CI keeps the service restart after a leader kill
def test_a_killed_service_restarts_where_the_group_stands_and_delivers_nothing_twice(delayed):
    log = delayed
    service = ray.get_actor(service_name(log.group.name), namespace=NAMESPACE)
    l1 = put_delayed(log, "T", 0, 1, 3, "first")
    wait_until(lambda: bodies(log, "T", 0) == l1, 20, "first deliveries")
    pid = ray.get(service.status.remote())["pid"]
    l2 = put_delayed(log, "T", 1, 2, 3, "pending")  # parked while the service is down
    os.kill(pid, signal.SIGKILL)  # Ray restarts it
    wait_until(lambda: _restarted(service, pid), 30, "the service restarted")
    l1 += put_delayed(log, "T", 0, 1, 2, "later")
    wait_until(lambda: bodies(log, "T", 0) == l1, 20, lambda: f"level 1: {bodies(log, 'T', 0)}")
    wait_until(lambda: bodies(log, "T", 1) == l2, 20, lambda: f"level 2: {bodies(log, 'T', 1)}")
    again = CommitLog.connect(log.group.name)  # ensures the running service, starts no other
    assert ray.get(service.status.remote())["pid"] != pid
    time.sleep(1.0)
    assert bodies(again, "T", 0) == l1 and bodies(again, "T", 1) == l2


def _restarted(service, pid: int) -> bool:
    try:
        return ray.get(service.status.remote(), timeout=5)["pid"] != pid
    except ray.exceptions.RayError:
        return False


def test_a_bad_delay_table_is_a_coded_error_and_the_service_stops_with_its_group(
    ray_session, tmp_path, group_name
):
    from rayledger.actors import LedgerError
    from rayledger.storage import ResponseCode

    for bad in ("", "1x", "0s", "1s -2m", 5):
        with pytest.raises(LedgerError) as err:
            CommitLog.create(group_name, 1, config=TEST_CONFIG, delay_levels=bad)
        assert err.value.code is ResponseCode.UNEXPECTED_ARGUMENT
    log = CommitLog.create(group_name, 1, config=TEST_CONFIG, delay_levels="1s")
    assert log.put_message("T", 0, b"x", delay_level=2).status is PutMessageStatus.MESSAGE_ILLEGAL
    log.group.shutdown()  # the group alone: its service notices and stops

    def gone() -> bool:
        try:
            ray.get_actor(service_name(group_name), namespace=NAMESPACE)
            return False
        except ValueError:
            return True

    wait_until(gone, 30, "the service of a deleted group to stop")
