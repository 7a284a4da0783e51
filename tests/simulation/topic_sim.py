"""A topic in one simulated cluster: several groups (its partitions), one clock, one network.

A topic is N ordinary groups (``integration/topic``); a client routes each keyed append to
its key's partition (:func:`~rayledger.integration.topic.routing.partition_of`) through that
partition's idempotent session client.  :class:`TopicSim` runs the partitions as
:class:`~.group_sim.GroupSim` groups of the all-features mode (:func:`~.sim_config.all_features`,
each partition its own seed of it) in one cluster, as they would be deployed:

* one clock and one scheduler: every step runs each group that has something due then;
* one network of nodes ``n0``, ``n1``, ... that each host one member of every partition
  (member ``nK`` of each group): a partition, a cut link or a flaky spell between two nodes
  is the same for every group (:class:`GroupNet`), and a crash or restart is of a whole node
  -- the member of every group on it (:class:`NodeFaults`); each group keeps its own
  messages and delays (its own stream) and the faults of its own processes (hung helpers,
  failing disks, lost nodes, transfers, membership changes);
* clients (:class:`Producer`) that append batches of keyed entries, split by the shipped
  :class:`~rayledger.integration.topic.routing.Router` as ``TopicClient.append_batch``
  splits them, each part sent by the session client of its partition (one call at a time
  per partition, a part to each partition at once), across leader changes.

Checked: each group's own checks as its single-group run checks them (:mod:`.invariants`,
:mod:`.membership_changes`, :mod:`.machine_delivery`, :mod:`.kv_history`), and across the
topic: every acknowledged append is committed once, at its acknowledged index, in the
partition its key maps to; no body is committed twice anywhere in the topic; and for each
client and key, the acknowledged appends sit in the partition's log in the order the
client issued them.
"""

from __future__ import annotations

import collections
import itertools
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial

from rayledger.integration.kv import set_command
from rayledger.integration.rocketmq.message import Message, encode
from rayledger.integration.topic.routing import Router, partition_of

from .clients import Client
from .driver import SimDriver
from .group_sim import GroupSim
from .network import FakeClock, FaultConfig, FaultInjector, NetworkConfig, SimNetwork
from .sim_config import all_features

TOPIC_FILE = "tests/simulation/test_topic_sim.py"
KEYS = tuple(f"k{j}" for j in range(16))
"""The keys clients append under (the KV partitions' getters read ``k0``..``k12`` too)."""
BATCH = (1, 4)  # entries in a client's batch
PRODUCE_EVERY_MS = (2, 30)  # between a client's batches
_TAG = re.compile(rb"T\|(c\d+)\|(k\d+)\|(\d+)\|")

Tag = tuple[str, str, int]
"""(client, key, the client's sequence number for that key) of a topic entry."""


def parse_tag(body: bytes) -> Tag | None:
    """The topic entry a committed body carries (None: not a topic client's)."""
    m = _TAG.search(body)
    return None if m is None else (m[1].decode(), m[2].decode(), int(m[3]))


class GroupNet(SimNetwork):
    """One partition's network in the cluster: its own queue, delays (its own stream) and
    process outages, over the cluster's links -- cuts, partitions and the network's
    flakiness are the cluster's (:attr:`cluster`), so a fault between two nodes is the same
    for every group with members on them.  Its notes go to the cluster's trace."""

    def __init__(
        self,
        cluster: SimNetwork,
        name: str,
        nodes: Iterable[str],
        rng: random.Random,
        config: NetworkConfig | None = None,
        clock: FakeClock | None = None,
    ) -> None:
        self.cluster = cluster
        self.name = name
        super().__init__(nodes, rng, config or cluster.config, clock)

    @property
    def config(self) -> NetworkConfig:  # type: ignore[override]
        return self.cluster.config

    @config.setter
    def config(self, value: NetworkConfig) -> None:
        self.cluster.config = value

    @property
    def _cut(self) -> set[tuple[str, str]]:  # type: ignore[override]
        return self.cluster._cut

    @_cut.setter
    def _cut(self, value: set[tuple[str, str]]) -> None:
        self.cluster._cut = value

    def note(self, text: str) -> None:
        self.cluster.note(f"{self.name} {text}")


