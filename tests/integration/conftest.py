"""Fixtures shared by the integration tests."""

from __future__ import annotations

import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/actors")  # groupcheck, nemesis


@pytest.fixture(scope="module")
def spark(ray_session, request):
    """One Spark (through RayDP) per test module: it takes about 12 s to start."""
    from rayledger.integration.spark import init_spark, stop_spark

    session = init_spark(f"rayledger-{request.module.__name__.rsplit('.', 1)[-1]}")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    stop_spark()


@pytest.fixture
def commitlog(ray_session, tmp_path, group_name):
    """A 3-member group running RocketMQ's commit log on files, deleted after the test."""
    from groupcheck import TEST_CONFIG
    from rayledger.integration.rocketmq import CommitLog

    log = CommitLog.create(group_name, 3, store_dir=str(tmp_path / "mq"), config=TEST_CONFIG)
    yield log
    log.group.shutdown(delete_data=True)
