"""Membership on a Ray cluster: a group that heals itself.

A four-node cluster (ray.cluster_utils.Cluster, in a child process so that it does not
collide with the session's local Ray) runs a three-member group on the three worker nodes,
with ``replace_lost_after_s`` set, while a client appends throughout:

1. a node is lost; ``replace_member`` puts its member's replacement on the head node (the
   only one hosting no member);
2. a second node is lost: no free node is left, so the leader waits and says so (status,
   the ``rayledger_members_lost`` figure); a node joins the cluster and the leader replaces
   the lost member there on its own;
3. the third original member's node is lost: the group still commits, and every
   acknowledged append is on every current member.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.ray

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time, tempfile, shutil
    sys.path.insert(0, sys.argv[1])
    import ray
    from ray.cluster_utils import Cluster
    from rayledger.actors import LedgerGroup, LedgerConfig, LedgerError
    from groupcheck import assert_consistent, wait_until

    root = tempfile.mkdtemp()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    workers = [cluster.add_node(num_cpus=1) for _ in range(3)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="rayledger", log_to_driver=False)
    wait_until(lambda: sum(1 for n in ray.nodes() if n["Alive"]) >= 4, 60, "four live nodes")
    head = ray.get_runtime_context().get_node_id()
    res = {}
    stop = threading.Event()
    acked, errors = {}, []

    def write(c):
        k = 0
        while not stop.is_set():
            body = b"w%d" % k
            try:
                acked[c.append(body, timeout_s=30).index] = body
            except LedgerError as exc:
                errors.append(exc.code.name)
            k += 1

    def lose(member):
        node_id = ray.get(g.handle(member).info.remote())["node_id"]
        info = ray.get(g.handle(member).info.remote())
        pids = [info["pid"], *ray.get(g.handle(member).helper_pids.remote()).values()]
        node = next(n for n in workers if n.node_id == node_id)
        cluster.remove_node(node, allow_graceful=False)
        for pid in pids:  # every process of the host dies with it
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, TypeError):
                pass
        return time.monotonic()

    def full(n_voters, lost):
        roles = g.roles()
        return (sum(1 for r in roles.values() if r == "voter") == n_voters
                and not any(m in roles for m in lost))

    try:
        cfg = LedgerConfig.fast(replace_lost_after_s=8.0)
        g = LedgerGroup.create("heal", 3, store_dir=root, config=cfg,
                               nodes=[w.node_id for w in workers])
        g.wait_for_leader(timeout_s=60)
        c = g.client(timeout_s=60)
        t = threading.Thread(target=write, args=(c,), daemon=True)
        t.start()
        wait_until(lambda: len(acked) >= 20, 60, "20 acks")
        originals = list(g.members)
        leader = g.wait_for_leader(timeout_s=60)
        victims = [m for m in originals if m != leader] + [leader]
        # 1. lose a node, replace its member by the API (on the head: the free node)
        lose(victims[0])
        new1 = g.replace_member(victims[0], timeout_s=120)
        res["api_replacement"] = new1
        res["api_node_is_head"] = ray.get(g.handle(new1).info.remote())["node_id"] == head
        res["full_after_api"] = full(3, [victims[0]])
        n1 = len(acked)
        # 2. lose a second node: no free node, the leader waits and says so
        t2 = lose(victims[1])
        def waiting():
            st = g.status()
            return any(victims[1] in s.lost for s in st.values() if s.alive)
        wait_until(waiting, 60, "the leader to report the lost member")
        res["waiting_reported"] = True
        workers.append(cluster.add_node(num_cpus=1))
        cluster.wait_for_nodes()
        wait_until(lambda: full(3, [victims[0], victims[1]]), 180,
                   lambda: f"healing: {g.membership()}")
        res["heal_s"] = round(time.monotonic() - t2, 1)
        res["healed_members"] = g.members
        # 3. lose the node of the third original member: the group still commits
        lose(victims[2])
        n3 = len(acked)
        fresh = LedgerGroup.get("heal").client(timeout_s=60)
        t0 = time.monotonic()
        for i in range(10):
            r = fresh.append(b"fresh%d" % i, timeout_s=60)
            acked[r.index] = b"fresh%d" % i
        res["fresh_client_s"] = round(time.monotonic() - t0, 1)
        wait_until(lambda: len(acked) >= n3 + 30, 120,
                   lambda: f"commits after the third loss: {g.status()} {g.membership()} "
                           f"{sorted(set(errors))} {c.members} {c._leader}")
        stop.set()
        t.join(60)
        res["acked"] = len(acked)
        res["errors"] = sorted(set(errors))
        alive = [m for m in g.members if m not in victims]
        assert_consistent(g, dict(acked), members=alive, wait_s=60)
        res["consistent"] = True
        g.shutdown(delete_data=True)
    finally:
        stop.set()
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    print("RESULT " + json.dumps(res))
    """
)


@pytest.mark.chaos  # a minute on its own cluster: the long runs (the simulation's lost-node
@pytest.mark.timeout(600)  # replacements run in CI: test_membership_sim, all-features mode)
def test_a_group_heals_itself_after_losing_nodes() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, HERE], capture_output=True, text=True, timeout=580
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    out = json.loads(line[len("RESULT ") :])
    why = json.dumps(out)
    assert out["api_node_is_head"] and out["full_after_api"], why
    assert out["waiting_reported"], why
    assert out["consistent"] and out["acked"] >= 60, why
