"""Session-wide fixtures: one local Ray per test session, unique group names."""

from __future__ import annotations

import atexit
import datetime
import glob
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


def pytest_collection_modifyitems(items):
    """A test on Ray runs in the Ray phase (one Ray, no xdist workers each starting one),
    marked or not: it is the fixture that says so."""
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()) and not item.get_closest_marker(
            "ray"
        ):
            item.add_marker(pytest.mark.ray)


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


# -- what the actors logged, shown with a failed test ---------------------------------------
_LOG_LINES = 120  # at most this many lines per failed test (the newest)


def _actor_log_lines(since: datetime.datetime) -> list[str]:
    """The rayledger lines the actors wrote to their stderr since ``since`` (members log at
    WARNING unless RAYLEDGER_LOG_LEVEL says otherwise): after a CI failure they are the only
    record of what the members decided."""
    import ray

    try:  # no public API names the session directory of a running local Ray
        logs = os.path.join(ray._private.worker._global_node.get_session_dir_path(), "logs")
    except Exception:
        return []
    lines = []
    for path in glob.glob(os.path.join(logs, "worker-*.err")):
        with open(path, errors="replace") as f:
            for line in f:
                if " rayledger." not in line:
                    continue
                try:
                    at = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                except ValueError:
                    continue
                if at >= since:
                    lines.append(line.rstrip())
    lines.sort()
    return lines[-_LOG_LINES:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or "ray_session" not in item.fixturenames:
        return
    since = datetime.datetime.fromtimestamp(call.start) - datetime.timedelta(seconds=1)
    lines = _actor_log_lines(since)
    if lines:
        report.sections.append(("rayledger actors' log (warnings and errors)", "\n".join(lines)))
