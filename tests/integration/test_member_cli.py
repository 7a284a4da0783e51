"""`rayledger member list|add|remove|replace` against real groups on a local Ray,
through the CLI's ``main`` in this process (attached to the session's cluster)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import ray
from groupcheck import TEST_CONFIG
from rayledger.actors import LedgerGroup
from rayledger.integration.cli.member import member_lines

pytestmark = pytest.mark.ray


@pytest.fixture
def make_group(ray_session, tmp_path, group_name):
    """3-member groups on files, named for the test; always shut down, with every member
    actor the CLI started (found by name), even when the test fails."""
    from rayledger.actors.naming import NAMESPACE, actor_name, group_members

    names: list[str] = []

    def make() -> LedgerGroup:
        name = f"{group_name}-{len(names)}"
        names.append(name)
        g = LedgerGroup.create(name, 3, store_dir=str(tmp_path / "data"), config=TEST_CONFIG)
        g.wait_for_leader()
        return g

    yield make
    for name in names:
        try:
            LedgerGroup.get(name).shutdown(delete_data=True)
        except Exception:
            pass
        for m in group_members(name):  # members the committed configuration no longer names
            try:
                ray.kill(ray.get_actor(actor_name(name, m), namespace=NAMESPACE), no_restart=True)
            except Exception:
                pass


@pytest.fixture
def member_here(capsys):
    """`rayledger member ...` through the CLI's main: (exit code, stdout, stderr); argparse's
    errors (SystemExit) are an exit code like the others."""
    from rayledger.integration.cli.main import main

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        try:
            code = main(["member", *args, "--verbose"])
        except SystemExit as exc:
            code = exc.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["member", *args], code, out.out, out.err)

    return run


def g_args(group: LedgerGroup) -> list[str]:
    return ["--group", group.name, "--address", ray.get_runtime_context().gcs_address]


def ok(out: subprocess.CompletedProcess) -> list[str]:
    assert out.returncode == 0, f"{out.args}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out.stdout.splitlines()


def coded_error(out: subprocess.CompletedProcess, code: str) -> str:
    """An expected error: exit 2 and one `error: [CODE] ...` line on stderr."""
    where = f"{out.args}\nstdout: {out.stdout[-1500:]}\nstderr: {out.stderr[-1500:]}"
    assert out.returncode == 2, where
    errors = [x for x in out.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: [{code}]"), where
    assert "Traceback" not in out.stderr + out.stdout, where
    return errors[0]


def listed(out: subprocess.CompletedProcess, members) -> dict[str, list[str]]:
    """`member list`'s lines of these members (Ray's notices may share stdout here):
    member -> [role, raft role, term, end, committed, alive]."""
    rows = {}
    for line in ok(out):
        cells = line.split()
        if cells and cells[0] in members:
            rows[cells[0]] = cells[1:]
    return rows


def list_until(member_here, g, members, cond, wait_s: float = 30.0) -> dict[str, list[str]]:
    """`member list` until its rows satisfy ``cond`` (a status is a snapshot: on a loaded
    machine a member may answer late, or an election may be under way)."""
    deadline = time.monotonic() + wait_s
    while True:
        rows = listed(member_here("list", *g), members)
        if cond(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def one_leader(rows) -> bool:
    """One member leads, the others follow it, every one answers."""
    raft = sorted(r[1] for r in rows.values())
    return raft == ["FOLLOWER"] * (len(raft) - 1) + ["LEADER"] and all(
        r[-1] == "yes" for r in rows.values()
    )


# on a loaded machine a learner may take a while to catch up (the defaults are 60 s / 120 s)
WAIT = ["--timeout", "150"]


def test_list_add_remove_and_replace(make_group, member_here):
    group = make_group()
    g = g_args(group)
    # n1 leads: `member replace n1` replaces the leader (it hands over to the new member)
    if group.wait_for_leader() != "n1":
        group.transfer_leadership("n1", timeout_s=30)

    out = member_here("list", *g)
    assert any(x.split() == ["MEMBER", "ROLE", "RAFT", "TERM", "END", "COMMITTED", "ALIVE"]
               for x in ok(out))  # fmt: skip
    rows = list_until(member_here, g, ["n0", "n1", "n2"], one_leader)
    assert sorted(rows) == ["n0", "n1", "n2"]
    assert all(r[0] == "voter" and r[-1] == "yes" for r in rows.values()), rows
    assert sorted(r[1] for r in rows.values()) == ["FOLLOWER", "FOLLOWER", "LEADER"], rows

    # a voter, id chosen by the group
    assert ok(member_here("add", *g, *WAIT))[-1] == "n3"
    rows = listed(member_here("list", *g), ["n0", "n1", "n2", "n3"])
    assert len(rows) == 4 and rows["n3"][0] == "voter", rows

    # a learner with the id asked for
    assert ok(member_here("add", *g, "--learner", "--id", "l1", *WAIT))[-1] == "l1"
    rows = list_until(member_here, g, ["n0", "n1", "n2", "n3", "l1"], one_leader)
    assert rows["l1"][0] == "learner" and rows["l1"][1] == "FOLLOWER", rows
    assert rows["n3"][0] == "voter" and rows["n3"][-1] == "yes", rows
    assert group.roles()["l1"] == "learner"

    out = member_here("list", *g, "--json")
    doc = json.loads(next(x for x in ok(out) if x.startswith('{"group"')))
    assert [r["id"] for r in doc["members"]] == ["n0", "n1", "n2", "n3", "l1"]
    assert doc["members"][-1]["role"] == "learner" and doc["waiting"] == []
    assert doc["leader"] in (None, "n0", "n1", "n2", "n3")  # None: an election under way
    assert doc["committed"]["learners"] == ["l1"]

    assert f"removed l1 from group {group.name}" in ok(member_here("remove", *g, "l1", *WAIT))
    assert "l1" not in listed(member_here("list", *g), ["l1"])

    new = ok(member_here("replace", *g, "n1", *WAIT))[-1]
    assert new not in ("n0", "n1", "n2", "n3", "l1") and new.startswith("n")
    rows = listed(member_here("list", *g), ["n0", "n1", "n2", "n3", new])
    assert sorted(rows) == sorted(["n0", "n2", "n3", new]) and rows[new][0] == "voter", rows
    assert "n1" not in LedgerGroup.get(group.name).members
    assert LedgerGroup.get(group.name).wait_for_leader() in ("n0", "n2", "n3", new)


def test_bad_input_is_one_coded_line(make_group, member_here):
    group = make_group()
    g = g_args(group)
    before = group.membership()["committed"]
    coded_error(member_here("remove", *g, "nx"), "UNKNOWN_MEMBER")
    coded_error(member_here("replace", *g, "nx"), "UNKNOWN_MEMBER")
    coded_error(member_here("add", *g, "--id", "n1"), "UNEXPECTED_MEMBER")
    coded_error(member_here("add", *g, "--id", "bad/id"), "UNEXPECTED_ARGUMENT")
    coded_error(member_here("add", *g, "--timeout", "0"), "UNEXPECTED_ARGUMENT")
    coded_error(member_here("remove", *g), "UNEXPECTED_ARGUMENT")  # no ID
    coded_error(member_here("frob", *g), "UNEXPECTED_ARGUMENT")
    address = g[2:]
    coded_error(member_here("list", "--group", "nosuchgroup", *address), "UNKNOWN_GROUP")
    coded_error(member_here("add", "--group", "nosuchgroup", *address), "UNKNOWN_GROUP")
    assert group.membership()["committed"] == before  # nothing changed by the refusals


def test_list_names_changes_under_way_and_members_waiting_for_a_node():
    doc = {
        "group": "g",
        "leader": "n0",
        "members": [
            {
                "id": "n0",
                "role": "voter",
                "raft_role": "LEADER",
                "term": 3,
                "end": 9,
                "committed": 9,
                "alive": True,
            },
            {
                "id": "n1",
                "role": "voter",
                "raft_role": None,
                "term": None,
                "end": None,
                "committed": None,
                "alive": False,
            },
        ],  # fmt: skip
        "joining": [{"id": "n2", "replaces": "n1"}],
        "waiting": ["n1"],
        "latest": {"voters": ["n0", "n1"], "learners": ["n2"], "joining": [["n2", "n1"]]},
        "committed": {"voters": ["n0", "n1"], "learners": []},
    }
    lines = member_lines(doc)
    assert [x.split() for x in lines[1:3]] == [
        ["n0", "voter", "LEADER", "3", "9", "9", "yes"],
        ["n1", "voter", "-", "-", "-", "-", "no"],
    ]
    assert "joining: n2 (a voter once caught up, then n1 leaves)" in lines
    assert "change not committed yet: voters n0, n1; learners n2" in lines
    assert any(x.startswith("waiting for a node: n1") for x in lines)


def test_help_for_every_member_subcommand(member_here):
    texts = {
        "add": "promoted to voter once caught up",
        "remove": "hands leadership over first",
        "replace": "safe to run again",
    }
    for sub in ([], ["list"], ["add"], ["remove"], ["replace"]):
        out = member_here(*sub, "--help")
        assert out.returncode == 0 and "usage: rayledger member" in out.stdout, sub
        if sub and sub[0] in texts:
            assert texts[sub[0]] in " ".join(out.stdout.split()), sub