class NodeFaults(FaultInjector):
    """The cluster's seeded faults over its nodes: partitions, cuts, isolations and flaky
    spells of the links, and crashes and restarts of whole nodes -- a crash kills the
    member of every group the node hosts (each a process crash or a power loss by its
    group's share), a restart starts each of them again.  Shared by every group as its
    injector: a node counts as crashed while any member on it is down (its own fault, a
    failing disk's exit) and not gone for good, so a restart or the heal starts it too."""

    def __init__(
        self, topic: TopicSim, net: SimNetwork, rng: random.Random, config: FaultConfig
    ) -> None:
        self.topic = topic
        super().__init__(
            net, rng, config, crash=topic.crash_node, restart=topic.restart_node,
            base_network=net.config,
        )  # fmt: skip

    @property
    def crashed(self) -> set[str]:  # type: ignore[override]
        return {
            mid
            for g in self.topic.groups
            for mid, m in g.members.items()
            if not m.alive and not g.gone(mid)
        }

    @crashed.setter
    def crashed(self, value: set[str]) -> None:
        """(Computed from the groups; what the base class and the groups add or discard
        is what they crash or start themselves.)"""


class TopicGroup(GroupSim):
    """One partition: a group whose session clients send the parts the topic's clients
    routed to it, in the order routed (``outbox``), and whose failures are the topic's."""

    def __init__(self, topic: TopicSim, partition: int, seed: int, **kw) -> None:
        self.topic = topic
        self.partition = partition
        self.outbox: dict[str, collections.deque[tuple[bytes, ...]]] = collections.defaultdict(
            collections.deque
        )
        super().__init__(3, seed, **kw)

    def topic_body(self, key: str, tag: str) -> bytes:
        """An entry of ``key`` as this partition's machine takes it (a KV set of the key; a
        RocketMQ message with the key; raw bytes), carrying the topic client's ``tag``."""
        pad = "x" * self.topic.body_rng.randint(0, 40)
        if self.machine == "kv":
            return set_command(key, {"by": tag, "pad": pad})
        if self.machine == "mq":
            msg = Message("topic", f"{tag}{pad}".encode(), queue_id=0, properties={"KEYS": key})
            return encode(msg)
        return f"{tag}{pad}".encode()

    def backlog(self, cid: str, client: Client) -> int:
        """A client's appends routed here and not finished (queued or in flight)."""
        return len(self.outbox[cid]) + len(client.appends)

    def _new_bodies(self, c: Client) -> tuple[int, tuple[bytes, ...]]:
        return next(self._req_ids), self.outbox[c.id].popleft()

    def _session_client_step(self, c: Client, now: int) -> None:
        """As a lone group's, but a new append only when a part is routed here."""
        if self.outbox[c.id]:
            super()._session_client_step(c, now)
            return
        on, self.clients_on = self.clients_on, False
        try:
            super()._session_client_step(c, now)
        finally:
            self.clients_on = on

    def committed_log(self) -> list[tuple[int, bytes]]:
        """(index, body) of every committed entry with a body, as the checks saw the log
        (compacted entries from what they recorded), from a live member of the leader's
        configuration (any live member without one)."""
        ids = self.current_members() or self.ids
        live = [self.members[m] for m in ids if self.members[m].alive]
        if not live:
            live = [m for m in self.members.values() if m.alive]
        if not live:
            return []
        store = max(live, key=lambda m: m.store.committed_index).store
        entries = store.get_range(store.ledger_begin_index, store.committed_index + 1)
        if store.ledger_begin_index > 0:
            seen = self.committed_entries
            entries = [seen[i] for i in range(store.ledger_begin_index) if i in seen] + entries
        return [(e.index, e.body) for e in entries if e.body and not e.channel]

    def fail(self, message: str) -> None:
        self.topic.fail(f"p{self.partition} ({self.label}): {message}")


