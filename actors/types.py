"""What the public API returns."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from rayledger.election import Role


class AppendResult(NamedTuple):
    """Where a committed append landed.  (A named tuple: a batch of a thousand entries
    gets a thousand of them, and a tuple is made in a quarter of a frozen dataclass's time.)"""

    index: int
    term: int
    pos: int
    receipt: Any = None  # what the group's state machine decided for it (StateMachine.receipt)


class AppendResults(Sequence[AppendResult]):
    """Where a batch's appends landed, kept as columns: the :class:`AppendResult` of an entry
    is made when it is asked for.  A client answering a batch of a thousand with a thousand
    tuples spent most of its time making them; most callers read one or two.  It reads like
    the list of results it stands for (indexing, slices, iteration, ``len``, ``==`` with a
    list, ``+``)."""

    __slots__ = ("_indexes", "_terms", "_positions", "_receipts")

    def __init__(
        self,
        indexes: Sequence[int],
        terms: int | Sequence[int],
        positions: Sequence[int],
        receipts: Sequence[Any] | None = None,
    ):
        self._indexes = indexes  # a range for consecutive entries
        self._terms = terms  # every entry's, or one per entry
        self._positions = positions
        self._receipts = receipts  # None: no state machine receipts

    def __len__(self) -> int:
        return len(self._indexes)

    def __getitem__(self, i):  # type: ignore[override]
        t, rc = self._terms, self._receipts
        if isinstance(i, slice):
            return AppendResults(self._indexes[i], t if type(t) is int else t[i],
                                 self._positions[i], None if rc is None else rc[i])  # fmt: skip
        return AppendResult(
            int(self._indexes[i]),
            t if type(t) is int else int(t[i]),
            int(self._positions[i]),
            None if rc is None else rc[i],
        )

    def __iter__(self) -> Iterator[AppendResult]:
        return (self[k] for k in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Sequence[AppendResult]) -> list[AppendResult]:
        return [*self, *other]

    def __radd__(self, other: Sequence[AppendResult]) -> list[AppendResult]:
        return [*other, *self]

    def __repr__(self) -> str:
        return repr(list(self))


@dataclass(frozen=True, slots=True)
class MemberStatus:
    role: Role | None
    term: int
    leader_id: str | None
    ledger_begin_index: int
    ledger_end_index: int
    committed_index: int
    alive: bool
    # "voter" or "learner" in the committed configuration this member knows,
    # "removed", or None (no answer); on the leader, the lost members waiting for a node
    membership: str | None = None
    lost: tuple[str, ...] = ()
