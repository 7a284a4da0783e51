"""Session-wide fixtures: one local Ray per test session, unique group names."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import uuid

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# `rayledger start` keeps groups on disk by default (~/.rayledger/data): tests keep theirs in
# a directory of the session's own, removed at its end
_DATA = tempfile.mkdtemp(prefix="rayledger-test-data-")
os.environ["RAYLEDGER_DATA"] = _DATA
atexit.register(shutil.rmtree, _DATA, ignore_errors=True)


def pytest_addoption(parser):
    parser.addoption(
        "--rewrite",
        action="store_true",
        help="script tests (tests/script/testdata) write the output the code gives",
    )


@pytest.fixture(scope="session")
def ray_session():
    """Start Ray once for the whole session (about 4 s here) and stop it at the end."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",  # a Ray of our own, never another cluster on the machine
            num_cpus=2,
            namespace="rayledger",
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    yield ray
    ray.shutdown()


@pytest.fixture
def group_name(request) -> str:
    """A group name no other test uses."""
    return f"t-{request.node.name[:30]}-{uuid.uuid4().hex[:8]}".replace("[", "-").replace("]", "")
