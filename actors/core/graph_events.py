"""What the leader's compiled path (:mod:`.fastpath`) tells every helper core, the
checker's and each dispatcher's alike: a graph generation starts or ends."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GraphBegin:
    """Graph ``gen`` of ``term`` starts; answers whether the helper serves that term."""

    term: int
    gen: int


@dataclass(frozen=True, slots=True)
class GraphEnd:
    """The leader left graph ``gen``: what went into it may be lost."""

    gen: int
