"""``rayledger demo``: the main job, end to end on one machine.

1. start Ray (a local one, or ``--address``) and a 3-member file-backed group;
2. append ``--entries`` entries from ``--clients`` threads (each with its own
   :class:`~rayledger.actors.LedgerClient`, batches of ``--batch``), with a progress bar;
3. half-way, kill the leader's process and time the new leader's take-over while
   the writes go on.  The clients are idempotent: a call the kill cut short is
   sent again, under the same identity, to the new leader, which answers the entries it
   already holds with where they are and appends the rest -- so no append ends unknown
   (an ``OutcomeUnknownError`` would mean a client's 15 s deadline ran out) and none is
   written twice;
4. check that every acknowledged append is committed on every member, with the
   same body at the acknowledged index, exactly once, and that the members' logs agree;
5. start Spark through RayDP and aggregate the committed log (entries and bytes per
   term), checked against the members' logs;
6. print a summary and clean up.  Exit status 0 only when every check passed.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rayledger.storage import LedgerError, OutcomeUnknownError, ResponseCode
from rayledger.storage.reader import batch_to_table

from .output import console, say

log = logging.getLogger("rayledger.integration")

BODY_SIZE = 100
READ_CHUNK = 20_000


@dataclass
class DemoWorkload:
    """What the client threads did."""

    acked: dict[int, bytes] = field(default_factory=dict)  # index -> body
    ack_terms: dict[int, int] = field(default_factory=dict)
    duplicate_acks: list[int] = field(default_factory=list)
    unknown: list[bytes] = field(default_factory=list)
    failed: list[bytes] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    first_ack_after_kill: float | None = None
    done_entries: int = 0
    retried: int = 0  # entries the clients sent again after an unknown outcome
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class DemoCheck:
    name: str
    ok: bool
    detail: str = ""


def _body(seq: int) -> bytes:
    head = b"demo-%09d|" % seq
    return head + b"." * (BODY_SIZE - len(head))


def _append_one(client, bodies: list[bytes], work: DemoWorkload) -> tuple[list | None, bool]:
    """Append one batch, retrying only refusals; returns (results, outcome unknown)."""
    for _attempt in range(3):
        try:
            return client.append_batch(bodies), False
        except OutcomeUnknownError as exc:  # the client retried it until its deadline
            with work.lock:
                work.unknown.extend(bodies)
                work.errors[exc.code.name] += 1
            return None, True
        except LedgerError as exc:  # refused before anything was stored: safe to retry
            with work.lock:
                work.errors[exc.code.name] += 1
    return None, False


def _record(
    work: DemoWorkload, bodies: list[bytes], results, unknown: bool, kill_state: dict
) -> None:
    """Book one batch's outcome; the first ack in a later term times the take-over."""
    now = time.monotonic()
    with work.lock:
        if results is not None:
            for r, body in zip(results, bodies, strict=True):
                if r.index in work.acked:
                    work.duplicate_acks.append(r.index)
                work.acked[r.index] = body
                work.ack_terms[r.index] = r.term
            killed_at = kill_state.get("at")
            if (
                killed_at is not None
                and work.first_ack_after_kill is None
                and results[0].term > kill_state["term"]
            ):
                work.first_ack_after_kill = now - killed_at
        elif not unknown:
            work.failed.extend(bodies)
        work.done_entries += len(bodies)


def _kill_leader(group, kill_state: dict) -> None:
    """Kill the leader's process and time until another member leads."""
    old = group.leader_id() or group.wait_for_leader(timeout_s=10)
    term = group.status()[old].term
    kill_state.update(old=old, term=term, at=time.monotonic())
    say(f"killing leader {old} (term {term})")
    group.kill(old)
    try:
        # a leader of a later term: the failover worked, whoever won it -- the killed
        # member, restarted by Ray, may win the next term itself
        deadline = time.monotonic() + 30
        while True:
            new = group.wait_for_leader(timeout_s=max(0.1, deadline - time.monotonic()))
            new_term = group.status()[new].term
            if new_term > term:
                break
            if time.monotonic() > deadline:
                raise LedgerError.of(ResponseCode.TIMEOUT, f"no leader after term {term} in 30s")
            time.sleep(0.05)
        kill_state.update(
            new=new, new_term=new_term, failover_s=time.monotonic() - kill_state["at"]
        )
    except LedgerError as exc:
        kill_state.update(new=None, failover_s=None, error=str(exc))


