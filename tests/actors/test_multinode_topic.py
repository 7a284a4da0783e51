"""A topic spread over a three-node Ray cluster; losing a node fails over only its partitions.

Four partitions of three members each run one member per node, and their preferred leaders
spread the leadership over the three nodes.  Several clients append keyed entries throughout
while a worker node that leads at least one partition is lost (its raylet removed, every
member and helper process on it killed).  Only the partitions led there elect new leaders,
the others keep theirs; every partition commits again; every acknowledged append is in its
key's partition exactly once, and each writer's appends of a key keep their order.

The cluster (ray.cluster_utils.Cluster) runs in a child process so it does not collide with
the session's local Ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# ~100 s on a 2-core machine: a chaos run, like test_multinode.py
pytestmark = [pytest.mark.ray, pytest.mark.chaos]

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time, tempfile, shutil
    from collections import Counter
    sys.path.insert(0, sys.argv[1])
    import ray
    from ray.cluster_utils import Cluster
    from rayledger.integration.topic import LedgerTopic, partition_of
    from rayledger.storage import LedgerError, OutcomeUnknownError
    from groupcheck import TEST_CONFIG, Outcomes, check_history, wait_until

    PARTITIONS, WRITERS, BEFORE, AFTER = 4, 3, 20, 20
    KEYS = [f"k{j}" for j in range(8)]  # two keys on each of the four partitions

    class Writer(threading.Thread):
        # appends "<key>:w<writer>:<seq>" with its own topic client, keys in turn, recording
        # every outcome (acked results, or the error of an append that raised)
        def __init__(self, w, client):
            super().__init__(daemon=True, name=f"writer-{w}")
            self.w, self.client, self.stop = w, client, threading.Event()
            self.acked, self.unknown, self.failed = [], [], []
            self.started_after = 0  # appends begun after the node was lost
            self.lost_at = None

        def run(self):
            seq = 0
            while not self.stop.is_set():
                key = KEYS[(seq + self.w) % len(KEYS)]
                body = f"{key}:w{self.w}:{seq}".encode()
                if self.lost_at is not None:
                    self.started_after += 1
                try:
                    r = self.client.append(body, key=key)
                except OutcomeUnknownError as exc:
                    self.unknown.append((body, repr(exc)[:200]))
                except LedgerError as exc:  # definitely not stored
                    self.failed.append((body, f"{exc.code.name}: {exc}"[:200]))
                except Exception as exc:  # a Ray error: treat as unknown
                    self.unknown.append((body, repr(exc)[:200]))
                else:
                    self.acked.append((key, seq, body, tuple(r), time.monotonic()))
                seq += 1

    root = tempfile.mkdtemp()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="rayledger", log_to_driver=False)
    wait_until(lambda: sum(1 for n in ray.nodes() if n["Alive"]) >= 3, 60, "three live nodes")
    head_id = ray.get_runtime_context().get_node_id()
    label = {head_id: "head", **{n.node_id: f"node{i + 1}" for i, n in enumerate(nodes)}}
    res = {}
    topic, writers = None, []
    try:
        # TEST_CONFIG: fast timers with room for a loaded 2-core machine (12 members here),
        # so that no partition off the lost node elects for want of CPU
        topic = LedgerTopic.create(
            "multitopic", PARTITIONS, members=3, store_dir=root, config=TEST_CONFIG
        )
        topic.wait_for_leaders(90, preferred=True)
        groups = [topic.group(p) for p in range(PARTITIONS)]
        infos = {
            (p, m): ray.get(g.handle(m).info.remote())
            for p, g in enumerate(groups) for m in g.members
        }
        res["member_nodes"] = [
            sorted(label[infos[(p, m)]["node_id"]] for m in g.members)
            for p, g in enumerate(groups)
        ]
        before = topic.status()
        res["leaders_before"] = [r["leader"] for r in before]
        res["terms_before"] = [r["term"] for r in before]
        lead_node = [infos[(p, r["leader"])]["node_id"] for p, r in enumerate(before)]
        res["leader_nodes_before"] = [label[n] for n in lead_node]

        writers = [Writer(w, topic.client(timeout_s=60)) for w in range(WRITERS)]
        for wr in writers:
            wr.start()
        wait_until(lambda: all(len(wr.acked) >= BEFORE for wr in writers), 90,
                   lambda: f"{BEFORE} acks per writer, got {[len(w.acked) for w in writers]}")

        # lose a worker node (the driver lives on the head) that leads the most partitions
        victim = max((n.node_id for n in nodes), key=lead_node.count)
        res["victim"] = label[victim]
        res["affected"] = [p for p, n in enumerate(lead_node) if n == victim]
        # every process of the host dies with it: each partition's member there and its
        # helpers (a worker of a removed raylet can outlive it for a while and go on leading)
        pids = []
        for (p, m), info in infos.items():
            if info["node_id"] == victim:
                helpers = ray.get(groups[p].handle(m).helper_pids.remote(), timeout=30)
                pids += [info["pid"], *helpers.values()]
        res["killed_pids"] = len(pids)
        node = next(n for n in nodes if n.node_id == victim)
        lost_at = time.monotonic()
        for wr in writers:
            wr.lost_at = lost_at
        cluster.remove_node(node, allow_graceful=False)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, TypeError):
                pass  # gone already (or a helper that was restarting: no pid)
        wait_until(lambda: all(wr.started_after >= AFTER for wr in writers), 150,
                   lambda: f"{AFTER} appends per writer after the loss, got "
                           f"{[w.started_after for w in writers]}")
        for wr in writers:
            wr.stop.set()
        for wr in writers:
            wr.join(90)
        res["writers_stopped"] = not any(wr.is_alive() for wr in writers)
        # per partition, the loss to its first ack after it (writers take keys in turn, so
        # a partition that kept its leader also waits for the failed-over ones)
        res["first_ack_after_loss_s"] = {}
        for p in range(PARTITIONS):
            after = [a[4] for wr in writers for a in wr.acked if a[3][0] == p and a[4] > lost_at]
            res["first_ack_after_loss_s"][p] = round(min(after) - lost_at, 2) if after else None

        topic.wait_for_leaders(60)
        after = topic.status()
        res["leaders_after"] = [r["leader"] for r in after]
        res["terms_after"] = [r["term"] for r in after]
        res["leader_nodes_after"] = [
            label.get(r["node"], r["node"]) if r["leader"] else None for r in after
        ]

        # every partition's log as a linearizable read through a new topic client
        reader = topic.client(timeout_s=60)
        logs = {}
        for p in range(PARTITIONS):
            committed = reader.committed_index(p)
            logs[p] = [(e.index, e.body) for e in reader.read(p, 0, committed + 1)]
        count = Counter(b for p in logs for _i, b in logs[p] if b)
        acked = [a for wr in writers for a in wr.acked]
        res["acked"] = len(acked)
        res["unknown"] = sum(len(wr.unknown) for wr in writers)
        res["failed"] = sum(len(wr.failed) for wr in writers)
        res["errors"] = [e for wr in writers for e in (wr.unknown + wr.failed)][:5]
        res["acked_after_loss"] = Counter(a[3][0] for a in acked if a[4] > lost_at)
        res["acked_off_key_partition"] = [
            a[2].decode() for a in acked if a[3][0] != partition_of(a[0], PARTITIONS)
        ]
        res["acked_not_once"] = {a[2].decode(): count[a[2]] for a in acked if count[a[2]] != 1}
        res["committed_twice"] = [b.decode() for b, n in count.items() if n > 1]
        where = {b: (p, i) for p in logs for i, b in logs[p] if b}
        res["acked_elsewhere"] = [  # committed, but not where its ack said
            a[2].decode() for a in acked if a[2] in where and where[a[2]] != a[3][:2]
        ]
        res["committed_off_key_partition"] = [
            b.decode() for b, (p, _i) in where.items()
            if p != partition_of(b.decode().split(":")[0], PARTITIONS)
        ]
        # per-key order: each writer's acked appends of a key in increasing index order
        order_broken = []
        for wr in writers:
            for key in KEYS:
                seqs = [(where[b][1], seq) for k, seq, b, _r, _t in wr.acked
                        if k == key and b in where]
                if [s for _i, s in sorted(seqs)] != sorted(s for _i, s in seqs):
                    order_broken.append(f"w{wr.w}/{key}")
        res["order_broken"] = order_broken

        # and on every live member: the logs agree, hold every ack at its index, and commit
        # no body twice, none that failed, none that nobody appended
        for p, g in enumerate(groups):
            out = Outcomes()
            for wr in writers:
                for _k, _s, body, r, _t in wr.acked:
                    if r[0] == p:
                        if out.acked.setdefault(r[1], body) != body:
                            out.conflicts.append((r[1], out.acked[r[1]], body))
                out.unknown += [b for b, _e in wr.unknown]
                out.failed += wr.failed
            alive = [m for m in g.members if infos[(p, m)]["node_id"] != victim]
            check_history(g, out, reader.client(p), members=alive)
        res["history_checked"] = True

        # the topic's keeper spreads the leaders over the live nodes once the failover
        # settled (when the failed-over partitions piled onto one node)
        def spread():
            ns = [r["node"] for r in topic.status() if r["leader"]]
            return len(ns) == PARTITIONS and max(ns.count(n) for n in set(ns)) <= 2
        wait_until(spread, 90, lambda: f"leaders spread over two nodes: {topic.status()}")
        res["leader_nodes_settled"] = [label.get(r["node"], r["node"]) for r in topic.status()]
        res["keeper_moves"] = topic.keeper_moves()
    finally:
        for wr in writers:
            wr.stop.set()
        if topic is not None:
            try:
                topic.delete(delete_data=True)
            except Exception as exc:
                print(f"topic delete failed: {exc!r}", file=sys.stderr)
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    print("RESULT " + json.dumps(res))
    """
)


