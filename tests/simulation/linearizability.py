"""A linearizability checker for key-value histories (Wing & Gong's search with Lowe's
memoization, the algorithm Porcupine uses), so a simulation can check what its clients saw
against one register per key instead of hand-written invariants.

Single-key operations are linearizable iff each key's sub-history is (linearizability is
local), so the history is split by key and each key is searched on its own: a register whose
state is the key's value, ``None`` meaning absent. Operations:

- ``put(key, value)`` -> ``None``;
- ``get(key)`` -> the value, or ``None`` if absent;
- ``delete(key)`` -> whether the key existed, or ``None`` when the caller did not learn it;
- ``cas(key, expected, new)`` -> whether it swapped (``expected=None``: "only if absent"),
  or ``None`` when the caller knows it took effect but not whether it swapped.

Values are never ``None`` (that is "absent") and must be hashable (the search caches states).

What to record: every operation that *may* have taken effect. One that completed is recorded
with its interval and result; one whose outcome is unknown (a timeout, a lost answer, a client
that gave up) stays without a completion: it may take effect at any time after its invocation,
or never (Porcupine's "ends at +infinity, any result"). An operation that definitely did not
take effect (refused before it could apply: not the leader, a rejected request) must not be
recorded at all -- :meth:`History.discard` drops one already invoked -- since recording it as
unknown only weakens the check, and as completed makes it wrong.

Real-time order: ``a`` precedes ``b`` iff ``a`` completed strictly before ``b`` was invoked.
Equal times are concurrent (the conservative choice: a reported failure is always real), except
within one client: a client id names a sequential process (at most one operation in flight, as
in Porcupine; give a pipelining client one id per in-flight slot), so its operation that
completed at time ``t`` precedes its next one invoked at ``t``.

Cost: near linear in the ops of a key while few of them overlap (a few thousand ops of eight
clients on one key check in a fraction of a second), growing with how many overlap and how many
have unknown outcomes. Proving a long history *not* linearizable means exhausting its orders,
so a failure deep in a long single-key history full of timeouts may come back "undecided" at
``max_steps``; spreading a workload over keys keeps each search small.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

KINDS: dict[str, int] = {"put": 1, "get": 0, "delete": 0, "cas": 2}  # kind -> number of args
DEFAULT_MAX_STEPS = 5_000_000  # per key: about 5 s of search, far past a typical history's need
_SHOWN = 8  # operations listed in a failure's explanation

_PUT, _GET, _DELETE, _CAS = range(4)
_PLACED = object()  # in a cache key: the last op placed is a completed one


class _Untold:
    """In a cache key: a value no op left to place compares with (all such behave alike)."""

    def __repr__(self) -> str:
        return "<untold>"


_UNTOLD = _Untold()
_NOTHING = object()  # an op that compares the value with nothing
_CODES = {"put": _PUT, "get": _GET, "delete": _DELETE, "cas": _CAS}


@dataclass(frozen=True, slots=True)
class Op:
    """One operation: ``complete is None`` means its outcome is unknown (``result`` unused).

    ``id`` orders a client's operations (its invocation order); :class:`History` assigns it.
    """

    id: int
    client: Hashable
    kind: str
    key: Hashable
    args: tuple = ()
    invoke: float = 0
    complete: float | None = None
    result: object = None

    @property
    def unknown(self) -> bool:
        return self.complete is None

    def __str__(self) -> str:
        call = ", ".join(repr(a) for a in (self.key, *self.args))
        out = f"{self.client} {self.kind}({call})"
        if self.complete is None:
            return f"{out} -> ? [{_t(self.invoke)}, ?]"
        if self.kind != "put":
            out += f" -> {self.result!r}"
        return f"{out} [{_t(self.invoke)}, {_t(self.complete)}]"


def _t(t: float) -> str:
    return f"{t:g}" if isinstance(t, float) else str(t)


def validate(op: Op) -> None:
    """Raise ValueError for an operation the model cannot mean (a recording bug)."""
    if op.kind not in KINDS:
        raise ValueError(f"op {op.id}: unknown kind {op.kind!r} (one of {sorted(KINDS)})")
    if not isinstance(op.args, tuple) or len(op.args) != KINDS[op.kind]:
        raise ValueError(f"op {op.id}: {op.kind} takes {KINDS[op.kind]} args, not {op.args!r}")
    if (op.kind == "put" and op.args[0] is None) or (op.kind == "cas" and op.args[1] is None):
        raise ValueError(f"op {op.id}: None is 'absent', not a value to write")
    if op.complete is not None and op.complete < op.invoke:
        raise ValueError(f"op {op.id}: completes at {op.complete} before its invocation")


class History:
    """Records a run's operations as clients invoke and complete them.

    ``op_id = h.invoke(client, kind, key, args, now)`` when the request is sent, then one of
    ``h.complete(op_id, result, now)`` on its answer, ``h.unknown(op_id)`` on a timeout (or
    just leave it pending), or ``h.discard(op_id)`` if it definitely had no effect.
    """

    def __init__(self) -> None:
        self._ops: dict[int, Op] = {}
        self._waiting: set[int] = set()  # invoked, neither completed nor given up on
        self._next = 0

    def invoke(self, client: Hashable, kind: str, key: Hashable, args: tuple, now: float) -> int:
        op = Op(self._next, client, kind, key, tuple(args), now)
        validate(op)
        self._ops[op.id] = op
        self._waiting.add(op.id)
        self._next += 1
        return op.id

    def complete(self, op_id: int, result: object, now: float) -> None:
        """Its answer arrived at ``now`` (a late answer may still complete one given up on)."""
        op = self._ops[op_id]
        if op.complete is not None:
            raise ValueError(f"op {op_id} already completed: {op}")
        done = replace(op, complete=now, result=result)
        validate(done)
        self._ops[op_id] = done
        self._waiting.discard(op_id)

    def unknown(self, op_id: int) -> None:
        """Its outcome will not be known: it may take effect at any time, or never."""
        if self._ops[op_id].complete is not None:
            raise ValueError(f"op {op_id} already completed: {self._ops[op_id]}")
        self._waiting.discard(op_id)

    def discard(self, op_id: int) -> None:
        """It definitely had no effect (refused before it could apply): forget it."""
        if self._ops[op_id].complete is not None:
            raise ValueError(f"op {op_id} completed, it had an effect: {self._ops[op_id]}")
        del self._ops[op_id]
        self._waiting.discard(op_id)

    @property
    def waiting(self) -> list[int]:
        """Ops invoked but neither completed nor marked unknown (checked as unknown)."""
        return sorted(self._waiting)

    @property
    def ops(self) -> list[Op]:
        return list(self._ops.values())

    def __iter__(self) -> Iterator[Op]:
        return iter(self._ops.values())

    def __len__(self) -> int:
        return len(self._ops)


Verdict = Literal["ok", "fail", "undecided"]


@dataclass(frozen=True)
class Result:
    """``verdict`` is ``"ok"``, ``"fail"`` (``key`` has no linearization) or ``"undecided"``
    (the search ran out of ``max_steps`` on ``key``). ``window`` is the failure's stuck frontier:
    the operations none of which can take effect next after the longest linearizable prefix
    the search found."""

    verdict: Verdict
    key: Hashable | None = None
    explanation: str = ""
    window: tuple[Op, ...] = ()
    steps: int = 0
    keys: int = 0
    ops: int = 0

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def __str__(self) -> str:
        if self.ok:
            return f"linearizable ({self.ops} ops over {self.keys} keys, {self.steps} steps)"
        return self.explanation


@dataclass
class _KeyOutcome:
    verdict: Verdict
    steps: int
    explanation: str = ""
    window: tuple[Op, ...] = field(default_factory=tuple)


def check(
    history: History | Iterable[Op],
    initial: Mapping[Hashable, object] | None = None,
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> Result:
    """Is the history linearizable? ``initial`` holds the keys' values before it began (absent
    if missing); ``max_steps`` caps each key's search (then "undecided", not a hang). Keys are
    checked in order of first invocation; the first that fails is reported (a key left
    undecided does not hide a later one that fails)."""
    initial = initial or {}
    by_key: dict[Hashable, list[Op]] = {}
    count = 0
    for op in sorted(history, key=lambda o: (o.invoke, o.id)):
        validate(op)
        count += 1
        if op.kind == "get" and op.complete is None:
            continue  # a read that may never have happened constrains nothing
        by_key.setdefault(op.key, []).append(op)
    steps = 0
    undecided: tuple[Hashable, _KeyOutcome] | None = None
    for key, ops in by_key.items():
        out = _check_key(key, ops, initial.get(key), max_steps)
        steps += out.steps
        if out.verdict == "fail":
            return Result("fail", key, out.explanation, out.window, steps, len(by_key), count)
        if out.verdict == "undecided" and undecided is None:
            undecided = (key, out)
    if undecided is not None:
        key, out = undecided
        return Result("undecided", key, out.explanation, (), steps, len(by_key), count)
    return Result("ok", None, "", (), steps, len(by_key), count)


def _tie_preds(ops: list[Op]) -> list[tuple[int, ...]]:
    """For each op, the same client's earlier ops that completed exactly at its invocation:
    they precede it though the event list (calls before returns at equal times) cannot say so."""
    done_at: dict[tuple[Hashable, float], list[int]] = {}
    for i, op in enumerate(ops):
        if op.complete is not None:
            done_at.setdefault((op.client, op.complete), []).append(i)
    preds: list[tuple[int, ...]] = []
    for op in ops:
        same = done_at.get((op.client, op.invoke), ())
        preds.append(tuple(j for j in same if ops[j].id < op.id))
    return preds


def _check_key(key: Hashable, ops: list[Op], start: object, max_steps: int) -> _KeyOutcome:
    """Wing & Gong's search over one key's operations, iterative, with Lowe's cache.

    The completed ops' events (calls and returns by time, calls first at equal times) sit in
    a doubly linked list; the calls before the first return, and the unknown ops invoked by
    then, are the candidates: the ops that may take effect next. The search places one
    (unlinks its events, pushes it with the value before it and the other candidates); when
    none fits, it undoes the last one placed and tries the next of that one's candidates. A
    configuration seen before is not explored again. What makes it fast enough, each exact
    (a linearization, if there is one, is still found):

    - A candidate that leaves the value as it is wherever it goes (a get, or a cas or delete
      that answered False) and fits the current value is placed at once, without branching:
      moving it forward in a linearization keeps it one. Concurrent reads cost no search.
    - An unknown op checks no result, so it may be left out (Porcupine places it anywhere up
      to +infinity): the search ends once every completed op is placed, places an unknown op
      only where the next op placed needs it (fails without it, or ends elsewhere), tries
      unknown ops after the completed candidates, and places those with the same effect in
      order of invocation.
    - Configurations are compared by what the ops not yet placed can tell apart: a value that
      no remaining get returns and no cas expects is "some other value", and the unknown ops
      placed count by effect. One with the same completed ops placed and the same value as
      one explored, and more unknown ops placed, has no more options.
    - A client's op that completed at the instant its next one was invoked precedes it.
    """
    n = len(ops)
    known = [op.complete is not None for op in ops]
    model = []  # (code, arg0, arg1, result checked, result)
    keeps = []  # leaves the value as it is wherever it fits
    blind = []  # sets the value whatever it was, and checks nothing
    tells = []  # the value a completed op compares the register with (_NOTHING: none)
    for i, op in enumerate(ops):
        code = _CODES[op.kind]
        a0 = op.args[0] if op.args else None
        a1 = op.args[1] if code == _CAS else None
        # a put's result says nothing; a delete's or cas's None is "did not learn it"
        checked = known[i] and code != _PUT and (code == _GET or op.result is not None)
        model.append((code, a0, a1, checked, op.result))
        keeps.append(checked and (code == _GET or op.result is False))
        blind.append(code == _PUT or (code == _DELETE and not checked))
        told = op.result if code == _GET else a0 if code == _CAS else None
        tells.append(told if known[i] and told is not None else _NOTHING)
    # the values ops compare with: the completed ones not yet placed (with how many), and
    # the unknown ones (always: they may be placed or not)
    told_by: dict[object, int] = {}
    for v in tells:
        if v is not _NOTHING:
            told_by[v] = told_by.get(v, 0) + 1
    always = {model[i][1] for i in range(n) if not known[i] and model[i][0] == _CAS} - {None}
    ever = set(told_by) | always

    def canon(v: object) -> object:
        return v if v is None or v in told_by or v in always else _UNTOLD

    # an unknown op's effect as any op can tell it; those alike are one class, placed in
    # order of invocation (one that must follow its client's op is a class of its own)
    preds = _tie_preds(ops)
    members: dict[tuple, list[int]] = {}
    for i in sorted(range(n), key=lambda i: (ops[i].invoke, i)):
        if not known[i]:
            code, a0, a1 = model[i][:3]
            if code == _PUT and a0 not in ever:
                a0 = _UNTOLD
            effect = (-1, i) if preds[i] else (code, a0, a1 if a1 in ever else _UNTOLD)
            members.setdefault(effect, []).append(i)
    classes = list(members.values())
    next_of = [0] * len(classes)  # how many of the class are placed
    # those counts packed in an int, a field per class with a guard bit on top, so that one
    # subtraction compares all of them: a <= b field by field iff ((b | guards) - a) & guards
    # == guards
    unit = [0] * n  # 1 in the field of its class
    guards = shift = 0
    for group in classes:
        width = len(group).bit_length() + 1
        for i in group:
            unit[i] = 1 << shift
        guards |= 1 << (shift + width - 1)
        shift += width
    class_of = [0] * n
    for c, group in enumerate(classes):
        for i in group:
            class_of[i] = c
    due = [op.invoke if op.complete is None else op.complete for op in ops]

    # node 0 heads the list, nodes 1.. are the events in time order, -1 ends it
    events = []
    for i, op in enumerate(ops):
        if op.complete is not None:
            events.append((op.invoke, 0, i))
            events.append((op.complete, 1, i))
    events.sort()
    size = len(events) + 1
    nxt = list(range(1, size + 1))
    nxt[-1] = -1
    prv = list(range(-1, size - 1))
    node_op = [-1] * size
    is_call = [False] * size
    call_node = [0] * n
    ret_node = [0] * n
    for pos, (_, kind, i) in enumerate(events, start=1):
        node_op[pos] = i
        if kind == 0:
            is_call[pos] = True
            call_node[i] = pos
        else:
            ret_node[i] = pos

    def unlink(x: int) -> None:
        prv_x, nxt_x = prv[x], nxt[x]
        nxt[prv_x] = nxt_x
        if nxt_x != -1:
            prv[nxt_x] = prv_x

    def relink(x: int) -> None:  # undoes unlink (in the reverse order of unlinking)
        nxt[prv[x]] = x
        if nxt[x] != -1:
            prv[nxt[x]] = x

    def step(i: int, state: object) -> tuple[bool, object]:
        code, a0, a1, checked, result = model[i]
        if code == _PUT:
            return True, a0
        if code == _GET:
            return (not checked) or result == state, state
        if code == _DELETE:
            return (not checked) or result == (state is not None), None
        swapped = state == a0
        return (not checked) or result == swapped, a1 if swapped else state

    def needs(i: int) -> bool:
        """Right after an unknown op (the value before it is ``before``), does op i need it?
        If not, a linearization with the unknown op later, or left out, does as well."""
        if blind[i]:
            return False
        ok, new = step(i, state)
        if not ok:
            return False
        ok_before, new_before = step(i, before)
        return not ok_before or (not keeps[i] and canon(new_before) != canon(new))

    # (completed ops placed, value, the value before the last op if it is unknown) -> the
    # unknown ops placed (packed counts per class), an antichain: a configuration like one
    # explored but with more of them placed has no more options
    cache: dict[tuple[int, object, object], list[int]] = {}

    def seen(key: tuple[int, object, object], have: int) -> bool:
        """Was this configuration, or one like it with fewer unknown ops placed, explored?"""
        olds = cache.get(key)
        if olds is None:
            cache[key] = [have]
            return False
        over = have | guards
        for old in olds:
            if (over - old) & guards == guards:
                return True
        olds[:] = [old for old in olds if ((old | guards) - have) & guards != guards]
        olds.append(have)
        return False

    state = start
    before: object = None  # the value before the unknown op just placed (while reads)
    todo = len(events) // 2  # completed ops not yet placed
    done = bytearray(n)  # placed, for the tie test
    cbits = 0  # the completed ops placed
    have = 0  # the unknown ops placed, packed counts per class
    # (op, value before it, its configuration's candidates, its index there, the op whose
    # return blocks them, placed without a choice, and its configuration's reads and before)
    stack: list[tuple[int, object, list[int], int, int, bool, bool, object]] = []
    best: tuple[int, object, tuple[int, ...], int, int] | None = None
    steps = 0
    cands: list[int] = []
    k = blocker = 0
    forced = reads = False  # reads: the last op placed is unknown, the next must need it
    fresh = True  # a new configuration: gather its candidates
    while todo:
        if fresh:
            fresh = forced = False
            cands = []
            x = nxt[0]
            while is_call[x]:
                i = node_op[x]
                tied = preds[i]
                if (not tied or all(done[j] for j in tied)) and (not reads or needs(i)):
                    if keeps[i] and step(i, state)[0]:
                        cands, forced = [i], True
                        break
                    cands.append(i)
                x = nxt[x]
            while is_call[x]:
                x = nxt[x]
            blocker, k = node_op[x], 0
            if not forced:
                cands.sort(key=due.__getitem__)
                limit = due[blocker]
                for c, group in enumerate(classes):
                    if next_of[c] < len(group):
                        i = group[next_of[c]]
                        if due[i] > limit:
                            continue
                        tied = preds[i]
                        if tied and not all(done[j] for j in tied):
                            continue
                        if not reads or needs(i):
                            cands.append(i)
        placed = False
        while k < len(cands):
            steps += 1
            if steps > max_steps:
                why = (
                    f"key {key!r}: undecided after {max_steps} search steps ({n} ops, "
                    f"{n - len(events) // 2} of unknown outcome)"
                )
                return _KeyOutcome("undecided", steps, why)
            i = cands[k]
            ok, new = step(i, state)
            if ok and known[i]:
                v = tells[i]
                if v is not _NOTHING:
                    _uncount(told_by, v)
                if seen((cbits | (1 << i), canon(new), _PLACED), have):
                    if v is not _NOTHING:
                        told_by[v] = told_by.get(v, 0) + 1
                else:
                    stack.append((i, state, cands, k, blocker, forced, reads, before))
                    reads, state, done[i] = False, new, 1
                    cbits |= 1 << i
                    unlink(call_node[i])
                    unlink(ret_node[i])
                    todo -= 1
                    placed = fresh = True
                    break
            elif ok and canon(new) != canon(state):
                if not seen((cbits, canon(new), canon(state)), have + unit[i]):
                    stack.append((i, state, cands, k, blocker, forced, reads, before))
                    reads, before, state, done[i] = True, state, new, 1
                    next_of[class_of[i]] += 1
                    have += unit[i]
                    placed = fresh = True
                    break
            if forced:  # it fits, so the configuration it leads to was explored and failed
                break
            k += 1
        if placed:
            continue
        if not forced and not reads and (best is None or len(stack) > best[0]):
            best = (len(stack), state, tuple(cands), blocker, stack[-1][0] if stack else -1)
        # no candidate of this configuration leads anywhere: undo the op that led here
        while True:
            if not stack:
                assert best is not None
                return _explain(key, ops, best, steps)
            i, state, cands, k, blocker, forced, reads, before = stack.pop()
            done[i] = 0
            if known[i]:
                cbits ^= 1 << i
                relink(ret_node[i])
                relink(call_node[i])
                todo += 1
                if tells[i] is not _NOTHING:
                    told_by[tells[i]] = told_by.get(tells[i], 0) + 1
            else:
                next_of[class_of[i]] -= 1
                have -= unit[i]
            if not forced:  # else the configuration before it is as dead as the one after
                k += 1
                break
    return _KeyOutcome("ok", steps)


def _uncount(counts: dict, key: object) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


def _explain(
    key: Hashable, ops: list[Op], best: tuple[int, object, tuple[int, ...], int, int], steps: int
) -> _KeyOutcome:
    depth, state, frontier, blocked, last = best
    held = "is absent" if state is None else f"holds {state!r}"
    after = f"after {depth} of {len(ops)} ops" + (f" (the last: {ops[last]})" if last >= 0 else "")
    window = tuple(ops[i] for i in frontier)
    by = ops[blocked]
    if len(window) == 1:
        why = f"{after} it {held}, which {by} contradicts"
    else:
        # the completed ops first (the ones that constrain), then those of unknown outcome
        shown = sorted(window, key=lambda o: (o.complete is None, o.invoke, o.id))
        listed = "; ".join(str(o) for o in shown[:_SHOWN])
        if len(shown) > _SHOWN:
            listed += f"; and {len(shown) - _SHOWN} more"
        why = (
            f"{after} it {held}, and none of the ops that could go next fits it "
            f"({by} had to by {_t(by.complete)}): {listed}"
        )
    return _KeyOutcome("fail", steps, f"key {key!r} is not linearizable: {why}", window)
