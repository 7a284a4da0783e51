"""`rayledger bench kv`: the replicated key-value store on a local Ray.

Figures (``--json`` prints them as one object):

- ``put_per_s_single``: one client, one ``KVClient.put`` at a time (and its ``_p50_ms``);
- ``put_p50_over_append``: ``put_single_p50_ms`` over the single-append p50 of a plain
  ledger group (no machine) of the same settings, measured in the same run
  (``ledger_single_p50_ms``): what waiting for the leader's machine costs.  Goal <= 1.3;
- ``put_per_s_64_threads`` / ``ledger_per_s_64_threads`` / ``put_64_threads_over_append``:
  64 threads sharing one client, ``KVClient.put`` against plain appends of a body as
  long, each for ``threads_seconds``.  Goal >= 0.8;
- ``put_per_s_batched``: ``clients`` threads appending batches of ``batch`` put commands
  (how the store is loaded with ``keys`` keys);
- ``get_per_s_linearizable`` / ``_lease`` / ``_committed``: one client, one ``get`` at a
  time, of random keys, at each read consistency;
- ``restart_s_with_snapshots``: a follower holding ``keys`` keys is killed (SIGKILL); the
  seconds until it answers a linearizable read of the newest key itself -- Ray restarts its
  process, it loads its newest snapshot and replays the log after it.  Goal (1 M keys):
  <= 3 s here.  Snapshots every ``snapshot_every`` entries (LedgerConfig's default; with
  ``--quick`` a fifth of the keys); ``restart_replayed_entries``: how many entries after
  its newest snapshot it had to replay (at most the interval);
- ``restart_s_without_snapshots``: the same on a group that takes none (the whole log is
  replayed);
- ``install_mb_per_s`` / ``install_mb``: a member whose data directory was wiped, below
  the leader's compacted begin, gets the leader's snapshot: its bytes over the time from
  the leader's first chunk to the answer that it is sealed (the leader's dispatcher's
  clock).  Goal: >= 100 MB/s.
  ``install_to_serving_s``: from the link healing to the member serving the newest key.

Every group has 3 file-backed members with the fast timers; values are 16-byte strings.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import tempfile
import time
import uuid

import ray
from rayledger.actors import LedgerConfig, LedgerGroup
from rayledger.integration.kv import KVClient, put_command
from rayledger.storage import LedgerError, StoreConfig

from .loads import concurrent_phase, in_threads, pct
from .mq import _until_ok


def _config(snapshot_every: int, segment: int) -> LedgerConfig:
    return LedgerConfig.fast(
        snapshot_every_entries=snapshot_every,
        store=StoreConfig(data_segment_size=segment),  # segments a compaction can drop
        rpc_timeout_ms=10_000,
    )


def _key(i: int) -> str:
    return f"key/{i:08d}"


def _load(kv: KVClient, keys: int, clients: int, batch: int) -> float:
    """Put ``keys`` keys in batches from ``clients`` threads; entries per second."""
    c = kv.client
    per = -(-keys // clients)

    def work(k: int) -> None:
        lo, hi = k * per, min(keys, (k + 1) * per)
        for first in range(lo, hi, batch):
            bodies = [
                put_command(_key(i), b"v%015d" % i) for i in range(first, min(hi, first + batch))
            ]
            # a leader change under this load (2 cores) fails a batch now and then: put it
            # again (puts of the same values: a duplicate changes nothing but revisions)
            _until_ok(lambda b=bodies: c.append_batch(b))

    return round(keys / in_threads(work, clients))


def _single_puts(kv: KVClient, n: int) -> dict:
    lat = []
    t0 = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        kv.put(f"single/{i}", b"x" * 16)
        lat.append((time.perf_counter() - t) * 1000)
    return {"put_per_s_single": round(n / (time.perf_counter() - t0)),
            "put_single_p50_ms": pct(lat, 0.5)}  # fmt: skip


def _threads_puts(kv: KVClient, threads: int, seconds: float) -> tuple[int, int]:
    """(puts per second, puts refused) from ``threads`` threads sharing ``kv``'s client."""
    done, refused = [0] * threads, [0] * threads
    stop = time.monotonic() + seconds

    def work(k: int) -> None:
        i = 0
        while time.monotonic() < stop:
            try:
                kv.put(f"threads/{k}/{i}", b"x" * 16)
                done[k] += 1
            except LedgerError:
                refused[k] += 1  # counted, not hidden: a run with many is not a figure
            i += 1

    elapsed = in_threads(work, threads)  # before the counts: they fill while it runs
    return round(sum(done) / elapsed), sum(refused)


