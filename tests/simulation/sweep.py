"""Run many seeds of the all-features simulation by hand and print a summary.

    .venv/bin/python -m tests.simulation.sweep 2000            # seeds 111000..112999
    .venv/bin/python -m tests.simulation.sweep 111000:111500   # a range
    .venv/bin/python -m tests.simulation.sweep 111003,111047   # a list

Each failure prints its seed and first line as it happens; the summary groups the failures
by their first line (numbers masked), so the kinds of failure and their seeds stand out.
Every failure reruns with ``RAYLEDGER_SIM_SEED=<seed> pytest
tests/simulation/test_all_features_sim.py -k test_chaos_all_features``.
"""

from __future__ import annotations

import argparse
import collections
import logging
import re
import sys
import time

from .network import SimulationFailure
from .test_all_features_sim import run_all_features

OFFSET = 111_000  # test_chaos_all_features's first seed


def parse_seeds(spec: str) -> list[int]:
    """A count (from :data:`OFFSET`), a range ``a:b`` or a list ``a,b,c``."""
    if "," in spec:
        return [int(s) for s in spec.split(",") if s.strip()]
    if ":" in spec:
        lo, hi = spec.split(":", 1)
        return list(range(int(lo), int(hi)))
    return list(range(OFFSET, OFFSET + int(spec)))


def kind_of(first_line: str) -> str:
    """A failure's first line without its seed, time and numbers: its kind."""
    text = first_line.split("ms: ", 1)[-1]
    text = re.sub(r"/\S+", "<path>", text)
    return re.sub(r"\d+", "#", text)[:160]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("seeds", nargs="?", default="200", help="count, a:b, or a,b,c")
    args = ap.parse_args(argv)
    logging.disable(logging.CRITICAL)
    seeds = parse_seeds(args.seeds)
    print(f"{len(seeds)} seeds, {seeds[0]}..{seeds[-1]}" if seeds else "no seeds", flush=True)
    kinds: dict[str, list[int]] = collections.defaultdict(list)
    errors: dict[str, list[int]] = collections.defaultdict(list)
    stats: collections.Counter[str] = collections.Counter()
    start = time.monotonic()
    for seed in seeds:
        try:
            sim = run_all_features(seed, "test_chaos_all_features")
            stats.update({k: v for k, v in sim.stats.items() if isinstance(v, int)})
        except SimulationFailure as exc:
            first = str(exc).split("\n", 1)[0]
            kinds[kind_of(first)].append(seed)
            print(f"FAIL {seed}: {first[:300]}", flush=True)
        except Exception as exc:  # a harness error: the seed and what
            errors[kind_of(f"{type(exc).__name__}: {exc}")].append(seed)
            print(f"ERROR {seed}: {exc!r}"[:300], flush=True)
    took = time.monotonic() - start
    failed = sum(map(len, kinds.values())) + sum(map(len, errors.values()))
    print(f"\n{len(seeds)} seeds in {took:.0f} s: {len(seeds) - failed} passed, {failed} failed")
    for kind, got in sorted([*kinds.items(), *errors.items()], key=lambda kv: -len(kv[1])):
        print(f"  {len(got):4d}  {kind}\n        seeds {got[:20]}{' ...' if len(got) > 20 else ''}")
    keys = ("nodes_lost", "spawns_ok", "spawns_failed", "change_add", "change_replace",
            "change_remove", "machine_installs", "machine_snapshots", "log_compactions",
            "dispatchers_booting", "checker_configures_delayed", "kv_history_ok",
            "kv_history_void_after_power_loss", "kv_ops", "idempotent_retries",
            "transfers_asked", "power_losses", "checker_hangs", "dispatcher_hangs",
            "snapshot_damaged", "snapshot_sessions_damaged")  # fmt: skip
    print("  coverage (passed seeds): " + ", ".join(f"{k}={stats[k]}" for k in keys))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
