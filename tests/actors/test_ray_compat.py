"""The private Ray APIs live in actors/ray_compat.py behind a version check."""

from __future__ import annotations

import pathlib

import pytest
import ray
from rayledger.actors import ray_compat
from rayledger.storage import LedgerError, ResponseCode

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRIVATE = ("internal_kv", "compiled_dag_node", "_max_inflight", "_buffer_size", "ray._private")


def test_the_tested_ray_is_installed() -> None:
    assert ray.__version__ == ray_compat.TESTED_RAY
    ray_compat.check_ray_version()


def test_another_ray_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.delenv(ray_compat.ALLOW_ENV, raising=False)
    with pytest.raises(LedgerError) as e:
        ray_compat.check_ray_version("2.99.0")
    assert e.value.code == ResponseCode.UNSUPPORTED
    assert "2.99.0" in e.value.message and ray_compat.TESTED_RAY in e.value.message
    monkeypatch.setenv(ray_compat.ALLOW_ENV, "1")
    ray_compat.check_ray_version("2.99.0")  # allowed: a warning only


def test_no_private_ray_api_outside_ray_compat() -> None:
    found = []
    for folder in ("actors", "election", "replication", "storage", "integration"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "ray_compat.py":
                continue
            text = path.read_text()
            found += [f"{path.relative_to(ROOT)}: {name}" for name in PRIVATE if name in text]
    assert found == []