def _versus_ledger(kv: KVClient, root: str, config: LedgerConfig, n: int, seconds: float) -> dict:
    """The KV store's puts beside plain appends on a group of the same settings and no
    machine, in the same run: single p50 and 64 threads."""
    rate, refused = _threads_puts(kv, 64, seconds)
    out = {"put_per_s_64_threads": rate, "put_errors_64_threads": refused,
           "threads_seconds": seconds}  # fmt: skip
    body = len(put_command("single/0", b"x" * 16))
    g = LedgerGroup.create(f"bench-plain-{uuid.uuid4().hex[:6]}", 3, root, config)
    try:
        g.wait_for_leader(timeout_s=60)
        c = g.client(idempotent=False)
        _until_ok(lambda: c.append(b"warm"))
        payload = os.urandom(body)
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            c.append(payload)
            lat.append((time.perf_counter() - t) * 1000)
        out["ledger_single_p50_ms"] = pct(lat, 0.5)
        out["ledger_per_s_64_threads"] = concurrent_phase(g, 64, seconds, body)[
            "concurrent_entries_per_s"]  # fmt: skip
    finally:
        g.shutdown(delete_data=True)
    return out


def _gets(kv: KVClient, keys: int, n: int) -> dict:
    rng = random.Random(7)
    out = {}
    for consistency in ("linearizable", "lease", "committed"):
        kv.get(_key(0), consistency=consistency)
        t0 = time.perf_counter()
        for _ in range(n):
            kv.get(_key(rng.randrange(keys)), consistency=consistency)
        out[f"get_per_s_{consistency}"] = round(n / (time.perf_counter() - t0))
    return out


def _on(g, member: str, request, timeout_s: float = 5.0):
    """``request`` answered by ``member`` itself, or None (not up yet)."""
    try:
        return ray.get(g.handle(member).query.remote(request, "linearizable"), timeout=timeout_s)
    except (LedgerError, ray.exceptions.RayError):
        return None


def _serving(g, member: str, key: str, value: bytes, timeout_s: float = 600.0) -> float:
    """Poll until ``member`` answers ``key`` with ``value``; the time it took."""
    t0 = time.perf_counter()
    while True:
        got = _on(g, member, {"get": key})
        if got is not None and got[0] == value:
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"{member} does not serve {key} after {timeout_s} s")
        time.sleep(0.02)


def _restart(kv: KVClient, last_key: str, value: bytes, snapshots: bool) -> float:
    """Kill a follower holding every key; seconds until it serves the newest key itself."""
    g = kv.group
    leader = g.wait_for_leader()
    f = next(m for m in g.members if m != leader)
    _serving(g, f, last_key, value)
    if snapshots:  # it took its snapshots: the restart starts from the newest
        d = ray.get(g.handle(f).store_dir.remote())
        while not [n for n in os.listdir(f"{d}/snapshots") if not n.startswith(".")]:
            time.sleep(0.1)
    t0 = time.perf_counter()
    g.kill(f)
    time.sleep(0.05)
    return round(time.perf_counter() - t0 + _serving(g, f, last_key, value), 2)


def _tail(kv: KVClient) -> int:
    """Entries a restart replays after a follower's newest snapshot (up to the interval)."""
    g = kv.group
    leader = g.wait_for_leader()
    f = next(m for m in g.members if m != leader)
    d = ray.get(g.handle(f).store_dir.remote())
    have = [n for n in os.listdir(f"{d}/snapshots") if not n.startswith(".")]
    newest = max(int(n.split("-")[0]) for n in have) if have else -1
    return g.status()[f].committed_index - newest