@dataclass
class Producer:
    """A topic client: batches of keyed entries, split by the router into one part per
    partition; it starts a batch only while each partition has fewer than ``window`` of
    its appends unfinished (the session clients' pipeline)."""

    id: str
    window: int
    next_at: int = 0
    seqs: collections.Counter[str] = field(default_factory=collections.Counter)
    batches: int = 0


class TopicSim(SimDriver):
    """``partitions`` groups of three voters and two spares on five nodes (each node hosts
    one member of every group), clients routing keyed appends, the checks of the module doc.

    ``route_partitions``: the clients' router hashes over this many partitions instead (a
    wrong router, which the checks must catch; parts beyond the topic's wrap around).
    ``window``: each client's appends unfinished per partition.  One: the session clients
    of :mod:`.clients` number every call in one session (``ClientSessions``), while
    the shipped client keeps one session per call in flight (``SessionLanes``); with more
    than one, a retry may fall behind the runs a session keeps and be refused
    DUPLICATE_SEQUENCE, which those clients take for a bug (a lone group's all-features
    seed 110000 does so with ``pipeline=3``)."""

    KIND = "topic-sim"

    def __init__(
        self,
        seed: int,
        partitions: int = 3,
        *,
        clients: int = 3,
        faults: FaultConfig | None = None,
        route_partitions: int | None = None,
        window: int = 1,
        test_name: str = "",
        test_file: str = TOPIC_FILE,
    ) -> None:
        self.seed = seed
        self.n = 3
        self.partitions = partitions
        self.label = f"topic-sim p={partitions}"
        self.test_name = test_name
        self.test_file = test_file
        self.rng = random.Random(seed)
        self.stats: collections.Counter[str] = collections.Counter()
        self.steps = 0
        self.groups: list[TopicGroup] = []
        args = [self._group_args(seed * partitions + p, clients) for p in range(partitions)]
        self.ids = [f"n{i}" for i in range(3 + args[0]["spares"])]  # the nodes
        self._init_network(None, 1000)
        self.net.trace = collections.deque(maxlen=600)
        faults = faults or args[0]["faults"]
        self.injector = NodeFaults(self, self.net, random.Random(self.rng.getrandbits(64)), faults)
        self.body_rng = random.Random(self.rng.getrandbits(64))
        self._produce_rng = random.Random(self.rng.getrandbits(64))
        self.router = Router(route_partitions or partitions)
        self.clients_on = True
        self.producers = [
            Producer(f"c{k}", window, self._produce_rng.randint(0, 50)) for k in range(clients)
        ]
        for p, kw in enumerate(args):
            g = TopicGroup(
                self, p, seed * partitions + p, group=f"topic-p{p}", test_name=test_name,
                test_file=test_file, label=f"topic p{p} {kw['machine']}", clock=self.clock,
                make_network=partial(GroupNet, self.net, f"p{p}"), injector=self.injector, **kw,
            )  # fmt: skip
            for c, prod in zip(g.clients, self.producers, strict=True):
                c.pipeline = prod.window
            self.groups.append(g)

    @staticmethod
    def _group_args(seed: int, clients: int) -> dict:
        kw = all_features(seed)
        kw.update(idempotent=True, clients=clients)
        return kw

    # ================================================================ failures

    def reproduce(self) -> str:
        return f"{self.test_file} -k {self.test_name or 'topic'}"

    def describe(self) -> str:
        return "\n".join(f"--- p{g.partition} ({g.label}) ---\n{g.describe()}" for g in self.groups)

    def _start(self, mid: str) -> None:
        self.restart_node(mid)

    # ================================================================ nodes

    def crash_node(self, node: str) -> None:
        """The node dies: the member of every group on it."""
        hit = 0
        for g in self.groups:
            m = g.members.get(node)
            if m is not None and m.alive:
                g._crash(node)
                hit += 1
        self.stats["node_crashes"] += 1
        self.stats["node_crashes_several_groups"] += hit >= 2

    def restart_node(self, node: str) -> None:
        """The node is back: Ray restarts the member of every group on it (none gone for good)."""
        for g in self.groups:
            m = g.members.get(node)
            if m is not None and not m.alive and not g.gone(node):
                g._start(node)

    # ================================================================ clients

    def _produce(self, now: int) -> None:
        """Each client due starts a batch: keys drawn, the batch split by the router, each
        part queued for its partition's session client -- unless one of those partitions
        has ``window`` of the client's appends unfinished (it tries again next step)."""
        rng = self._produce_rng
        for k, prod in enumerate(self.producers):
            if not self.clients_on or now < prod.next_at:
                continue
            keys = [rng.choice(KEYS) for _ in range(rng.randint(*BATCH))]
            parts = [(self.groups[p % self.partitions], at)
                     for p, at in enumerate(self.router.split(len(keys), keys)) if at]  # fmt: skip
            if any(g.backlog(prod.id, g.clients[k]) >= prod.window for g, _ in parts):
                self.stats["batches_held_back"] += 1
                continue
            tags = []
            for key in keys:
                prod.seqs[key] += 1
                tags.append(f"T|{prod.id}|{key}|{prod.seqs[key]}|")
            for g, at in parts:
                g.outbox[prod.id].append(tuple(g.topic_body(keys[j], tags[j]) for j in at))
                self.stats[f"entries_routed_p{g.partition}"] += len(at)
            prod.batches += 1
            prod.next_at = now + rng.randint(*PRODUCE_EVERY_MS)

    # ================================================================ the loop

    def step(self, until: int) -> None:
        now = min(g._next_event_ms(until) for g in self.groups)
        self.steps += 1
        self._produce(now)
        for g in self.groups:  # (an earlier group's step may have made something due now)
            if g._next_event_ms(until) <= now:
                g.step(now)
        if self.clock.now_ms < now:
            self.clock.advance_to(now)

    def converged(self) -> bool:
        return all(g.converged() for g in self.groups)

    def heal(self) -> None:
        """The faults end (each group's, then the cluster's, once the last group healed --
        a failing disk's exit on healing is started again too); nothing more is sent."""
        self.clients_on = False
        for g in self.groups:
            g.heal()
            g.outbox.clear()
        self.injector.heal_all(NetworkConfig())

    def run(self, chaos_ms: int = 15_000, converge_within_ms: int = 30_000) -> None:
        """Chaos for ``chaos_ms``, then heal, require every group to converge within
        ``converge_within_ms``, and check each group and the topic."""
        self.run_until(chaos_ms)
        self.heal()
        self._converge(converge_within_ms, "after healing")

    def clients_again(
        self, ms: int = 3000, wait_ms: int = 20_000, converge_within_ms: int = 20_000
    ) -> dict[tuple[int, str], int]:
        """Clients on again once every group converged -- for ``ms``, and up to ``wait_ms``
        more until each client got an append acknowledged by every partition -- then every
        check again: how many appends each (partition, client) got acknowledged meanwhile."""
        before = {(g.partition, c.id): c.acks for g in self.groups for c in g.clients}
        for g in self.groups:
            leader = next(m.id for m in g.members.values() if m.alive and m.state.is_leader)
            for c in g.clients:  # as LedgerClient finds it
                c.believed = leader
            g.members_known = g.current_members()
            g.clients_on = True
        self.clients_on = True
        self.run_for(ms)
        self.run_for(wait_ms, lambda: all(c.acks > before[(g.partition, c.id)]
                                          for g in self.groups for c in g.clients))  # fmt: skip
        self.clients_on = False
        for g in self.groups:
            g.clients_on = False
            g.members_known = None
            g.outbox.clear()
        self._converge(converge_within_ms, "after the clients' second run")
        return {(g.partition, c.id): c.acks - before[(g.partition, c.id)]
                for g in self.groups for c in g.clients}  # fmt: skip

    def _converge(self, within_ms: int, when: str) -> None:
        """Every group converged (one a power loss without sync_flush wedged is counted, as
        a lone group's run counts it), then each group's checks and the topic's."""
        if not self.run_for(within_ms, self.converged):
            stuck = [g for g in self.groups if not g.converged()]
            if not all(g.durability_void for g in stuck):
                self.fail(f"no convergence within {within_ms} ms {when}: "
                          f"{[f'p{g.partition}' for g in stuck]}")  # fmt: skip
            for g in stuck:
                g.stats["unconverged_after_power_loss"] += 1
        for g in self.groups:
            g.check_invariants()
            converged = g.converged()
            if converged:
                g.check_configurations()
                g.final_check()
            if g.machine_path is not None:
                g.check_machines()
                if converged:
                    g.check_kv_history()
        self.check_topic()

    # ================================================================ the topic's checks

    def check_topic(self) -> None:
        """Every acknowledged append committed once, where acknowledged, in its key's
        partition; no body committed twice in the topic; per client and key, acknowledged
        appends in the order issued."""
        where: dict[Tag, tuple[int, int]] = {}  # tag -> (partition, index) committed
        for g in self.groups:
            for index, body in g.committed_log():
                tag = parse_tag(g._body_key(body))
                if tag is None:
                    continue
                if tag in where:
                    self.fail(f"{tag} committed twice in the topic: p{where[tag][0]} at "
                              f"{where[tag][1]} and p{g.partition} at {index}")  # fmt: skip
                where[tag] = (g.partition, index)
        acked: dict[tuple[str, str], list[tuple[int, int, int]]] = collections.defaultdict(list)
        for g in self.groups:
            for index, body in g.acked.items():
                tag = parse_tag(g._body_key(body))
                if tag is None:
                    self.fail(f"p{g.partition} acknowledged {body[:40]!r}, no topic entry")
                client, key, seq = tag
                home = partition_of(key, self.partitions)
                if home != g.partition:
                    self.fail(f"{client}'s append {seq} of key {key!r} was acknowledged by "
                              f"p{g.partition} at {index}, but the key maps to p{home}")  # fmt: skip
                if g.durability_void:  # (what a power loss without sync_flush may drop)
                    continue
                if where.get(tag) != (g.partition, index):
                    self.fail(f"{tag} acknowledged by p{g.partition} at {index} is committed at "
                              f"{where.get(tag)} (partition, index)")  # fmt: skip
                acked[(client, key)].append((seq, g.partition, index))
        self.stats["key_order_pairs"] = sum(len(got) - 1 for got in acked.values())
        for (client, key), got in acked.items():
            got.sort()
            for a, b in itertools.pairwise(got):
                if b[1:] <= a[1:]:
                    self.fail(f"{client}'s appends of key {key!r} out of order: {a[0]} "
                              f"committed at p{a[1]}:{a[2]}, {b[0]} (issued later) at "
                              f"p{b[1]}:{b[2]}")  # fmt: skip

    def reached(self) -> dict[str, int]:
        """What the run reached: partitions with leader changes and with appends
        acknowledged in several terms, node crashes that hit several groups, and appends
        acknowledged per partition."""
        out = dict(self.stats)
        out["partitions_with_leader_changes"] = sum(
            len(g.leaders_by_term) >= 2 for g in self.groups
        )
        out["partitions_acked_in_several_terms"] = sum(
            len(set(g.acked_terms.values())) >= 2 for g in self.groups
        )
        out["partitions_acked"] = sum(bool(g.acked) for g in self.groups)
        return out

    def close(self) -> None:
        for g in self.groups:
            g.close()


__all__ = ["GroupNet", "NodeFaults", "Producer", "TopicGroup", "TopicSim", "parse_tag"]
