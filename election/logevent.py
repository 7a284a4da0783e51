"""One-line structured protocol logging: an event name plus fields, member/term/index always.

Protocol cores log a lot of small events; a formatted ``log.info("[%s] ...", a, b, c)`` call
spans a dozen lines and buries the logic. ``log_event`` keeps each call to one line and makes
every protocol message carry the same three coordinates (member id, term, index), so a grep for
``term=7`` or ``idx=1042`` across members lines up. Formatting is lazy: nothing is rendered when
the level is off.
"""

from __future__ import annotations

import logging
from typing import Any


class _Event:
    """Renders ``[member] event term=T idx=I k=v ...`` only when the record is emitted."""

    __slots__ = ("member", "event", "term", "index", "fields")

    def __init__(self, member: str, event: str, term: int, index: int | None, fields: dict):
        self.member, self.event, self.term, self.index, self.fields = (
            member,
            event,
            term,
            index,
            fields,
        )

    def __str__(self) -> str:
        parts = [f"[{self.member}] {self.event} term={self.term}"]
        if self.index is not None:
            parts.append(f"idx={self.index}")
        parts.extend(f"{k}={v}" for k, v in self.fields.items())
        return " ".join(parts)


def log_event(
    log: logging.Logger,
    level: int,
    event: str,
    *,
    member: str,
    term: int,
    index: int | None = None,
    **fields: Any,
) -> None:
    """Log one protocol event; ``fields`` follow as ``key=value`` in the order given."""
    if log.isEnabledFor(level):
        log.log(level, "%s", _Event(member, event, term, index, fields))