def _run_clients(group, args, work: DemoWorkload, progress, kill_state: dict) -> float:
    """Append ``args.entries`` bodies from ``args.clients`` threads; returns the wall time."""
    batches = [
        [_body(s) for s in range(a, min(args.entries, a + args.batch))]
        for a in range(0, args.entries, args.batch)
    ]
    next_batch = iter(range(len(batches)))
    take = threading.Lock()

    def worker(cid: int) -> None:
        client = group.client(timeout_s=15.0)
        try:
            while True:
                with take:
                    i = next(next_batch, None)
                if i is None:
                    return
                results, unknown = _append_one(client, batches[i], work)
                _record(work, batches[i], results, unknown, kill_state)
                progress(len(batches[i]))
        finally:
            with work.lock:
                work.retried += client.retried
            client.close()  # no send loop left to call a dead actor at exit

    threads = [
        threading.Thread(target=worker, args=(c,), name=f"demo-client-{c}", daemon=True)
        for c in range(args.clients)
    ]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):  # kill the leader half-way
        if "at" not in kill_state and work.done_entries >= args.entries // 2:
            _kill_leader(group, kill_state)
        time.sleep(0.02)
    for t in threads:
        t.join()
    return time.monotonic() - t0


def _read_log(handle, start: int, stop: int) -> tuple[list[int], list[bytes]]:
    """(terms, bodies) of one member's committed entries [start, stop)."""
    import ray

    terms: list[int] = []
    bodies: list[bytes] = []
    a = start
    while a < stop:
        b = min(stop, a + READ_CHUNK)
        batch = ray.get(handle.read_batch.remote(a, b, True), timeout=60)
        if batch is None or batch.count != b - a:
            raise LedgerError.of(
                ResponseCode.INDEX_OUT_OF_BOUNDS, f"member returned a short batch for [{a}, {b})"
            )
        t = batch_to_table(batch.data, batch.first_index, batch.count)
        terms += t.column("term").to_pylist()
        bodies += t.column("body").to_pylist()
        a = b
    return terms, bodies


