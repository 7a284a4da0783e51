"""The command line's own output, kept apart from Ray's and Spark's.

Ray (its startup, Data executor and raylet messages), the Spark JVM (log4j) and
py4j write to the process's file descriptors 1 and 2, from Python threads and
from child processes alike.  Unless ``--verbose`` is given, :func:`quiet` points
both descriptors at a log file and gives the command line private copies of the
terminal's stdout and stderr: :func:`say`, :func:`error` and :func:`console`
write there, so a user sees only rayledger's lines, and the log file holds the
rest for when something goes wrong.

The log file is a fresh temporary file, deleted when the command succeeds.  With
``RAYLEDGER_LOG=FILE`` in the environment it is ``FILE`` instead, always kept (the
tests read it to check that nothing went wrong behind the quiet output).
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import tempfile
import warnings
from typing import TextIO

#: Third-party loggers held at ERROR in quiet mode (their INFO/WARN lines are noise here).
NOISY_LOGGERS = ("ray", "ray.data", "ray.serve", "py4j", "pyspark", "raydp", "filelock")


class _Streams:
    """Where the command line's own lines go; the process's stdout/stderr by default."""

    out: TextIO | None = None
    err: TextIO | None = None
    log_path: str | None = None
    keep_log: bool = False


def _out() -> TextIO:
    return _Streams.out or sys.stdout


def _err() -> TextIO:
    return _Streams.err or sys.stderr


def say(*parts: object, end: str = "\n") -> None:
    """One line of the command's own output (stdout)."""
    print(*parts, end=end, file=_out(), flush=True)


def error(message: str, show_log: bool = True) -> None:
    """One line on stderr, plus where the third-party log is when there is one (unless
    ``show_log`` is false: the message names it already)."""
    print(message, file=_err(), flush=True)
    path = _Streams.log_path
    if show_log and path and os.path.exists(path) and os.path.getsize(path) > 0:
        print(f"(Ray and Spark output of this run: {path})", file=_err(), flush=True)


def console(stderr: bool = False):
    """A rich Console writing to the command's own stdout (or stderr)."""
    from rich.console import Console

    return Console(file=_err() if stderr else _out())


def log_path() -> str | None:
    return _Streams.log_path


def quiet() -> str:
    """Send fds 1 and 2 (and every child's) to a log file; returns its path."""
    if _Streams.log_path:
        return _Streams.log_path
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")  # Spark's and Ray's Python workers
    path = os.environ.get("RAYLEDGER_LOG")
    if path:
        path = os.path.abspath(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        _Streams.keep_log = True
    else:
        fd, path = tempfile.mkstemp(prefix="rayledger-", suffix=".log")
    sys.stdout.flush()
    sys.stderr.flush()
    _Streams.out = io.TextIOWrapper(
        os.fdopen(os.dup(1), "wb", buffering=0), encoding="utf-8", line_buffering=True
    )
    _Streams.err = io.TextIOWrapper(
        os.fdopen(os.dup(2), "wb", buffering=0), encoding="utf-8", line_buffering=True
    )
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    _Streams.log_path = path
    return path


def finish(ok: bool) -> None:
    """Drop the log file of a run that went well; keep it (its path was printed) otherwise,
    and always when it is ``RAYLEDGER_LOG``'s."""
    path = _Streams.log_path
    if path and ok and not _Streams.keep_log:
        try:
            os.unlink(path)
        except OSError:
            pass


def print_rows(rows: list[dict], title: str, as_json: bool) -> None:
    """``rows`` as one JSON line, or as a table titled ``title`` (the list commands')."""
    if as_json:
        say(json.dumps(rows))
        return
    if not rows:
        say(f"no {title}")
        return
    from rich.table import Table

    table = Table(title=title)
    for col in rows[0]:
        table.add_column(col)
    for r in rows:
        table.add_row(*("-" if v is None else str(v) for v in r.values()))
    console().print(table)
