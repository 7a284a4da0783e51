"""Count the module crossings of one plain append through the sans-I/O cores.

    .venv/bin/python tests/script/crossings.py        # from the repository root

A 3-member group in the script environment (interaction.py: the shipped cores, no Ray)
elects n0 and settles; then one append is proposed on n0 and every message is delivered
until nothing is in flight.  Meanwhile every call from a function of one product module
into a function of another counts as a crossing (library frames in between are skipped;
calls from the harness are not counted).  Prints the total, the modules reached and each
caller -> callee edge with its count: docs/ARCHITECTURE.md quotes them.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from interaction import Env  # noqa: E402

LAYERS = ("actors", "election", "replication", "storage")
BASES = (str(HERE.parents[1]),)  # the repository root: the package ``rayledger`` itself


def _module(filename: str) -> str | None:
    """The product module of a code object's file (its path in the repository), or None."""
    for base in BASES:
        if filename.startswith(base + "/"):
            rel = filename[len(base) + 1 :]
            return rel if rel.split("/", 1)[0] in LAYERS else None
    return None


def count(body: bytes = b"hello") -> tuple[Counter, set[str]]:
    env = Env()
    env.run("add-nodes 3")
    env.run("elect n0")
    env.run("run 500")
    env.run("propose n0 warm")
    env.run("stabilize")
    edges: Counter = Counter()
    reached: set[str] = set()

    def profile(frame, event, _arg) -> None:
        if event != "call":
            return
        callee = _module(frame.f_code.co_filename)
        if callee is None:
            return
        reached.add(callee)
        caller = frame.f_back
        while caller is not None and _module(caller.f_code.co_filename) is None:
            if "/tests/" in caller.f_code.co_filename:
                return  # the harness delivering: not a crossing of the product's
            caller = caller.f_back
        if caller is not None and (mod := _module(caller.f_code.co_filename)) != callee:
            edges[(mod, callee)] += 1

    sys.setprofile(profile)
    try:
        env.run(f"propose n0 {body.decode()}")
        env.run("stabilize")
    finally:
        sys.setprofile(None)
    return edges, reached


def main() -> None:
    import logging

    logging.disable(logging.CRITICAL)
    edges, reached = count()
    print(f"{sum(edges.values())} crossings over {len(reached)} modules, {len(edges)} edges")
    for (a, b), n in edges.most_common():
        print(f"{n:4d}  {a} -> {b}")


if __name__ == "__main__":
    main()
