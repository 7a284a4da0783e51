"""A group spread over a three-node Ray cluster; removing a node is a host failure.

The cluster (ray.cluster_utils.Cluster) runs in a child process so it does not
collide with the session's local Ray.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.ray

SCRIPT = textwrap.dedent(
    """
    import json, sys, time, tempfile, shutil
    import ray
    from ray.cluster_utils import Cluster
    from rayledger.actors import LedgerGroup, LedgerConfig, LedgerError, OutcomeUnknownError

    root = tempfile.mkdtemp()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="rayledger", log_to_driver=False)
    deadline = time.time() + 60
    while sum(1 for n in ray.nodes() if n["Alive"]) < 3 and time.time() < deadline:
        time.sleep(0.2)
    out = {}
    try:
        g = LedgerGroup.create("multi", 3, store_dir=root, config=LedgerConfig.fast())
        leader = g.wait_for_leader(timeout_s=60)
        infos = {m: ray.get(g.handle(m).info.remote()) for m in g.members}
        out["distinct_nodes"] = len({i["node_id"] for i in infos.values()})
        c = g.client(timeout_s=60)
        acked = {}
        for i in range(20):
            r = c.append(f"m{i}".encode())
            acked[r.index] = f"m{i}".encode()
        # fail the host of a member that is not on the head node (the driver lives there)
        head_id = ray.get_runtime_context().get_node_id()
        victim = next((m for m in g.members if infos[m]["node_id"] != head_id), None)
        node = next(n for n in nodes if n.node_id == infos[victim]["node_id"])
        out["victim_was_leader"] = victim == leader
        cluster.remove_node(node, allow_graceful=False)
        for i in range(20):
            try:
                r = c.append(f"after{i}".encode(), timeout_s=60)
                acked[r.index] = f"after{i}".encode()
            except OutcomeUnknownError:
                pass
        new_leader = g.wait_for_leader(timeout_s=60)
        out["leader_after"] = new_leader
        alive = [m for m in g.members if m != victim]
        ok = True
        for m in alive:
            deadline = time.time() + 30
            while True:
                b = ray.get(g.handle(m).read_batch.remote(0, 1 << 40, True))
                got = {e.index: e.body for e in (b.entries() if b else [])}
                if all(got.get(i) == body for i, body in acked.items()) or time.time() > deadline:
                    break
                time.sleep(0.2)
            ok = ok and all(got.get(i) == body for i, body in acked.items())
        out["acked"] = len(acked)
        out["all_acked_on_survivors"] = ok
        g.shutdown(delete_data=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    print("RESULT " + json.dumps(out))
    """
)


def test_group_spread_over_nodes_survives_a_host_failure():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=420
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    import json

    out = json.loads(line[len("RESULT ") :])
    assert out["distinct_nodes"] == 3, out
    assert out["acked"] >= 30, out
    assert out["all_acked_on_survivors"], out