def _wait_caught_up(group, index: int, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        st = group.status()
        if (
            all(s.alive and s.committed_index >= index for s in st.values())
            or time.monotonic() > deadline
        ):
            return st
        time.sleep(0.1)


def _exactly_once(
    work: DemoWorkload, ref_terms: list[int], ref_bodies: list[bytes]
) -> list[DemoCheck]:
    """Each acked body once in the log, each unknown one at most once."""
    counts = Counter(ref_bodies)
    missing = sum(1 for b in work.acked.values() if counts[b] == 0)
    dup_acked = [(i, b) for i, b in work.acked.items() if counts[b] > 1]
    dup_unknown = [b for b in work.unknown if counts[b] > 1]
    detail = f"{missing} missing, {len(dup_acked)} duplicated"
    if dup_acked:
        i, b = dup_acked[0]
        where = [k for k, body in enumerate(ref_bodies) if body == b]
        detail += (
            f" (e.g. acked at {i}, found at {where} with terms {[ref_terms[k] for k in where]})"
        )
    committed_unknown = sum(1 for b in work.unknown if counts[b] == 1)
    return [
        DemoCheck("each acked entry exactly once", not missing and not dup_acked, detail),
        DemoCheck(
            "unknown entries at most once",
            not dup_unknown,
            f"{committed_unknown} of {len(work.unknown)} committed",
        ),
    ]


def _read_logs(
    group, top: int, checks: list[DemoCheck]
) -> dict[str, tuple[list[int], list[bytes]]]:
    logs = {}
    for m in group.members:
        try:
            logs[m] = _read_log(group.handle(m), 0, top + 1)
        except Exception as exc:
            checks.append(DemoCheck(f"read {m}'s log", False, str(exc)))
    return logs


def _verify(
    group, work: DemoWorkload
) -> tuple[list[DemoCheck], dict[str, tuple[list[int], list[bytes]]]]:
    dups = work.duplicate_acks
    checks = [DemoCheck("no index acknowledged twice", not dups, f"{len(dups)} duplicates")]
    if not work.acked:
        return checks + [DemoCheck("some appends acknowledged", False)], {}
    top = max(work.acked)
    st = _wait_caught_up(group, top, 60)
    lagging = {
        m: f"alive={s.alive} end={s.ledger_end_index} committed={s.committed_index}"
        for m, s in st.items()
        if not (s.alive and s.committed_index >= top)
    }
    detail = f"lagging: {lagging}" if lagging else f"up to {top}"
    checks.append(DemoCheck("every member committed every ack", not lagging, detail))
    logs = _read_logs(group, top, checks)
    bad = {}
    for m, (_terms, bodies) in logs.items():
        wrong = sum(1 for i, b in work.acked.items() if bodies[i] != b)
        if wrong:
            bad[m] = wrong
    checks.append(
        DemoCheck(
            "acked bodies at acked indexes on every member",
            not bad and len(logs) == len(group.members),
            f"mismatches {bad}" if bad else f"{len(work.acked)} entries x {len(logs)} members",
        )
    )
    if logs:
        ref_terms, ref_bodies = next(iter(logs.values()))
        same = all(t == ref_terms and b == ref_bodies for t, b in logs.values())
        checks.append(DemoCheck("members' logs identical", same, f"{top + 1} entries"))
        checks += _exactly_once(work, ref_terms, ref_bodies)
    return checks, logs


def _spark_step(group, args) -> tuple[list[DemoCheck], dict[str, Any]]:
    from pyspark.sql import functions as F

    from ..spark import committed_read, init_spark

    t0 = time.monotonic()
    spark = init_spark("rayledger-demo")
    spark.sparkContext.setLogLevel("ERROR")
    start_s = time.monotonic() - t0
    t0 = time.monotonic()
    df, read = committed_read(spark, group.name)
    rows = (
        df.groupBy("term")
        .agg(F.count("*").alias("entries"), F.sum(F.length("body")).alias("bytes"))
        .orderBy("term")
        .collect()
    )
    query_s = time.monotonic() - t0
    got = {r["term"]: (r["entries"], r["bytes"] or 0) for r in rows}
    terms, bodies = _read_log(group.handle(group.wait_for_leader(10)), read.start, read.stop)
    expected: dict[int, tuple[int, int]] = {}
    for t, b in zip(terms, bodies, strict=True):
        n, size = expected.get(t, (0, 0))
        expected[t] = (n + 1, size + len(b))
    checks = [
        DemoCheck(
            "Spark read exactly the committed entries",
            sum(n for n, _ in got.values()) == read.count,
            f"{sum(n for n, _ in got.values())} rows, committed [0, {read.stop})",
        ),
        DemoCheck(
            "Spark per-term totals match the log",
            got == expected,
            "" if got == expected else f"{got} != {expected}",
        ),
    ]
    return checks, {"per_term": got, "rows": read.count, "start_s": start_s, "query_s": query_s}


def _summary(
    args,
    work: DemoWorkload,
    append_s: float,
    kill: dict,
    checks: list[DemoCheck],
    spark: dict | None,
    total_s: float,
) -> None:
    from rich.table import Table

    con = console()
    t = Table(title="rayledger demo", show_header=False)
    t.add_column("what")
    t.add_column("value")
    acked = len(work.acked)
    t.add_row(
        "entries appended (acked / unknown / failed)",
        f"{acked} / {len(work.unknown)} / {len(work.failed)}",
    )
    t.add_row("clients x batch", f"{args.clients} x {args.batch}")
    t.add_row("entries sent again after the kill (same identity)", f"{work.retried}")
    t.add_row(
        "append phase",
        f"{append_s:.1f} s, {acked / append_s:,.0f} acked entries/s" if append_s else "-",
    )
    t.add_row(
        "leader killed -> new leader",
        f"{kill.get('old')} (term {kill.get('term')}) -> {kill.get('new')} (term {kill.get('new_term')})",
    )
    t.add_row(
        "failover (kill -> new leader seen)",
        f"{kill['failover_s']:.2f} s" if kill.get("failover_s") else "-",
    )
    fa = work.first_ack_after_kill
    t.add_row(
        "first ack under the new leader", f"{fa:.2f} s after the kill" if fa is not None else "-"
    )
    if work.errors:
        t.add_row("client errors", ", ".join(f"{k}={v}" for k, v in sorted(work.errors.items())))
    if spark:
        t.add_row(
            "Spark start / read + aggregate", f"{spark['start_s']:.1f} s / {spark['query_s']:.1f} s"
        )
    t.add_row("total", f"{total_s:.1f} s")
    con.print(t)
    if spark:
        st = Table(title=f"Spark: committed log per term ({spark['rows']:,} entries)")
        st.add_column("term", justify="right")
        st.add_column("entries", justify="right")
        st.add_column("body bytes", justify="right")
        for term, (n, b) in sorted(spark["per_term"].items()):
            st.add_row(str(term), f"{n:,}", f"{b:,}")
        con.print(st)
    ct = Table(title="checks")
    ct.add_column("check")
    ct.add_column("result")
    ct.add_column("detail")
    for c in checks:
        ct.add_row(c.name, "[green]ok[/green]" if c.ok else "[red]FAILED[/red]", c.detail)
    con.print(ct)


def _start_ray(args) -> bool:
    """A Ray of the demo's own (never a cluster found on the machine) unless ``--address``."""
    import ray

    if ray.is_initialized():
        return False
    if args.address:  # fails fast, as one error line, when no cluster answers there
        from ..connect import connect

        connect(args.address)
    else:
        ray.init(
            address="local",
            namespace="rayledger",
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    return True


def _append_phase(group, args) -> tuple[DemoWorkload, float, dict[str, Any], list[DemoCheck]]:
    """The clients' appends with a leader kill half-way, under a progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    work = DemoWorkload()
    kill: dict[str, Any] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console()) as bar:
        task = bar.add_task("appending", total=args.entries)
        append_s = _run_clients(group, args, work, lambda n: bar.advance(task, n), kill)
    failover = kill.get("failover_s")
    say(
        f"appended: {len(work.acked)} acked, {len(work.unknown)} unknown, {len(work.failed)} "
        f"failed in {append_s:.1f}s; leader {kill.get('old')} (term {kill.get('term')}) killed, "
        f"new leader {kill.get('new')} (term {kill.get('new_term')}) after "
        f"{failover if failover is not None else float('nan'):.2f}s"
    )
    new_leader = bool(kill.get("new"))  # a leader of a later term (_kill_leader)
    checks = [
        DemoCheck("a new leader took over", new_leader, kill.get("error", "")),
        DemoCheck("writes continued after the kill", work.first_ack_after_kill is not None),
        DemoCheck("no append of unknown outcome (the clients retried them)", not work.unknown,
              f"{len(work.unknown)} unknown, {work.retried} retried"),
    ]  # fmt: skip
    return work, append_s, kill, checks


def _run_steps(group, args, t_start: float, checks: list[DemoCheck]) -> bool:
    """Append, verify, aggregate with Spark, report; returns whether Spark was started."""
    leader = group.wait_for_leader(timeout_s=30)
    say(f"leader: {leader}")
    work, append_s, kill, phase_checks = _append_phase(group, args)
    checks += phase_checks
    say("verifying every acknowledged append on every member ...")
    checks += _verify(group, work)[0]
    spark_info = None
    if not args.no_spark:
        say("starting Spark through RayDP and aggregating the committed log ...")
        schecks, spark_info = _spark_step(group, args)
        checks += schecks
    _summary(args, work, append_s, kill, checks, spark_info, time.monotonic() - t_start)
    return not args.no_spark


def run_demo(args) -> int:
    """Run the demo; 0 when every check passed (see the module docstring)."""
    from rayledger.actors import LedgerConfig, LedgerGroup

    os.environ["PYSPARK_PYTHON"] = sys.executable
    if args.entries <= 0 or args.clients <= 0 or args.batch <= 0:
        raise LedgerError.of(
            ResponseCode.UNEXPECTED_ARGUMENT, "--entries, --clients and --batch must be positive"
        )
    t_start = time.monotonic()
    own_ray = _start_ray(args)
    own_dir = args.data_dir is None
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="rayledger-demo-")
    group = None
    checks: list[DemoCheck] = []
    spark_started = not args.no_spark
    name = f"demo-{uuid.uuid4().hex[:6]}"
    try:
        say(f"creating group {name} (3 members, file store under {data_dir})")
        group = LedgerGroup.create(name, 3, store_dir=data_dir, config=LedgerConfig.fast())
        spark_started = _run_steps(group, args, t_start, checks)
    except Exception as exc:
        log.debug("demo failed", exc_info=True)
        checks.append(DemoCheck("demo ran to the end", False, f"{type(exc).__name__}: {exc}"))
    finally:
        _clean_up(args, group, spark_started, own_dir, data_dir, own_ray)
    ok = bool(checks) and all(c.ok for c in checks)
    failed = "; ".join(f"{c.name} ({c.detail})" if c.detail else c.name for c in checks if not c.ok)
    say("demo: all checks passed" if ok else f"demo: FAILED: {failed}")
    return 0 if ok else 1


def _clean_up(args, group, spark_started: bool, own_dir: bool, data_dir: str, own_ray: bool):
    """Stop Spark, the group and Ray in that order, so nothing calls a dead actor."""
    import ray

    if spark_started:
        from ..spark import stop_spark

        stop_spark()
    if group is not None:
        group.shutdown(delete_data=not args.keep)
    if own_dir and not args.keep:
        shutil.rmtree(data_dir, ignore_errors=True)
    elif args.keep:
        say(f"data kept in {data_dir}")
    if own_ray:
        ray.shutdown()
