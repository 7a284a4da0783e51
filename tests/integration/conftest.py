"""Fixtures shared by the integration tests."""

from __future__ import annotations

import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/actors")  # groupcheck, nemesis


@pytest.fixture(scope="session")
def spark(ray_session):
    """One Spark (through RayDP) for the modules that read through it: it takes 12-16 s to
    start here, and those modules run one after the other."""
    from rayledger.integration.spark import init_spark, stop_spark

    session = init_spark("rayledger-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    stop_spark()


def pytest_collection_modifyitems(session, config, items):
    """Spark's error tests need no Spark running in this process: they run before the first
    test that starts the shared one."""
    errors = [i for i in items if i.nodeid.startswith("tests/integration/test_spark_errors.py")]
    rest = [i for i in items if i not in errors]
    uses = (k for k, i in enumerate(rest) if "spark" in getattr(i, "fixturenames", ()))
    first = next(uses, None)
    if errors and first is not None:
        items[:] = rest[:first] + errors + rest[first:]


@pytest.fixture
def commitlog(ray_session, tmp_path, group_name):
    """A 3-member group running RocketMQ's commit log on files, deleted after the test."""
    from groupcheck import TEST_CONFIG
    from rayledger.integration.rocketmq import CommitLog

    log = CommitLog.create(group_name, 3, store_dir=str(tmp_path / "mq"), config=TEST_CONFIG)
    yield log
    log.group.shutdown(delete_data=True)
