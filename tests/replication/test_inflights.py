"""Inflights: the dispatcher's record of APPEND pushes in flight."""

from __future__ import annotations

import dataclasses

import pytest
from rayledger.replication import PushType
from rayledger.replication.inflights import Inflights

from .helpers import push


def filled() -> Inflights:
    f = Inflights()
    for first, last in ((0, 9), (10, 19), (20, 29)):
        f.add(first, last, 100, sent_ms=first)
    return f


def test_oldest_is_the_lowest_index_even_after_a_resend() -> None:
    f = filled()
    oldest = f.oldest()
    assert oldest is not None and (oldest.first, oldest.last, oldest.nbytes) == (0, 9, 100)
    oldest.sent_ms = 500  # resent: keeps its place
    assert f.oldest() is oldest and [i.first for i in f] == [0, 10, 20]
    assert Inflights().oldest() is None


def test_ack_forgets_only_the_exact_push() -> None:
    f = filled()
    assert not f.ack(10, 14)  # an answer to a differently cut push from 10
    assert 10 in f and len(f) == 3
    assert f.ack(10, 19)
    assert 10 not in f and len(f) == 2
    assert not f.ack(10, 19)  # answered twice


def test_prune_drops_what_the_water_mark_covers() -> None:
    f = filled()
    assert f.prune(19) == 2
    assert [i.first for i in f] == [20] and repr(f) == "Inflights([20..29])"
    f.drop(20)
    f.drop(99)
    assert len(f) == 0
    f.add(30, 39, 1, 0)
    f.clear()
    assert len(f) == 0


def test_push_requests_are_frozen() -> None:
    req = push(PushType.COMMIT, commit_index=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.commit_index = 4  # type: ignore[misc]
    assert dataclasses.replace(req, commit_index=4).commit_index == 4 and req.commit_index == 3