@pytest.fixture(scope="module")
def node_loss() -> dict:
    """One run of SCRIPT, shared by the tests below."""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, HERE], capture_output=True, text=True, timeout=400
    )
    tail = f"stdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, tail
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, tail
    return json.loads(line[len("RESULT ") :])


@pytest.mark.timeout(450)
def test_partitions_spread_their_leaders_over_the_nodes(node_loss: dict) -> None:
    out = node_loss
    why = json.dumps(out)  # the whole result in every failure message
    # each partition has one member per node
    assert all(ms == ["head", "node1", "node2"] for ms in out["member_nodes"]), why
    # four preferred leaders on three nodes: every node leads, none more than two
    lead = out["leader_nodes_before"]
    assert len(set(lead)) == 3, why
    assert max(lead.count(n) for n in set(lead)) <= 2, why


@pytest.mark.timeout(450)
def test_losing_a_node_fails_over_only_the_partitions_it_led(node_loss: dict) -> None:
    out = node_loss
    why = json.dumps(out)
    assert out["victim"] != "head" and out["affected"], why
    assert out["killed_pids"] >= 4, why  # a member of each of the four partitions at least
    for p in range(4):
        assert out["leaders_after"][p] is not None, why
        if p in out["affected"]:
            # a member on a surviving node leads a newer term
            assert out["leaders_after"][p] != out["leaders_before"][p], why
            assert out["leader_nodes_after"][p] != out["victim"], why
            assert out["terms_after"][p] > out["terms_before"][p], why
        else:
            # a partition led elsewhere keeps its leader and term: losing a follower is quiet
            assert out["leaders_after"][p] == out["leaders_before"][p], why
            assert out["terms_after"][p] == out["terms_before"][p], why


@pytest.mark.timeout(450)
def test_every_ack_is_committed_once_in_its_keys_order(node_loss: dict) -> None:
    out = node_loss
    why = json.dumps(out)
    assert out["writers_stopped"], why
    assert out["acked"] >= 3 * 20 + 3 * 10, why
    # writes went on in every partition after the loss, the failed-over ones included
    assert all(out["acked_after_loss"].get(str(p), 0) >= 1 for p in range(4)), why
    assert not out["acked_off_key_partition"], why
    assert not out["acked_not_once"], why
    assert not out["committed_twice"], why
    assert not out["acked_elsewhere"], why
    assert not out["committed_off_key_partition"], why
    assert not out["order_broken"], why
    assert out["history_checked"], why


@pytest.mark.timeout(450)
def test_the_keeper_spreads_the_leaders_again_after_the_failover(node_loss: dict) -> None:
    out = node_loss
    why = json.dumps(out)
    settled = out["leader_nodes_settled"]
    assert out["victim"] not in settled, why
    assert max(settled.count(n) for n in set(settled)) <= 2, why  # 4 leaders, 2 live nodes
    # only leaders a failover displaced are moved: the ones at home stay
    assert all(m["partition"] in out["affected"] for m in out["keeper_moves"]), why
