"""LedgerGroup: create, find, watch, fault and stop a group of member actors."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from rayledger.election import Role
from rayledger.storage import LedgerError, ResponseCode
from rayledger.storage.metafile import ensure_writable_dir

from .client import LedgerClient
from .config import LedgerConfig
from .faults import LinkFaults, load_faults, save_faults
from .member import MemberActor
from .naming import NAMESPACE, actor_name, group_members
from .types import MemberStatus

log = logging.getLogger("rayledger.actors")


def _bad(msg: str) -> LedgerError:
    return LedgerError.of(ResponseCode.UNEXPECTED_ARGUMENT, msg)


def _member_ids(members: int | Sequence[str]) -> list[str]:
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


class LedgerGroup:
    """A handle on a group of :class:`MemberActor`; cheap to create, any driver can hold one."""

    def __init__(
        self, name: str, members: Sequence[str], store_dir: str | None, config: LedgerConfig
    ):
        self.name = name
        self.members = list(members)
        self.store_dir = store_dir
        self.config = config
        self._handles = {
            m: ray.get_actor(actor_name(name, m), namespace=NAMESPACE) for m in self.members
        }
        self._pids: dict[str, int] = {}  # processes this handle paused

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
    ) -> LedgerGroup:
        """Start a group; every argument is checked before any actor starts."""
        if not isinstance(name, str) or not name or "/" in name:
            raise _bad(f"group name must be a non-empty string without '/', got {name!r}")
        ids = _member_ids(members)
        config = config or LedgerConfig()
        if not isinstance(config, LedgerConfig):
            raise _bad(f"config must be a LedgerConfig, got {type(config).__name__}")
        if store_dir is not None:
            store_dir = str(Path(store_dir).expanduser().resolve())
            ensure_writable_dir(store_dir)
        if not ray.is_initialized():
            ray.init(namespace=NAMESPACE)
        if group_members(name):
            raise _bad(f"a group named {name!r} already exists in namespace {NAMESPACE!r}")

        restarts = config.max_restarts if store_dir is not None else 0
        # One member per node when there are several (round robin over live nodes). The
        # affinity is hard, as a member's disk is on its host: when a node is gone its
        # member stays down (a host failure), while a crashed process restarts in place.
        nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive")) if spread else []
        handles = []
        for i, m in enumerate(ids):
            data_dir = str(Path(store_dir) / name / m) if store_dir is not None else None
            opts = dict(
                name=actor_name(name, m),
                namespace=NAMESPACE,
                lifetime="detached",
                max_restarts=restarts,
                max_task_retries=0,
            )
            if len(nodes) > 1:
                opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                    node_id=nodes[i % len(nodes)], soft=False
                )
            handles.append(MemberActor.options(**opts).remote(name, m, ids, config, data_dir))
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
        return cls(name, info["peers"], store_dir, info["config"])

    def client(self, timeout_s: float = 30.0) -> LedgerClient:
        return LedgerClient(self.name, self.members, timeout_s=timeout_s)

    def handle(self, member: str):
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

    # -- watching ---------------------------------------------------------------------------
    def status(self, timeout_s: float = 2.0) -> dict[str, MemberStatus]:
        refs = {m: h.status.remote() for m, h in self._handles.items()}
        out = {}
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
        agree = sum(1 for s in st.values() if s.alive and s.term == term and s.leader_id == m)
        return m if agree >= len(self.members) // 2 + 1 else None

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
        for h in self._handles.values():
            try:
                ray.get(h.close.remote(), timeout=5)
            except Exception:
                pass
            try:
                ray.kill(h, no_restart=True)
            except Exception:
                pass
        if delete_data and self.store_dir:
            shutil.rmtree(Path(self.store_dir) / self.name, ignore_errors=True)
        log.info("group %s shut down", self.name)
