"""Each safety fix reverted in turn (:mod:`.fix_reverts`), the all-features simulation run
over the same seeds: every row must show failures, or the sweep could not tell the fix is
needed.  Prints one markdown row per fix (docs/SAFETY.md keeps the table).

    .venv/bin/python -m tests.simulation.revert_sweep                  # CI seeds, every fix
    .venv/bin/python -m tests.simulation.revert_sweep 111000:111100 checker-config
    .venv/bin/python -m tests.simulation.revert_sweep --first 111000:111400  # a seed to pin
"""

from __future__ import annotations

import argparse
import logging
import time

from .fix_reverts import REVERTS, revert
from .network import SimulationFailure
from .sweep import parse_seeds
from .test_all_features_sim import ci_seeds, run_all_features


def sweep(name: str, seeds: list[int], first_only: bool = False) -> tuple[list[int], str]:
    """The seeds that fail with fix ``name`` reverted (only the first: ``first_only``),
    and the first failure's first line."""
    failed, first = [], ""
    with revert(name):
        for seed in seeds:
            try:
                run_all_features(seed, "revert_sweep")
            except (SimulationFailure, AssertionError, Exception) as exc:  # noqa: B014
                failed.append(seed)
                first = first or f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"
                if first_only:
                    break
    return failed, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seeds", nargs="?", default="", help="a count, a:b or a,b,c (CI seeds)")
    ap.add_argument("names", nargs="*", help=f"fixes to revert (default all: {list(REVERTS)})")
    ap.add_argument("--first", action="store_true", help="stop each fix at its first failure")
    args = ap.parse_args()
    logging.disable(logging.CRITICAL)
    seeds = parse_seeds(args.seeds) if args.seeds else ci_seeds()
    print("| fix reverted | seeds failing | first failure |")
    print("| --- | --- | --- |")
    for name in args.names or list(REVERTS):
        t = time.monotonic()
        failed, first = sweep(name, seeds, args.first)
        shown = ", ".join(map(str, failed[:6])) + (" ..." if len(failed) > 6 else "")
        print(f"| {name} | {len(failed)} of {len(seeds)} ({shown}) | {first} |"
              f" <!-- {time.monotonic() - t:.0f} s -->", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
