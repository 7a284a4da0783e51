"""What the drivers of both simulations (:mod:`.election_sim`, :mod:`.group_sim`) share.

A driver owns the seed, the fake clock, the :class:`~.network.SimNetwork` with its
:class:`~.network.RpcLayer` and the optional :class:`~.network.FaultInjector`; it
reports a failed property with the seed, how to rerun it, the members and the last
events, and runs step by step until a time or a condition.  A subclass provides
``step(until)``, ``describe()``, ``reproduce()`` (the pytest arguments that rerun a
failing test) and ``_start(mid)`` (a start or restart); it comes last among the bases.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from .network import (
    FakeClock,
    FaultConfig,
    FaultInjector,
    NetworkConfig,
    RpcLayer,
    SimNetwork,
    SimulationFailure,
)


class SimDriver:
    """The clock, network, RPC layer, fault injector, failure report and run loop of a simulation."""

    KIND = "sim"
    """How a failure report names the simulation when it has no label."""

    TRACE_LINES = 150
    """How many of the last network events a failure report shows."""

    seed: int
    n: int
    label: str
    rng: random.Random
    ids: list[str]
    injector: FaultInjector | None

    def _init_network(
        self,
        network: NetworkConfig | None,
        rpc_timeout_ms: int,
        down_fail_ms: int | None = None,
        *,
        clock: FakeClock | None = None,
        make_network: Callable[..., SimNetwork] | None = None,
    ) -> None:
        """The clock, the network (its own stream drawn from ``self.rng``) and the RPC layer.
        ``clock`` and ``make_network`` (called as ``SimNetwork`` is): a clock and links shared
        with other groups, as :mod:`.topic_sim` runs several in one cluster."""
        self.clock = FakeClock(0) if clock is None else clock
        make = SimNetwork if make_network is None else make_network
        self.net = make(self.ids, random.Random(self.rng.getrandbits(64)), network, self.clock)
        self.rpc = RpcLayer(self.net, rpc_timeout_ms, down_fail_ms=down_fail_ms)

    def _make_injector(self, faults: FaultConfig, crash: Callable[[str], None]) -> FaultInjector:
        """Seeded faults (their own stream drawn from ``self.rng``); a restart is ``_start``."""
        return FaultInjector(
            self.net,
            random.Random(self.rng.getrandbits(64)),
            faults,
            crash=crash,
            restart=self._start,
            base_network=self.net.config,
        )

    # ================================================================ failures

    def fail(self, message: str) -> None:
        trace = "\n".join(list(self.net.trace)[-self.TRACE_LINES :])
        raise SimulationFailure(
            f"[{self.label or self.KIND}] seed={self.seed} n={self.n} "
            f"t={self.clock.now_ms}ms: {message}\n"
            f"reproduce with: RAYLEDGER_SIM_SEED={self.seed} pytest {self.reproduce()}\n"
            f"--- members ---\n{self.describe()}\n--- last events ---\n{trace}"
        )

    # ================================================================ members

    def restart(self, mid: str) -> None:
        """Start a member crashed by hand (the fault injector no longer counts it down)."""
        if self.injector is not None:
            self.injector.crashed.discard(mid)
        self._start(mid)

    # ================================================================ the loop

    def run_until(self, t_ms: int, stop: Callable[[], bool] | None = None) -> bool:
        """Run to ``t_ms``; with ``stop``, return True as soon as it holds."""
        while self.clock.now_ms < t_ms:
            self.step(t_ms)
            if stop is not None and stop():
                return True
        return stop() if stop is not None else True

    def run_for(self, ms: int, stop: Callable[[], bool] | None = None) -> bool:
        return self.run_until(self.clock.now_ms + ms, stop)