def _install(kv: KVClient, last_key: str, value: bytes) -> dict:
    """Wipe a follower below the leader's compacted begin: it gets the leader's snapshot."""
    g = kv.group
    leader = g.wait_for_leader()
    f = next(m for m in g.members if m != leader)
    others = [m for m in g.members if m != f]
    for m in others:  # the log up to each one's oldest snapshot goes
        g.compact(m)
    d = ray.get(g.handle(f).store_dir.remote())
    g.partition([f], others)
    pid = g.pause(f)
    shutil.rmtree(d, ignore_errors=True)
    os.kill(pid, signal.SIGKILL)
    while _on_status(g, f) is None:  # back, empty, cut off
        time.sleep(0.05)
    g.heal()
    serving = _serving(g, f, last_key, value)
    sent = ray.get(g.handle(leader).peer_progress.remote())[f]["last_install"]
    if sent is None or ray.get(g.handle(f).last_install.remote()) is None:
        raise RuntimeError(f"{f} caught up without a snapshot: the leader's log was not compacted")
    _index, nbytes, ms = sent  # the leader's clock: from its first chunk to the seal's answer
    mb = nbytes / 1e6
    return {"install_mb": round(mb, 1), "install_ms": ms,
            "install_mb_per_s": round(mb / max(ms, 1) * 1000, 1),
            "install_to_serving_s": round(serving, 2)}  # fmt: skip


def _on_status(g, member: str):
    try:
        return ray.get(g.handle(member).status.remote(), timeout=2)
    except ray.exceptions.RayError:
        return None


def run(quick: bool = False, clients: int = 4, batch: int = 1000, keys: int | None = None,
        **_ignored) -> dict:  # fmt: skip
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, namespace="rayledger",
                 include_dashboard=False, log_to_driver=False)  # fmt: skip
    keys = keys or (100_000 if quick else 1_000_000)
    # the default snapshot interval (quick: a fifth of the keys), log segments of 64 MiB
    # (quick: 4 MiB) so that a compaction has whole segments to drop
    every = LedgerConfig().snapshot_every_entries if not quick else keys // 5
    segment = (4 if quick else 64) << 20
    n_single, n_get = (100, 300) if quick else (500, 2000)
    root = tempfile.mkdtemp(prefix="rayledger-bench-kv-")
    out: dict = {"members": 3, "store": "file", "keys": keys, "clients": clients,
                 "batch": batch, "snapshot_every": every,
                 "load_avg_1m_before": round(os.getloadavg()[0], 2)}  # fmt: skip
    kvs: list[KVClient] = []
    try:
        kv = KVClient.create(f"bench-kv-{uuid.uuid4().hex[:6]}", 3, root, _config(every, segment))
        kvs.append(kv)
        _until_ok(lambda: kv.put("warm", b"w"))
        out.update(_single_puts(kv, n_single))
        out.update(_versus_ledger(kv, root, _config(0, segment), n_single, 3 if quick else 10))
        out["put_p50_over_append"] = round(
            out["put_single_p50_ms"] / max(1e-9, out["ledger_single_p50_ms"]), 2)  # fmt: skip
        out["put_64_threads_over_append"] = round(
            out["put_per_s_64_threads"] / max(1, out["ledger_per_s_64_threads"]), 2)  # fmt: skip
        out["put_per_s_batched"] = _load(kv, keys, clients, batch)
        last, value = "last", b"the newest"
        kv.put(last, value)
        out["keys_held"] = len(kv.client.query({"keys": True}))
        out.update(_gets(kv, keys, n_get))
        out["restart_replayed_entries"] = _tail(kv)
        out["restart_s_with_snapshots"] = _restart(kv, last, value, snapshots=True)
        out.update(_install(kv, last, value))
        kv.close()
        kv.group.shutdown(delete_data=True)
        kvs.remove(kv)

        plain = KVClient.create(f"bench-kv-{uuid.uuid4().hex[:6]}", 3, root, _config(0, segment))
        kvs.append(plain)
        _until_ok(lambda: plain.put("warm", b"w"))
        _load(plain, keys, clients, batch)
        plain.put(last, value)
        out["restart_s_without_snapshots"] = _restart(plain, last, value, snapshots=False)
    finally:
        for k in kvs:
            k.close()
            k.group.shutdown(delete_data=True)
        shutil.rmtree(root, ignore_errors=True)
        if started:
            ray.shutdown()
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    return out
