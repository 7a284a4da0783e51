"""The clients' KV history in the whole-group simulation, checked for linearizability per key.

On the seeds that run the KV machine with ``kv_getters``, every KV command a client appends
(put, set, delete, compare-and-set) is an operation of the history: invoked when the client
first sends it, completed when an append carrying it is acknowledged (a compare-and-set's
outcome is the one the machines recorded at its index), and of unknown outcome when it never
is.  KV getters ask any member for a key at any consistency, as ``MemberActor.query`` serves
it: the shipped read path (:class:`~rayledger.actors.core.member.ReadIndex`), then this
member's committed index as the limit, and the machine answers once it applied that far
(a ``Query`` event of ``MachineCore``).  Linearizable and lease gets enter the history (a get without an
answer is dropped: it changed nothing); committed gets may lag and are not checked.

The check runs :mod:`.linearizability` (a Wing-Gong/Porcupine checker) through
:func:`check_history`; while that module is missing the history is only recorded.
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass, field
from typing import Any

from rayledger.actors.core import machine as mcore
from rayledger.actors.core import member as mc
from rayledger.actors.core.machine import QueryVerdict
from rayledger.actors.core.reads import Consistency
from rayledger.storage import LedgerError

from .clients import ClientAppend, ClientReply
from .node_state import Node
from .sim_config import KV_GET_EVERY_MS, KV_GET_TIMEOUT_MS

GET_CONSISTENCIES = ("linearizable", "lease", "committed")
CHECKED = frozenset({"linearizable", "lease"})  # gets that must be linearizable


@dataclass(frozen=True)
class KvGet:
    """A getter's ``query({"get": key}, consistency)`` on a member."""

    client: str
    req_id: int
    key: str
    consistency: str


@dataclass(frozen=True)
class KvGetReply:
    req_id: int
    ok: bool
    value: Any = None


@dataclass
class KvOp:
    """One operation of the history (:mod:`.linearizability`'s model): ``kind`` is put,
    delete, cas or get, ``args`` its arguments, ``out`` what it returned (None for a
    delete's and, when not known, a cas's).  ``client``: a sequential process -- a client's
    batch holds one slot per body, concurrent with each other."""

    id: int
    client: Any
    key: str
    kind: str
    args: tuple
    call_ms: int
    ret_ms: int | None = None
    out: Any = None
    index: int = -1  # where a write was acknowledged


@dataclass
class Getter:
    id: str
    next_at: int = 0
    outstanding: tuple[int, int, KvOp | None] | None = None  # (req id, sent at, its op)
    rng: random.Random = field(default_factory=random.Random)


class _Query(tuple):
    """A get's token for the machine's core (compared by identity): ``(index, request)``,
    and what to do with the answer."""

    done: Any = None


def _norm(value: Any) -> Any:
    """A value as the history compares it: a put's bytes, a set's writer tag."""
    if isinstance(value, dict):
        return value.get("by")
    return value


def parse_command(body: bytes) -> tuple[str, str, tuple] | None:
    """(key, kind, args) of a KV command a client appends (None: not one)."""
    try:
        doc = json.loads(body)
        op, key = doc["op"], doc["key"]
    except (ValueError, KeyError, TypeError):
        return None
    if op == "set":
        return key, "put", (_norm(doc.get("value")),)
    if op == "put":
        return key, "put", (_unb64(doc.get("b64")),)
    if op == "del":
        return key, "delete", ()
    if op == "cas":
        return key, "cas", (_unb64(doc.get("exp")), _unb64(doc.get("b64")))
    return None


def _bodies_of(c: Any, req_id: int) -> tuple[bytes, ...] | None:
    """The bodies of client ``c``'s call ``req_id``, if it waits for that answer (its
    oldest call, or another of a pipelining client's appends in flight)."""
    if c.outstanding is not None and c.outstanding[0] == req_id:
        return c.outstanding[1]
    for a in getattr(c, "appends", {}).values():
        if getattr(a, "req_id", None) == req_id:
            return a.bodies
    return None


def _unb64(v: str | None) -> bytes | None:
    return None if v is None else base64.b64decode(v)


