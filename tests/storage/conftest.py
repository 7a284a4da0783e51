"""Fixtures of the storage tests: both stores (parametrized) with small segments."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from rayledger.storage import FileStore, LogStore, MemoryStore

from .helpers import small_config


@pytest.fixture
def make_file_store(tmp_path) -> Iterator[Callable[..., FileStore]]:
    """``make(sub="s", **config)``: a FileStore under tmp_path, closed at teardown."""
    opened: list[FileStore] = []

    def make(sub: str = "s", **kw) -> FileStore:
        s = FileStore(small_config(tmp_path / sub, **kw))
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()


@pytest.fixture(params=["file", "memory"])
def kind(request) -> str:
    return request.param


@pytest.fixture
def make_store(kind, tmp_path) -> Iterator[Callable[..., LogStore]]:
    """``make(**config)``: a FileStore or a MemoryStore (parametrized) with small segments."""
    opened: list[LogStore] = []
    n = [0]

    def make(**kw) -> LogStore:
        n[0] += 1
        if kind == "file":
            s: LogStore = FileStore(small_config(tmp_path / f"s{n[0]}", **kw))
        else:
            s = MemoryStore(small_config(None, **kw))
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()


@pytest.fixture
def store(make_store) -> LogStore:
    return make_store()
