"""Catch-up work in the background: OS scheduling for a learner and the dispatcher that
feeds it.

Ray starts every worker at nice 15, so a learner writing 100 MB/s and the dispatcher
reading it competed as equals with the voters' rounds: on two cores, a single client's
append p99 rose 3x.  ``SCHED_IDLE`` threads run only on CPU nothing else wants; measured
on two cores, the same catch-up then cost the voters' p99 1.9x.  The cores decide
*when* work is background (a member that is no voter; a dispatcher whose follower is a
learner), this module only applies it to every thread of the process.

A process only goes to the background when it can come back: Linux lets a thread leave
``SCHED_IDLE`` for its old nice value only with the privilege (root, ``CAP_SYS_NICE``) or
an ``RLIMIT_NICE`` that allows it.  Without it the work stays in the foreground -- a voter
stuck in ``SCHED_IDLE`` would miss its heartbeats under load.
"""

from __future__ import annotations

import logging
import os
import resource
import sys

log = logging.getLogger("rayledger.actors")

_state = {"background": False}


def _can_come_back() -> bool:
    if os.geteuid() == 0:
        return True
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    return soft == resource.RLIM_INFINITY or soft >= 20 - nice


def set_background(on: bool) -> bool:
    """Every thread of this process to ``SCHED_IDLE`` (``on``) or back to the normal
    policy; True when the process now runs as asked."""
    if _state["background"] == on:
        return True
    if not sys.platform.startswith("linux") or (on and not _can_come_back()):
        return False
    policy = os.SCHED_IDLE if on else os.SCHED_OTHER
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return False
    ok = True
    for tid in tids:
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except OSError as exc:  # a thread that ended meanwhile, or no permission
            if exc.errno != 3:  # ESRCH
                ok = False
                log.warning("pid %d: scheduling policy of thread %d not changed: %r",
                            os.getpid(), tid, exc)  # fmt: skip
    _state["background"] = on if ok else _state["background"]
    return ok
