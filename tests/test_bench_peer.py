"""`rayledger bench peer`'s PySyncObj half: small, quick, and it cleans up after itself."""

from __future__ import annotations

import glob
import multiprocessing
import os
import tempfile
import time

import pytest

pytest.importorskip("pysyncobj")
psutil = pytest.importorskip("psutil")

from rayledger.integration.bench.peer import FIGURES, run_pysyncobj  # noqa: E402


@pytest.mark.chaos  # ~30 s of PySyncObj elections: outside CI's budget
def test_run_pysyncobj_quick_gives_positive_figures_and_leaves_no_process():
    me = psutil.Process(os.getpid())
    before = {c.pid for c in me.children(recursive=True)}
    workdirs = os.path.join(tempfile.gettempdir(), "rayledger-peer-*")
    dirs_before = set(glob.glob(workdirs))
    t0 = time.monotonic()
    out = run_pysyncobj(quick=True, threads=8)
    assert time.monotonic() - t0 < 60, out
    assert "error" not in out, out
    for name in FIGURES:
        assert isinstance(out[name], int | float) and out[name] > 0, (name, out)
    assert multiprocessing.active_children() == []
    # multiprocessing's resource tracker stays (one per interpreter); no node may.
    nodes = [
        c
        for c in me.children(recursive=True)
        if c.pid not in before
        and c.is_running()
        and c.status() != psutil.STATUS_ZOMBIE
        and "spawn_main" in " ".join(c.cmdline())
    ]
    assert nodes == [], nodes
    assert set(glob.glob(workdirs)) <= dirs_before  # the journals are gone