class KvHistory:
    """KV operations and their check (a mixin of :class:`~.group_sim.GroupSim`, before
    :class:`~.clients.Clients`: it sees the clients' sends and answers on their way)."""

    def _init_kv(self, seed: int, getters: int) -> None:
        on = getters > 0 and self.machine == "kv"
        self.kv_on = on
        self.kv_ops: dict[bytes, KvOp] = {}  # a write's body (as sent) -> its operation
        self.kv_gets: list[KvOp] = []
        self._kv_ids = iter(range(1, 1 << 62))
        rng = random.Random(seed * 7919 + 103)  # its own stream
        self.getters = [
            Getter(f"g{k}", rng.randint(0, 100), rng=random.Random(rng.getrandbits(64)))
            for k in range(getters if on else 0)
        ]
        self._kv_inflight: dict[int, Getter] = {}

    # -- writes, on their way ----------------------------------------------------------------
    def _to_client(self, src: str, dst: str, msg: object) -> None:
        if self.kv_on and isinstance(msg, ClientAppend):
            now = self.clock.now_ms
            for slot, body in enumerate(msg.bodies):
                if body not in self.kv_ops:
                    cmd = parse_command(body)
                    if cmd is not None:
                        key, kind, args = cmd
                        op = KvOp(next(self._kv_ids), (src, slot), key, kind, args, now)
                        self.kv_ops[body] = op
        super()._to_client(src, dst, msg)

    def _client_reply(self, c, reply: ClientReply) -> None:
        bodies = _bodies_of(c, reply.req_id)
        if self.kv_on and bodies is not None and reply.code.name == "SUCCESS":
            where = reply.spread or [
                (reply.first_index + k, reply.term)
                for k in range(reply.last_index - reply.first_index + 1)
            ]
            now = self.clock.now_ms
            for body, (index, _term) in zip(bodies, where, strict=False):
                op = self.kv_ops.get(body)
                if op is not None and op.ret_ms is None:
                    op.ret_ms, op.index = now, index
        super()._client_reply(c, reply)

    # -- gets --------------------------------------------------------------------------------
    def _kv_step(self, now: int) -> None:
        for g in self.getters:
            if g.outstanding is not None:
                if now - g.outstanding[1] > KV_GET_TIMEOUT_MS:  # no answer: it changed nothing
                    self._kv_inflight.pop(g.outstanding[0], None)
                    g.outstanding = None
                    self.stats["kv_gets_unanswered"] += 1
                continue
            if not self.clients_on or now < g.next_at:
                continue
            rng = g.rng
            key = rng.choice(("p0", "p1", "p2", "p3", f"k{rng.randint(0, 12)}"))
            consistency = rng.choice(GET_CONSISTENCIES)
            to = rng.choice(self.ids)
            req_id = next(self._req_ids)
            op = None
            if consistency in CHECKED:
                op = KvOp(next(self._kv_ids), g.id, key, "get", (), now)
            g.outstanding = (req_id, now, op)
            self._kv_inflight[req_id] = g
            self.stats[f"kv_gets_{consistency}"] += 1
            self._send_held(g.id, to, KvGet(g.id, req_id, key, consistency), rng.randint(1, 15))

    def _kv_get_arrives(self, node: Node, msg: KvGet) -> None:
        """``MemberActor.query``: the read path first (any member)."""
        self._step(node, mc.ReadIndex(Consistency(msg.consistency), msg, leader_only=False))

    def _kv_read_done(self, node: Node, msg: KvGet, result: Any) -> None:
        """The read path answered: the limit is this member's committed index now
        (``ReadPart._read_limit``); the machine answers once it applied that far."""
        if isinstance(result, LedgerError) or node.applier is None:
            self._send_held(node.id, msg.client, KvGetReply(msg.req_id, False),
                            self._read_rng.randint(1, 15))  # fmt: skip
            return
        limit = node.logic.store.committed_index
        token = _Query((limit, {"get": msg.key}))
        token.done = lambda answer: self._send_held(
            node.id, msg.client, KvGetReply(msg.req_id, True, answer), self._read_rng.randint(1, 15)
        )
        now = self.clock.now_ms
        try:
            verdict = node.applier.core.step(mcore.Query(limit, token, KV_GET_TIMEOUT_MS), now)
        except LedgerError:
            return  # the machine failed: no answer
        if verdict == QueryVerdict.ANSWER:
            self._m_answer(node, token)
        else:
            self._at(node, now + KV_GET_TIMEOUT_MS, self._m_expire, node)

    def _kv_reply(self, dst: str, reply: KvGetReply) -> None:
        g = self._kv_inflight.pop(reply.req_id, None)
        if g is None or g.id != dst or g.outstanding is None or g.outstanding[0] != reply.req_id:
            return
        _, _, op = g.outstanding
        g.outstanding = None
        g.next_at = self.clock.now_ms + g.rng.randint(*KV_GET_EVERY_MS)
        if not reply.ok:
            self.stats["kv_gets_refused"] += 1
            return
        self.stats["kv_gets_answered"] += 1
        if op is not None:
            op.ret_ms = self.clock.now_ms
            op.out = None if reply.value is None else _norm(reply.value[0])
            self.kv_gets.append(op)

    # -- the check ---------------------------------------------------------------------------
    def kv_history(self) -> list[KvOp]:
        """Every operation, a compare-and-set's outcome filled in from the committed log
        replayed (None when the replay is not known: a power loss voided it)."""
        ops = list(self.kv_ops.values())
        cas = [op for op in ops if op.kind == "cas" and op.ret_ms is not None]
        if cas:
            fresh = self._replayed_to(self.max_committed)
            for op in cas:
                op.out = None if fresh is None else fresh.cas_results.get(op.index)
        return sorted([*ops, *self.kv_gets], key=lambda op: (op.call_ms, op.id))

    def check_kv_history(self) -> None:
        """The clients' history is linearizable per key (skipped after a power loss voided
        the durability guarantees, or while no checker is there)."""
        if not self.kv_on:
            return
        ops = self.kv_history()
        self.stats["kv_ops"] = len(ops)
        if self.durability_void:
            self.stats["kv_history_void_after_power_loss"] += 1
            return
        verdict, why = check_history(ops)
        self.stats[f"kv_history_{verdict}"] += 1
        if verdict == "fail":
            self.fail(f"the clients' KV history is not linearizable: {why}")


def check_history(ops: list[KvOp]) -> tuple[str, str]:
    """Check ``ops`` with :mod:`.linearizability`: ("ok" | "fail" | "undecided" | "unchecked",
    why).  The one place that knows the checker's API."""
    try:
        from . import linearizability as lin
    except ImportError:
        return "unchecked", "no checker"
    history = lin.History()
    ids: dict[int, int] = {}
    for op in sorted(ops, key=lambda o: (o.call_ms, o.id)):
        ids[op.id] = history.invoke(op.client, op.kind, op.key, op.args, op.call_ms)
    for op in sorted(ops, key=lambda o: (o.ret_ms or 0, o.id)):
        if op.ret_ms is None:
            history.unknown(ids[op.id])
        else:
            history.complete(ids[op.id], op.out, op.ret_ms)
    result = lin.check(history)
    return result.verdict, str(result)


__all__ = ["KvGet", "KvGetReply", "KvHistory", "KvOp", "check_history", "parse_command"]
