"""LedgerGroup: create, find, watch, fault and stop a group of member actors."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import ray
from rayledger.actors.client import LedgerClient
from rayledger.actors.config import LedgerConfig
from rayledger.actors.faults import LinkFaults, load_faults, save_faults
from rayledger.actors.member.actor import spawn_member
from rayledger.actors.naming import (
    NAMESPACE,
    TOPICS_NAMESPACE,
    actor_name,
    group_members,
    partition_of_group,
)
from rayledger.actors.placement import alive_nodes, forget_node, member_nodes
from rayledger.actors.ray_compat import kv_get
from rayledger.actors.types import MemberStatus
from rayledger.election import Role
from rayledger.election.configuration import Configuration
from rayledger.election.membership import (
    Membership,
    Op,
    check_live_quorum,
    check_node,
    choose_node,
)
from rayledger.storage import LedgerError, ResponseCode
from rayledger.storage.metafile import ensure_writable_dir

log = logging.getLogger("rayledger.actors")
T = TypeVar("T")


def _bad(msg: str) -> LedgerError:
    return LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, msg)


def member_ids(members: int | Sequence[str]) -> list[str]:
    """``n0..n{k-1}`` for a count, else the given ids, checked."""
    if isinstance(members, bool):
        raise _bad("members must be a count or a list of member ids")
    if isinstance(members, int):
        if members < 1:
            raise _bad(f"a group needs at least 1 member, got {members}")
        return [f"n{i}" for i in range(members)]
    if not isinstance(members, Iterable) or isinstance(members, (str, bytes)):
        raise _bad(f"members must be a count or a list of member ids, got {members!r}")
    ids = list(members)
    if not ids:
        raise _bad("a group needs at least 1 member")
    if any(not isinstance(m, str) or not m or "/" in m for m in ids):
        raise _bad(f"member ids must be non-empty strings without '/', got {ids!r}")
    if len(set(ids)) != len(ids):
        raise _bad(f"duplicate member ids: {ids!r}")
    return ids


def check_group_args(
    kind: str,
    name: object,
    members: int | Sequence[str],
    store_dir: str | os.PathLike | None,
    config: LedgerConfig | None,
) -> tuple[list[str], LedgerConfig, str | None]:
    """``(ids, config, store_dir)`` checked and resolved, then Ray joined: the checks a
    group, a topic and a broker cluster share, so each refuses alike (``kind`` names it)."""
    if not isinstance(name, str) or not name or "/" in name:
        raise _bad(f"{kind} name must be a non-empty string without '/', got {name!r}")
    ids = member_ids(members)
    config = config or LedgerConfig()
    if not isinstance(config, LedgerConfig):
        raise _bad(f"config must be a LedgerConfig, got {type(config).__name__}")
    if store_dir is not None:
        store_dir = str(Path(store_dir).expanduser().resolve())
        ensure_writable_dir(store_dir)
    if not ray.is_initialized():
        ray.init(namespace=NAMESPACE)
    return ids, config, store_dir


def with_preferred(config: LedgerConfig, member: str) -> LedgerConfig:
    """``config`` with ``member`` as the group's preferred leader (DLedger's
    preferredLeaderIds: the leader hands over to it once it is caught up)."""
    election = dataclasses.replace(config.election, preferred_leader_ids=(member,))
    return dataclasses.replace(config, election=election)


def start_groups(
    names: Sequence[str],
    ids: Sequence[str],
    config: LedgerConfig,
    start: Callable[[str, LedgerConfig], T],
    stop: Callable[[T], None],
    workers: int,
) -> list[T]:
    """``start(name, config)`` for every name in parallel, group ``i`` preferring member
    ``ids[i mod len(ids)]`` so the leaders spread; results in ``names`` order.  Every start
    is waited for, so none is left running unseen: on any failure the started ones are
    stopped and the first error raised."""
    started: list[T] = []
    try:
        with ThreadPoolExecutor(max(1, min(len(names), workers))) as pool:
            futs = [
                pool.submit(start, name, with_preferred(config, ids[i % len(ids)]))
                for i, name in enumerate(names)
            ]
            errors = []
            for f in futs:
                try:
                    started.append(f.result())
                except Exception as exc:  # noqa: PERF203 -- every group is waited for
                    errors.append(exc)
            if errors:
                raise errors[0]
    except BaseException:
        for s in started:
            stop(s)
        raise
    return started


def _check_not_a_partition(name: str, partition_of: str | None) -> None:
    """UNEXPECTED_ARGUMENT when ``name`` is a partition's group of an existing topic that is
    not the one starting it."""
    owner = partition_of_group(name)
    if owner is None or owner[0] == partition_of:
        return
    raw = kv_get(owner[0], TOPICS_NAMESPACE)
    if raw is not None and owner[1] < json.loads(raw)["partitions"]:
        raise _bad(f"{name!r} is partition {owner[1]} of the topic {owner[0]!r}: use the topic")


def _stop(handle: Any) -> None:
    """Close a member actor (its store flushed), then kill it for good; best effort."""
    try:
        ray.get(handle.close.remote(), timeout=5)
    except Exception:
        pass
    try:
        ray.kill(handle, no_restart=True)
    except Exception:
        pass


def _left(deadline: float) -> float:
    """Seconds left until ``deadline`` (a call's one budget, however many waits it has)."""
    return max(0.5, deadline - time.monotonic())


class LedgerGroup:
    """A handle on a group of :class:`~rayledger.actors.member.actor.MemberActor`; cheap to create,
    any driver can hold one."""

    def __init__(
        self, name: str, members: Sequence[str], store_dir: str | None, config: LedgerConfig
    ):
        self.name = name
        self._members = list(members)
        self._roles: dict[str, str] = {m: "voter" for m in self._members}
        self._refreshed = 0.0
        self.store_dir = store_dir
        self.config = config
        self._handles: dict[str, Any] = {}
        self._leader_hint: str | None = None  # the member that led at the last look
        for m in self._members:
            self._attach(m)
        self._pids: dict[str, int] = {}  # processes this handle paused

    def _attach(self, member: str) -> None:
        try:
            self._handles[member] = ray.get_actor(actor_name(self.name, member),
                                                  namespace=NAMESPACE)  # fmt: skip
        except ValueError:  # its actor is gone (a member lost with its node, then removed)
            self._handles.pop(member, None)

    # -- membership ----------------------------------------------------------------
    @property
    def members(self) -> list[str]:
        """The committed configuration's members (voters, then learners), as the group
        says now (looked up at most once a second)."""
        if time.monotonic() - self._refreshed > 1.0:
            self.refresh()
        return list(self._members)

    def roles(self) -> dict[str, str]:
        """Each member's role in the committed configuration: "voter" or "learner"."""
        self.members  # noqa: B018 -- refreshes
        return dict(self._roles)

    def membership(self, timeout_s: float = 5.0) -> dict:
        """The leader's view (else any member's): ``latest`` (the configuration it acts
        on), ``committed``, and ``waiting`` (lost members with no node to replace them on).

        One call in the common case: the member that led at the last look first, then the
        one each answer names as leader.  (A look through :meth:`status` asks every member
        for its whole status: ``replace_member`` polling it ten times a second cost the
        group's appends more than the learner it waited for.)"""
        order = list(self._handles)
        if self._leader_hint in order:
            order.remove(self._leader_hint)
            order.insert(0, self._leader_hint)
        last: Exception | None = None
        fallback = None
        tried: set[str] = set()
        while order:
            m = order.pop(0)
            if m in tried:
                continue
            tried.add(m)
            try:
                doc = ray.get(self._handles[m].membership.remote(), timeout=timeout_s)
            except Exception as exc:
                last = exc
                continue
            if doc.get("leads"):
                self._leader_hint = m
                return doc
            fallback = fallback or doc
            hint = doc.get("leader_id")
            if hint and hint not in self._handles:
                # a leader this driver has no handle for: a member added meanwhile, maybe
                # the one a leader to leave handed over to (a refresh before its change
                # committed dropped it) -- ignoring it, a replace waited for good
                self._attach(hint)
            if hint in self._handles and hint not in tried:
                order.insert(0, hint)
        if fallback is not None:
            return fallback
        raise LedgerError.of(ResponseCode.UNKNOWN_GROUP,
                             f"no member of {self.name!r} answers: {last}")  # fmt: skip

    def _ask_all(self) -> dict[str, dict | Exception | None]:
        """Every member's membership doc, all at once and a second at most (a dead member,
        a lost node, must not slow every look): the doc, the call's error, or None for no
        answer in time."""
        refs = {m: h.membership.remote() for m, h in self._handles.items()}
        ready, _ = (
            ray.wait(list(refs.values()), num_returns=len(refs), timeout=1.0) if refs else ([], [])
        )
        out: dict[str, dict | Exception | None] = {}
        for m, ref in refs.items():
            try:
                out[m] = ray.get(ref, timeout=0.1) if ref in ready else None
            except Exception as exc:
                out[m] = exc
        return out

    def _views(self) -> dict[str, str]:
        """What each member says of the group: for an error that has to tell a group
        without a leader from a driver that does not find it."""
        views = {}
        for m, doc in self._ask_all().items():
            if doc is None:
                views[m] = "no answer in 1 s"
            elif isinstance(doc, Exception):
                views[m] = f"fails: {type(doc).__name__}"
            else:
                views[m] = (f"term {doc['term']} {'leads' if doc['leads'] else 'follows'} "
                            f"{doc['leader_id']} committed {doc['committed_index']}")  # fmt: skip
        return views

    def refresh(self) -> None:
        """Follow the committed configuration: handles for members added (by any driver, or
        a leader replacing a lost member), none for members removed."""
        self._refreshed = time.monotonic()
        docs = [d for d in self._ask_all().values() if isinstance(d, dict)]
        best = max(docs, key=lambda d: d["committed_index"], default=None)
        if best is None:
            return
        c = Configuration.from_doc(best["committed"])
        for m in c.members:
            if m not in self._handles:
                self._attach(m)
        self._handles = {m: h for m, h in self._handles.items() if m in c}
        self._members = list(c.members)
        self._roles = {m: c.role_of(m) or "" for m in c.members}

    def _change(self, op: str, member: str, replaces: str = "", timeout_s: float = 60.0) -> None:
        """One configuration change on whoever leads, following NOT_LEADER and hand-overs
        (a leader to leave hands over first) until ``timeout_s``.  A try whose outcome is
        unknown (a leader lost meanwhile) is followed by a look at the latest
        configuration: a change already there is not asked for twice."""
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        tried = False
        while time.monotonic() < deadline:
            left = max(0.5, deadline - time.monotonic())
            if tried and self._applied(op, member, replaces):
                return
            tried = True
            try:
                leader = self.wait_for_leader(min(left, 30.0))
                ray.get(self._handles[leader].change_members.remote(op, member, replaces),
                        timeout=left)  # fmt: skip
                return
            except LedgerError as exc:
                retry = (ResponseCode.NOT_LEADER, ResponseCode.LEADER_TRANSFERRING,
                         ResponseCode.LEADER_NOT_READY, ResponseCode.TIMEOUT,
                         ResponseCode.APPEND_OUTCOME_UNKNOWN, ResponseCode.TERM_CHANGED,
                         ResponseCode.WAIT_QUORUM_ACK_TIMEOUT)  # fmt: skip
                if exc.code not in retry:
                    raise
                last = exc
            except ray.exceptions.RayError as exc:
                last = exc
            time.sleep(0.1)
        raise LedgerError.of(ResponseCode.TIMEOUT, f"{op} {member}: no answer in time: {last}")

    def _applied(self, op: str, member: str, replaces: str) -> bool:
        """Whether the latest configuration already holds change ``op`` on ``member``."""
        try:
            latest = Configuration.from_doc(self.membership()["latest"])
        except LedgerError:
            return False
        if op == Op.REMOVE:
            return member not in latest
        if op == Op.REPLACE:
            return latest.replacement_of(replaces) == member or (
                replaces not in latest and member in latest
            )
        if op == Op.PROMOTE:
            return latest.is_voter(member)
        return member in latest

    def _wait_config(self, done, what: str, timeout_s: float) -> Configuration:
        """Look at the leader's configuration until ``done``: at once, then less and less
        often (a quarter second at most) -- each look is a call the leader serves between
        appends, and ten a second cost a probe's appends 10-20 % of latency."""
        deadline = time.monotonic() + timeout_s
        pause = 0.05
        while True:
            doc = self.membership()
            c = Configuration.from_doc(doc["committed"])
            if done(c):
                self.refresh()
                return c
            if time.monotonic() > deadline:
                raise LedgerError.of(ResponseCode.TIMEOUT,
                                     f"{what} not committed within {timeout_s}s: {doc}; "
                                     f"every member's view: {self._views()}")  # fmt: skip
            time.sleep(pause)
            pause = min(0.25, pause * 1.5)

    def _place(self, node_id: str | None) -> str | None:
        """The node for a new member: ``node_id`` checked, or a live node hosting no member
        of this group (the only node of a one-node cluster); NODE_UNAVAILABLE if none."""
        alive = alive_nodes()
        # a member's node counts as taken even when it is the one being replaced: Ray may
        # still report a lost node alive for a while
        nodes = member_nodes(self.name, self._members)
        if node_id is not None:
            return check_node(node_id, alive, nodes)
        node = choose_node(alive, nodes)
        if node is None:
            raise LedgerError.of(ResponseCode.NODE_UNAVAILABLE,
                                 f"every live node hosts a member of {self.name!r}")  # fmt: skip
        return node

    def _spawn(self, member: str, config: Configuration, node: str | None) -> None:
        h = spawn_member(self.name, member, list(config.members), self.config, self.store_dir,
                         node, config.to_doc())  # fmt: skip
        try:
            ray.get(h.start.remote(), timeout=60)
        except Exception:
            ray.kill(h, no_restart=True)
            raise
        self._handles[member] = h

    def _drop(self, member: str) -> None:
        """A member removed from the configuration: its actor stops (its data stays)."""
        h = self._handles.pop(member, None)
        if h is None:
            self._attach(member)
            h = self._handles.pop(member, None)
        if h is not None:
            _stop(h)
        save_faults(self.name, member, LinkFaults())
        forget_node(self.name, member)

    def add_member(
        self,
        member_id: str | None = None,
        node_id: str | None = None,
        learner: bool = False,
        timeout_s: float = 60.0,
    ) -> str:
        """Add a member on ``node_id`` (default: a live node hosting no member of this
        group): it joins as a learner, gets the log (or the leader's snapshot), and --
        unless ``learner`` -- is promoted to voter once within ``promote_lag`` entries of
        the leader.  Returns its id (``member_id``, or a fresh ``n<k>``)."""
        deadline = time.monotonic() + timeout_s
        self.refresh()
        latest = Configuration.from_doc(self.membership()["latest"])
        if member_id is None:
            member_id = latest.fresh_id(group_members(self.name))
        op = Op.ADD_LEARNER if learner else Op.ADD
        role = "learner" if learner else "voter"
        # an add interrupted earlier: the member is a learner, planned to vote as asked
        resumed = latest.is_learner(member_id) and (
            learner or latest.plan_of(member_id) == ""
        ) and member_id in group_members(self.name)  # fmt: skip
        if not resumed:
            proposed = Membership(self_id="").propose(latest, op, member_id)  # refuses bad ids
            if member_id in group_members(self.name):
                raise LedgerError.of(ResponseCode.UNEXPECTED_MEMBER,
                                     f"an actor of member {member_id!r} runs already")  # fmt: skip
            node = self._place(node_id)
            self._spawn(member_id, proposed, node)
            try:
                self._change(op, member_id, timeout_s=_left(deadline))
            except Exception:
                if not self._applied(op, member_id, ""):  # else it may still commit: keep it
                    self._drop(member_id)
                raise
        self._wait_config(lambda c: c.role_of(member_id) == role, f"{member_id} as {role}",
                          _left(deadline))  # fmt: skip
        return member_id

    def remove_member(self, member_id: str, timeout_s: float = 60.0) -> None:
        """Remove a member (the leader hands leadership over first); its actor stops.
        Refused, with nothing changed: an unknown member (UNKNOWN_MEMBER), the last voter
        (ILLEGAL_MEMBER_STATE), a change that leaves no majority of live voters
        (NO_LIVE_QUORUM), another change in flight (CONFIG_CHANGE_IN_PROGRESS)."""
        deadline = time.monotonic() + timeout_s
        latest = Configuration.from_doc(self.membership()["latest"])
        after = latest.without(member_id)
        alive = [m for m, s in self.status().items() if s.alive]
        check_live_quorum(after, alive)
        if self.leader_id() == member_id:  # hand leadership to a live voter that stays first
            target = next(v for v in after.voters if v in alive)
            self.transfer_leadership(target, timeout_s=min(30.0, _left(deadline)))
        self._change(Op.REMOVE, member_id, timeout_s=_left(deadline))
        self._wait_config(lambda c: member_id not in c, f"removal of {member_id}",
                          _left(deadline))  # fmt: skip
        self._drop(member_id)

    def replace_member(
        self,
        old: str,
        node_id: str | None = None,
        member_id: str | None = None,
        timeout_s: float = 120.0,
    ) -> str:
        """Replace ``old`` by a new member on ``node_id`` (default: a live node hosting no
        member of this group, else -- one node -- that node): a learner, caught up,
        promoted, then ``old`` removed, all carried on by the leader.  Safe to run again
        when interrupted: it picks up the replacement under way.  Returns the new id."""
        deadline = time.monotonic() + timeout_s
        doc = self.membership()
        latest = Configuration.from_doc(doc["latest"])
        new = latest.replacement_of(old)
        if new is not None and member_id not in (None, new):
            raise LedgerError.of(ResponseCode.CONFIG_CHANGE_IN_PROGRESS,
                                 f"{old!r} is being replaced by {new!r} already")  # fmt: skip
        if new is None:
            if old not in latest:
                raise LedgerError.of(ResponseCode.UNKNOWN_MEMBER,
                                     f"{old!r} is not a member of {self.name!r}")  # fmt: skip
            if member_id is None:
                member_id = latest.fresh_id(group_members(self.name))
            proposed = Membership(self_id="").propose(latest, Op.REPLACE, member_id, old)
            node = self._place(node_id)
            self._spawn(member_id, proposed, node)
            try:
                self._change(Op.REPLACE, member_id, old, timeout_s=_left(deadline))
            except Exception:
                if not self._applied(Op.REPLACE, member_id, old):  # else it may commit yet
                    self._drop(member_id)
                raise
            new = member_id
        role = latest.role_of(old)  # a learner's replacement stays a learner
        self._wait_config(lambda c: old not in c and c.role_of(new) == role,
                          f"replacement of {old} by {new}", _left(deadline))  # fmt: skip
        self._drop(old)
        return new

    # -- creating and finding -------------------------------------------------------------
    @classmethod
    def create(
        cls,
        name: str,
        members: int | Sequence[str] = 3,
        store_dir: str | os.PathLike | None = None,
        config: LedgerConfig | None = None,
        *,
        spread: bool = True,
        nodes: Sequence[str] | None = None,
        partition_of: str | None = None,
    ) -> LedgerGroup:
        """Start a group; every argument is checked before any actor starts.  Members go
        one per node, round robin over the live nodes (``nodes``: over these node ids).
        A name of a topic's partition (``T-p0`` of a topic ``T``) is refused unless the
        topic starts it (``partition_of``: the topic's name)."""
        ids, config, store_dir = check_group_args("group", name, members, store_dir, config)
        if group_members(name):
            raise _bad(f"a group named {name!r} already exists in namespace {NAMESPACE!r}")
        _check_not_a_partition(name, partition_of)

        # One member per node when there are several (round robin over live nodes). The
        # affinity is hard, as a member's disk is on its host: when a node is gone its
        # member stays down (a host failure), while a crashed process restarts in place.
        alive = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
        explicit = nodes is not None
        if nodes is not None:
            for node in nodes:
                check_node(node, alive, {})  # NODE_UNAVAILABLE: not a live node
            nodes = list(nodes)
        else:
            nodes = alive if spread else []
        handles = []
        for i, m in enumerate(ids):
            node = nodes[i % len(nodes)] if len(nodes) > 1 or (explicit and nodes) else None
            handles.append(spawn_member(name, m, ids, config, store_dir, node))
        try:
            ray.get([h.start.remote() for h in handles])
        except Exception:
            for h in handles:
                ray.kill(h, no_restart=True)
            raise
        log.info("group %s started with members %s", name, ids)
        return cls(name, ids, store_dir, config)

    @classmethod
    def get(cls, name: str) -> LedgerGroup:
        """Attach to a running group by name (from any driver or Ray job)."""
        if not ray.is_initialized():
            ray.init(address="auto", namespace=NAMESPACE)
        ids = group_members(name)
        if not ids:
            raise LedgerError.of(ResponseCode.UNKNOWN_GROUP, f"no group named {name!r} is running")
        info = None
        for m in ids:
            try:
                info = ray.get(
                    ray.get_actor(actor_name(name, m), namespace=NAMESPACE).info.remote(),
                    timeout=10,
                )
                break
            except Exception:
                continue
        if info is None:
            raise LedgerError.of(ResponseCode.UNKNOWN_GROUP, f"no member of group {name!r} answers")
        data_dir = info["config"].store.data_dir
        store_dir = str(Path(data_dir).parent.parent) if data_dir else None
        group = cls(name, [m for m in info["peers"] if m in ids] or ids, store_dir, info["config"])
        group.refresh()
        return group

    def client(self, timeout_s: float = 30.0, idempotent: bool = True) -> LedgerClient:
        """A client of this group: exactly-once appends, an unknown outcome
        retried under the same identity until the deadline; ``idempotent=False`` keeps the
        smallest entries and leaves unknown outcomes to the caller."""
        return LedgerClient(self.name, self.members, timeout_s=timeout_s, idempotent=idempotent)

    def handle(self, member: str):
        """Member ``member``'s actor handle; a member not known yet is looked up again (it
        may have joined through another driver or a leader's replacement) before
        UNKNOWN_MEMBER."""
        if member not in self._handles:
            self.refresh()
        if member not in self._handles:
            raise LedgerError.of(
                ResponseCode.UNKNOWN_MEMBER, f"{member!r} is not a member of {self.name!r}"
            )
        return self._handles[member]

    def compact(self, member: str | None = None, timeout_s: float = 60.0) -> dict[str, int]:
        """Compact the logs of ``member`` (default: every member) up to what each one's
        state machine can come back from -- its newest snapshot, or what it saved itself --
        whatever the segments' age; returns each member's log begin index after it.  A
        member that comes back below a leader's new begin gets the leader's snapshot."""
        targets = [member] if member is not None else list(self.members)
        refs = {m: self.handle(m).compact.remote() for m in targets}
        return {m: ray.get(ref, timeout=timeout_s) for m, ref in refs.items()}

    def set_fast_path(self, enabled: bool, timeout_s: float = 30.0) -> None:
        """Switch the compiled path off, or on again, at every member without a restart:
        a leader running its graph falls back to plain calls at once, or builds it again.
        Only for a group created with ``LedgerConfig(fast_path=True)`` (UNSUPPORTED
        otherwise: its followers never prepared to run a graph)."""
        if not isinstance(enabled, bool):
            raise _bad(f"enabled must be a bool, got {enabled!r}")
        if not self.config.fast_path:
            raise LedgerError.of(
                ResponseCode.UNSUPPORTED,
                f"{self.name!r} runs without fast_path; create it with "
                "LedgerConfig(fast_path=True) to switch the compiled path",
            )
        refs = [h.set_fast_path.remote(enabled) for h in self._handles.values()]
        ray.get(refs, timeout=timeout_s)

    # -- watching ---------------------------------------------------------------------------
    def status(self, timeout_s: float = 2.0) -> dict[str, MemberStatus]:
        """Each member's status (the committed configuration's members; ``membership``:
        voter or learner)."""
        members = self.members
        refs = {m: self._handles[m].status.remote() for m in members if m in self._handles}
        out = {m: MemberStatus(None, -1, None, -1, -1, -1, alive=False) for m in members}
        for m, ref in refs.items():
            try:
                out[m] = ray.get(ref, timeout=timeout_s)
            except Exception:
                out[m] = MemberStatus(None, -1, None, -1, -1, -1, alive=False)
        return out

    def leader_id(self) -> str | None:
        """The member that leads now, as a majority of live members see it."""
        st = self.status()
        leaders = [(s.term, m) for m, s in st.items() if s.alive and s.role == Role.LEADER]
        if not leaders:
            return None
        term, m = max(leaders)
        voters = [v for v, r in self._roles.items() if r == "voter"] or list(st)
        agree = sum(1 for v in voters if v in st and st[v].alive and st[v].term == term
                    and st[v].leader_id == m)  # fmt: skip
        return m if agree >= len(voters) // 2 + 1 else None

    def wait_for_leader(self, timeout_s: float = 30.0, exclude: str | None = None) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.leader_id()
            if leader is not None and leader != exclude:
                return leader
            time.sleep(0.05)
        raise LedgerError.of(
            ResponseCode.TIMEOUT,
            f"no leader in group {self.name!r} after {timeout_s}s: {self.status()}",
        )

    # -- operations ---------------------------------------------------------------------------
    def transfer_leadership(self, target: str, timeout_s: float = 15.0) -> str:
        self.handle(target)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.wait_for_leader(max(0.1, deadline - time.monotonic()))
            if leader == target:
                return target
            try:  # answers once the transfer ended: the old leader saw a newer term
                left = max(0.1, deadline - time.monotonic())
                ray.get(self._handles[leader].transfer_leadership.remote(target), timeout=left)
            except LedgerError as exc:  # not the leader any more, or the transfer failed
                log.info("transfer to %s: %s", target, exc)
            except ray.exceptions.GetTimeoutError:
                break
            try:  # the target takes the term it was handed
                if self.wait_for_leader(min(3.0, max(0.1, deadline - time.monotonic()))) == target:
                    return target
            except LedgerError:
                pass  # no leader yet: ask again
        raise LedgerError.of(
            ResponseCode.TIMEOUT, f"leadership did not move to {target} within {timeout_s}s"
        )

    def _info(self, member: str, timeout_s: float = 30.0) -> dict:
        """The member's process facts, waiting while Ray restarts it."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return ray.get(self.handle(member).info.remote(), timeout=5)
            except ray.exceptions.RayError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def kill(self, member: str) -> None:
        """Kill the member's process hard (SIGKILL); Ray restarts a file-backed member."""
        h = self.handle(member)
        try:
            info = self._info(member, timeout_s=10)
        except ray.exceptions.RayError:
            info = None
        here = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        if info and info["node_id"] == here and socket.gethostname():
            try:
                os.kill(info["pid"], signal.SIGKILL)
                return
            except ProcessLookupError:
                return
        ray.kill(h, no_restart=False)

    def pause(self, member: str) -> int:
        """Freeze the member's process (SIGSTOP), like a long GC pause or a hung host; its pid."""
        self._signal(member, signal.SIGSTOP)
        return self._pids[member]

    def resume(self, member: str, pid: int | None = None) -> None:
        """Let a paused member run again (SIGCONT); ``pid`` when another handle paused it."""
        if pid is not None:
            self._pids[member] = pid
        self._signal(member, signal.SIGCONT)

    def _signal(self, member: str, sig: int) -> None:
        pid = self._pids.get(member) if sig == signal.SIGCONT else None
        if pid is None:
            info = self._info(member)
            if info["node_id"] != ray.get_runtime_context().get_node_id():
                raise LedgerError.of(
                    ResponseCode.UNSUPPORTED,
                    f"{member} runs on another node; pause/resume work on the local node only",
                )
            pid = info["pid"]
        self._pids[member] = pid
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def partition(
        self, *sides: Iterable[str], one_way: bool = False, drop: float = 0.0, delay_ms: float = 0.0
    ) -> None:
        """Cut every link between members on different sides.

        With ``one_way`` only messages from the first side to the others are cut.
        Members in no side keep all their links.  ``drop``/``delay_ms`` add loss and
        latency on the links that stay up.
        """
        sides = [set(s) for s in sides]
        for s in sides:
            for m in s:
                self.handle(m)
        cut: dict[str, set[str]] = {m: set() for m in self.members}
        for i, a in enumerate(sides):
            for j, b in enumerate(sides):
                if i == j or (one_way and i != 0):
                    continue
                for x in a:
                    cut[x] |= b
        self._set_faults(cut, drop, delay_ms)

    def set_link_faults(self, drop: float = 0.0, delay_ms: float = 0.0) -> None:
        self._set_faults({m: set() for m in self.members}, drop, delay_ms)

    def heal(self) -> None:
        self._set_faults({m: set() for m in self.members}, 0.0, 0.0)

    def _set_faults(self, cut: dict[str, set[str]], drop: float, delay_ms: float) -> None:
        refs = []
        for m, h in self._handles.items():
            others = [p for p in self.members if p != m]
            faults = LinkFaults(
                set(cut[m]),
                {p: drop for p in others} if drop else {},
                {p: delay_ms for p in others} if delay_ms else {},
            )
            save_faults(self.name, m, faults)  # a member restarted later starts with them
            refs.append(h.set_faults.remote(sorted(faults.cut), faults.drop, faults.delay_ms))
        self._deliver_faults(refs)

    def _deliver_faults(self, refs: list) -> None:
        """Wait for every member to take its faults; a restarting member is asked again
        until it is up (it also reads them at start, but may have read the old ones)."""
        deadline = time.monotonic() + 20
        for m, r in zip(list(self._handles), refs, strict=True):
            while True:
                try:
                    ray.get(r, timeout=10)
                    break
                except ray.exceptions.ActorUnavailableError:
                    if time.monotonic() > deadline:
                        log.warning("faults not delivered to restarting member %s", m)
                        break
                    time.sleep(0.2)
                    f = load_faults(self.name, m)
                    r = self._handles[m].set_faults.remote(sorted(f.cut), f.drop, f.delay_ms)
                except Exception as exc:
                    log.warning("could not set faults on member %s: %s", m, exc)
                    break

    def shutdown(self, delete_data: bool = False) -> None:
        for m in self.members:
            try:
                save_faults(self.name, m, LinkFaults())  # forget its faults
            except Exception:
                pass
        for m, h in self._handles.items():
            _stop(h)
            forget_node(self.name, m)
        if delete_data and self.store_dir:
            shutil.rmtree(Path(self.store_dir) / self.name, ignore_errors=True)
        log.info("group %s shut down", self.name)
