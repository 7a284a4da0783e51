"""The linearizability checker: hand-made histories it must accept and reject, random serial
executions stretched into overlapping intervals (always linearizable, and not once one read is
made up), small random histories against a brute-force search of every order, and the speed
of simulation-sized histories."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .linearizability import History, Op, Result, check


class Rec:
    """Terse hand-made histories: ``r.op(client, kind, key, args, start, end, result)``;
    ``end=None`` records an operation of unknown outcome."""

    def __init__(self) -> None:
        self.h = History()

    def op(self, client, kind, key, args, start, end, result=None) -> int:
        op_id = self.h.invoke(client, kind, key, args, start)
        if end is not None:
            self.h.complete(op_id, result, end)
        return op_id

    def put(self, c, k, v, s, e):
        return self.op(c, "put", k, (v,), s, e)

    def get(self, c, k, s, e, result):
        return self.op(c, "get", k, (), s, e, result)

    def delete(self, c, k, s, e, result=None):
        return self.op(c, "delete", k, (), s, e, result)

    def cas(self, c, k, exp, new, s, e, result=None):
        return self.op(c, "cas", k, (exp, new), s, e, result)

    def check(self, **kw) -> Result:
        return check(self.h, **kw)


def _fails(r: Rec, key="x", **kw) -> Result:
    res = r.check(**kw)
    assert res.verdict == "fail", res
    assert res.key == key
    assert f"key {key!r} is not linearizable" in res.explanation
    assert res.window, res
    return res


# -- linearizable ------------------------------------------------------------------------


def test_empty_history_is_linearizable():
    res = check([])
    assert res.ok and res.keys == 0


def test_sequential_history():
    r = Rec()
    r.get("c1", "x", 0, 1, None)
    r.put("c1", "x", 1, 2, 3)
    r.get("c2", "x", 4, 5, 1)
    r.cas("c1", "x", 1, 2, 6, 7, True)
    r.cas("c2", "x", 1, 3, 8, 9, False)
    r.get("c1", "x", 10, 11, 2)
    r.delete("c2", "x", 12, 13, True)
    r.get("c1", "x", 14, 15, None)
    r.delete("c1", "x", 16, 17, False)
    r.cas("c2", "x", None, 3, 18, 19, True)
    r.get("c1", "x", 20, 21, 3)
    res = r.check()
    assert res.ok, res
    assert res.keys == 1 and res.ops == 11
    assert "linearizable" in str(res)


def test_overlapping_puts_and_gets():
    r = Rec()
    r.put("c1", "x", 1, 0, 10)
    r.put("c2", "x", 2, 1, 9)
    r.get("c3", "x", 0, 1, None)  # before either put took effect
    r.get("c3", "x", 2, 3, 2)
    r.get("c3", "x", 4, 5, 1)  # put 1 took effect after put 2
    r.get("c4", "x", 6, 12, 1)
    assert r.check().ok


def test_cas_race_one_wins():
    r = Rec()
    r.cas("c1", "x", None, "a", 0, 5, False)
    r.cas("c2", "x", None, "b", 1, 4, True)
    r.cas("c3", "x", "b", "c", 2, 6, True)  # saw b's win while both were in flight
    r.get("c1", "x", 7, 8, "c")
    assert r.check().ok


def test_unknown_put_seen_later():
    r = Rec()
    r.put("c1", "x", 5, 0, None)  # timed out
    r.get("c2", "x", 1, 2, None)
    r.put("c2", "x", 6, 3, 4)
    r.get("c2", "x", 5, 6, 6)
    r.get("c2", "x", 100, 101, 5)  # it took effect long after the client gave up
    r.get("c3", "x", 102, 103, 5)
    assert r.check().ok


def test_unknown_put_never_seen():
    r = Rec()
    i = r.put("c1", "x", 5, 0, None)
    r.h.unknown(i)
    r.get("c2", "x", 1, 2, None)
    r.get("c2", "x", 3, 4, None)
    r.put("c3", "x", 7, 5, 6)
    r.get("c2", "x", 7, 8, 7)
    assert r.h.waiting == []
    assert r.check().ok


def test_unknown_cas_and_delete_take_effect_or_not():
    r = Rec()
    r.put("c1", "x", 1, 0, 1)
    r.cas("c2", "x", 1, 2, 2, None)  # unknown
    r.get("c1", "x", 3, 4, 2)
    r.delete("c3", "x", 5, None)  # unknown
    r.get("c1", "x", 6, 7, 2)  # not yet
    r.get("c1", "x", 8, 9, None)  # now
    r.get("c4", "y", 0, None, "whatever")  # an unknown read says nothing
    assert r.check().ok


def test_results_the_caller_did_not_learn_are_not_checked():
    r = Rec()
    r.put("c1", "x", 1, 0, 1)
    r.delete("c1", "x", 2, 3, None)  # existed, but the client only knows it applied
    r.delete("c1", "x", 4, 5, None)
    r.cas("c1", "x", None, 2, 6, 7, None)  # swapped
    r.cas("c1", "x", None, 3, 8, 9, None)  # did not
    r.get("c1", "x", 10, 11, 2)
    assert r.check().ok


def test_initial_values():
    r = Rec()
    r.get("c1", "x", 0, 1, 0)
    r.cas("c1", "y", "old", "new", 0, 1, True)
    assert r.check(initial={"x": 0, "y": "old"}).ok
    _fails(r)  # x starts absent


def test_equal_times_are_concurrent_across_clients_but_ordered_within_one():
    r = Rec()
    r.put("c1", "x", 1, 0, 5)
    r.get("c2", "x", 5, 6, None)  # may have read before the put took effect at 5
    assert r.check().ok
    r.get("c1", "x", 5, 6, None)  # but c1 sent this after its put's answer
    _fails(r)


def test_keys_are_checked_independently():
    r = Rec()
    r.put("c1", "x", 1, 0, 10)
    r.put("c2", "y", 2, 0, 10)
    r.get("c1", "y", 11, 12, 2)
    r.get("c2", "x", 11, 12, 1)
    assert r.check().ok


# -- not linearizable --------------------------------------------------------------------


def test_stale_read_after_completed_put():
    r = Rec()
    r.put("c1", "x", 1, 0, 1)
    r.put("c1", "x", 2, 2, 3)
    r.get("c2", "x", 4, 5, 1)
    res = _fails(r)
    assert "holds 2" in res.explanation
    assert "c2 get('x') -> 1 [4, 5]" in res.explanation
    assert [op.kind for op in res.window] == ["get"]


def test_read_of_a_value_never_written():
    r = Rec()
    r.put("c1", "x", 1, 0, 1)
    r.put("c1", "y", 1, 0, 1)
    r.get("c2", "y", 2, 3, 99)
    r.get("c2", "x", 4, 5, 1)
    _fails(r, key="y")


def test_new_then_old_by_sequential_reads():
    r = Rec()
    r.put("c1", "x", 1, 0, 1)
    r.put("c2", "x", 2, 2, 10)
    r.get("c3", "x", 3, 4, 2)
    r.get("c3", "x", 5, 6, 1)
    _fails(r)


def test_two_readers_see_concurrent_puts_in_opposite_orders():
    r = Rec()
    r.put("c1", "x", 1, 0, 10)
    r.put("c2", "x", 2, 0, 10)
    r.get("c3", "x", 1, 2, 1)
    r.get("c3", "x", 3, 4, 2)
    r.get("c4", "x", 1, 2, 2)
    r.get("c4", "x", 3, 4, 1)
    _fails(r)


def test_cas_succeeds_twice_on_the_same_expected_value():
    r = Rec()
    r.put("c1", "x", 0, 0, 1)
    r.cas("c1", "x", 0, 1, 2, 5, True)
    r.cas("c2", "x", 0, 2, 2, 5, True)
    _fails(r)


def test_delete_observed_before_it_was_invoked():
    r = Rec()
    r.put("c1", "x", 1, 0, 1)
    r.get("c2", "x", 2, 3, None)
    r.delete("c3", "x", 4, 5, True)
    _fails(r)
    r2 = Rec()  # the same with the delete's result unknown to its caller
    r2.put("c1", "x", 1, 0, 1)
    r2.get("c2", "x", 2, 3, None)
    r2.delete("c3", "x", 4, None)
    _fails(r2)


def test_unknown_put_seen_then_vanishes():
    r = Rec()
    r.put("c1", "x", 5, 0, None)
    r.get("c2", "x", 1, 2, 5)
    r.get("c2", "x", 3, 4, None)  # nothing deleted or overwrote it
    res = _fails(r)
    assert "c1 put('x', 5) -> ? [0, ?]" in res.explanation or "holds 5" in res.explanation


def test_failure_reported_on_the_right_key_among_many():
    r = Rec()
    for i, k in enumerate("abcdefgh"):
        r.put(f"c{i}", k, i, 0, 1)
        r.get(f"c{i}", k, 2, 3, i)
    r.get("c9", "f", 4, 5, 0)  # f holds 5
    _fails(r, key="f")


def test_budget_makes_it_undecided():
    r = Rec()
    for i in range(12):  # concurrent puts a late read rules out: the search tries many orders
        r.put(f"c{i}", "x", i, 0, 10)
    r.get("d", "x", 11, 12, 99)
    assert r.check().verdict == "fail"
    res = r.check(max_steps=50)
    assert res.verdict == "undecided" and res.key == "x" and not res.ok
    assert "undecided after 50" in str(res)


# -- the recorder ------------------------------------------------------------------------


def test_history_recorder():
    h = History()
    a = h.invoke("c1", "put", "x", (1,), 0)
    b = h.invoke("c2", "put", "x", (2,), 0)
    c = h.invoke("c3", "get", "x", (), 1)
    h.discard(b)  # refused: it never applied
    h.complete(a, None, 2)
    assert h.waiting == [c] and len(h) == 2
    with pytest.raises(ValueError):
        h.complete(a, None, 3)
    with pytest.raises(ValueError):
        h.discard(a)
    h.unknown(c)
    h.complete(c, 1, 9)  # a late answer still counts
    assert [op.complete for op in h.ops] == [2, 9]
    assert check(h).ok
    assert str(h.ops[1]) == "c3 get('x') -> 1 [1, 9]"


@pytest.mark.parametrize(
    ("kind", "args"),
    [("put", (None,)), ("put", ()), ("cas", (1, None)), ("get", (1,)), ("scan", ())],
)
def test_recorder_rejects_ops_the_model_cannot_mean(kind, args):
    with pytest.raises(ValueError):
        History().invoke("c1", kind, "x", args, 0)


def test_completion_before_invocation_is_rejected():
    h = History()
    i = h.invoke("c1", "get", "x", (), 5)
    with pytest.raises(ValueError):
        h.complete(i, None, 4)
    with pytest.raises(ValueError):
        check([Op(0, "c1", "get", "x", (), 5, 4, None)])


# -- random histories --------------------------------------------------------------------


_KEYS = ["a", "b", "c"]
_op = st.tuples(
    st.integers(0, 3),  # client
    st.sampled_from(["put", "get", "delete", "cas"]),
    st.sampled_from(_KEYS),
    st.integers(0, 4),  # value to write / expected value (0: absent for cas)
    st.integers(0, 4),
    st.integers(0, 25),  # invoked this long before its linearization point
    st.integers(0, 25),  # completed this long after it
    st.integers(0, 9),  # 0: unknown outcome; 1: a delete/cas result the caller did not learn
)


def _serial(draws: list[tuple]) -> list[tuple]:
    """Run the ops one by one on a dict, then widen each into an interval around its turn."""
    state: dict[str, int] = {}
    ops = []
    for n, (client, kind, key, v, w, before, after, fate) in enumerate(draws):
        point = 10 * n
        old = state.get(key)
        if kind == "put":
            args, result = (v,), None
            state[key] = v
        elif kind == "get":
            args, result = (), old
        elif kind == "delete":
            args, result = (), old is not None
            state.pop(key, None)
        else:
            exp = v or None
            args, result = (exp, w), old == exp
            if old == exp:
                state[key] = w
        if fate == 1 and kind in ("delete", "cas"):
            result = None
        end = None if fate == 0 else point + after
        ops.append((point - before, end, client, kind, key, args, result))
    return ops


def _record(ops: list[tuple]) -> History:
    """Replay the invocations and completions in time order through the recorder."""
    events = []
    for n, (start, end, *_) in enumerate(ops):
        events.append((start, 0, n))
        if end is not None:
            events.append((end, 1, n))
    h, ids = History(), {}
    for t, what, n in sorted(events):
        _, _, client, kind, key, args, result = ops[n]
        if what == 0:
            ids[n] = h.invoke(client, kind, key, args, t)
        else:
            h.complete(ids[n], result, t)
    return h


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=40))
def test_serial_executions_stretched_into_intervals_are_linearizable(draws):
    res = check(_record(_serial(draws)))
    assert res.ok, res


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, min_size=1, max_size=40), st.data())
def test_a_read_made_up_is_caught(draws, data):
    ops = _serial(draws)
    reads = [n for n, op in enumerate(ops) if op[3] == "get" and op[1] is not None]
    if not reads:
        ops.append((10 * len(ops), 10 * len(ops) + 1, 0, "get", "a", (), None))
        reads = [len(ops) - 1]
    n = data.draw(st.sampled_from(reads))
    start, end, client, kind, key, args, _ = ops[n]
    ops[n] = (start, end, client, kind, key, args, "never written")
    res = check(_record(ops))
    assert res.verdict == "fail" and res.key == key, res


# -- against brute force ----------------------------------------------------------------


def _brute(ops: list[Op], start: object) -> bool:
    """The definition, by exhaustion: some order of all the ops (an unknown one precedes
    nothing and may answer anything) respects real time and the register."""

    def precedes(a: Op, b: Op) -> bool:
        if a.complete is None:
            return False
        same_client = a.client == b.client and a.id < b.id
        return a.complete < b.invoke or (same_client and a.complete == b.invoke)

    def step(op: Op, s: object) -> tuple[bool, object]:
        free = op.complete is None or (op.kind != "get" and op.result is None)
        if op.kind == "put":
            return True, op.args[0]
        if op.kind == "get":
            return free or op.result == s, s
        if op.kind == "delete":
            return free or op.result == (s is not None), None
        swapped = s == op.args[0]
        return free or op.result == swapped, op.args[1] if swapped else s

    memo: dict[tuple[frozenset, object], bool] = {}

    def search(left: frozenset, s: object) -> bool:
        if not left:
            return True
        if (left, s) not in memo:
            memo[left, s] = any(
                ok and search(left - {b}, new)
                for b in left
                if not any(precedes(a, b) for a in left if a is not b)
                for ok, new in [step(b, s)]
            )
        return memo[left, s]

    return search(frozenset(ops), start)


_spec = st.tuples(
    st.integers(0, 2),  # client
    st.sampled_from(["put", "put", "get", "get", "delete", "cas"]),
    st.integers(1, 4),  # value written (4: never read back)
    st.sampled_from([None, 1, 2, 3]),  # a get's result, a cas's expected value
    st.integers(0, 12),  # invoked
    st.integers(0, 6),  # lasted
    st.sampled_from([True, False, None, "unknown"]),  # a delete's or cas's result, or unknown
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_spec, max_size=8), st.sampled_from([None, 1]))
def test_agrees_with_brute_force_on_small_histories(specs, start):
    ops = []
    for n, (client, kind, v, seen, at, lasted, res) in enumerate(specs):
        args = {"put": (v,), "get": (), "delete": (), "cas": (seen, v)}[kind]
        result = {"put": None, "get": seen}.get(kind, res)
        end = None if res == "unknown" else at + lasted
        ops.append(Op(n, f"c{client}", kind, "x", args, at, end, None if end is None else result))
    res = check(ops, initial={"x": start})
    want = _brute([op for op in ops if not (op.kind == "get" and op.complete is None)], start)
    assert res.verdict == ("ok" if want else "fail"), (res, ops)


def test_agrees_with_brute_force_on_many_random_histories():
    """Denser than hypothesis finds on its own: the search's shortcuts (unknown ops placed only
    where needed, dominance, values no op tells apart) each broke a few of these in testing."""
    rng = random.Random(0)
    for _ in range(6000):
        ops = []
        for n in range(rng.randrange(6, 11)):
            kind = rng.choice(["put", "get", "delete", "cas", "put", "get", "cas"])
            v, seen = rng.randint(1, 5), rng.choice([None, 1, 2, 3])
            args = {"put": (v,), "get": (), "delete": (), "cas": (seen, v)}[kind]
            result = {"put": None, "get": seen}.get(kind, rng.choice([True, False, None]))
            at = rng.randrange(10)
            end = None if rng.random() < 0.3 else at + rng.randrange(6)
            client = f"c{rng.randrange(3)}"
            ops.append(Op(n, client, kind, "x", args, at, end, None if end is None else result))
        start = rng.choice([None, 1])
        want = _brute([op for op in ops if not (op.kind == "get" and op.complete is None)], start)
        res = check(ops, initial={"x": start})
        assert res.verdict == ("ok" if want else "fail"), (res, ops)


# -- speed -------------------------------------------------------------------------------


def _simulated(n_ops: int, n_keys: int, n_clients: int, seed: int, unknown: float = 0.02):
    """A run's history: sequential clients whose ops take effect at a random point of their
    interval (some time out and then apply or not), results from applying them in that order."""
    rng = random.Random(seed)
    clock = [rng.uniform(0, 5) for _ in range(n_clients)]
    timed: list[tuple[float, int, tuple]] = []  # (linearization point or inf, n, op)
    for n in range(n_ops):
        c = n % n_clients
        start = clock[c]
        point = start + rng.expovariate(1.0)
        end = point + rng.expovariate(1.0)
        clock[c] = end + rng.expovariate(2.0)
        kind = rng.choices(["put", "get", "delete", "cas"], [4, 5, 1, 2])[0]
        key = f"k{rng.randrange(n_keys)}"
        args = {"put": (f"v{n}",), "get": (), "delete": (), "cas": (None, f"v{n}")}[kind]
        if kind == "cas" and rng.random() < 0.7:
            args = (f"v{rng.randrange(max(n, 1))}", f"v{n}")
        if rng.random() < unknown:
            end = None
            if rng.random() < 0.5:
                point = float("inf")  # never applied
        timed.append((point, n, (start, end, f"c{c}", kind, key, args)))
    state: dict[str, str] = {}
    ops: list[tuple] = []
    for _, _, (start, end, client, kind, key, args) in sorted(timed):
        old = state.get(key)
        if kind == "put":
            state[key], result = args[0], None
        elif kind == "get":
            result = old
        elif kind == "delete":
            result = old is not None
            state.pop(key, None)
        else:
            result = old == args[0]
            if result:
                state[key] = args[1]
        ops.append((start, end, client, kind, key, args, result))
    return _record(ops)


def test_two_thousand_ops_over_twenty_keys_check_fast():
    h = _simulated(2000, 20, 8, seed=1)
    t0 = time.perf_counter()
    res = check(h)
    took = time.perf_counter() - t0
    assert res.ok, res
    assert res.ops == 2000 and res.keys == 20
    assert took < 2.0, f"{took:.2f} s"


def test_thousands_of_ops_on_one_key_check_fast():
    h = _simulated(4000, 1, 8, seed=2)
    t0 = time.perf_counter()
    res = check(h)
    took = time.perf_counter() - t0
    assert res.ok, res
    assert took < 2.0, f"{took:.2f} s"


def test_a_stale_read_at_the_end_of_a_long_history_is_found():
    h = _simulated(2000, 20, 8, seed=3, unknown=0.05)
    old = next(op for op in h if op.kind == "put" and op.complete is not None)
    late = max(op.complete or op.invoke for op in h) + 10
    w = h.invoke("writer", "put", old.key, ("fresh",), late)
    h.complete(w, None, late + 1)
    r = h.invoke("reader", "get", old.key, (), late + 2)
    h.complete(r, old.args[0], late + 3)  # a value from long ago, after "fresh" completed
    t0 = time.perf_counter()
    res = check(h)
    assert time.perf_counter() - t0 < 2.0
    assert res.verdict == "fail" and res.key == old.key, res
    assert f"reader get({old.key!r}) -> {old.args[0]!r}" in res.explanation
