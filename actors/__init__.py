"""The group on Ray: member, dispatcher and quorum-ack actors, LedgerGroup and LedgerClient.

The store's names (errors, response codes, ``Entry``, ...) are re-exported as they are, so
a user of the group needs only this package.
"""

from rayledger import storage as _storage
from rayledger.actors.config import LedgerConfig
from rayledger.storage import *  # noqa: F403  (re-exported: see storage.__all__)

_LAZY = {
    "LedgerClient": ".client",
    "LedgerGroup": ".group",
    "AppendResult": ".types",
    "AppendResults": ".types",
    "MemberStatus": ".types",
}


def __getattr__(name: str):
    """The group and client load on first use: a helper actor's process (a dispatcher, a
    checker) imports this package for its own module only, and a process starting while a
    learner catches up should cost the host as little as possible (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [  # noqa: F405 -- the lazy names resolve through __getattr__
    *_storage.__all__,
    "AppendResult",
    "AppendResults",
    "LedgerClient",
    "LedgerConfig",
    "LedgerGroup",
    "MemberStatus",
]
