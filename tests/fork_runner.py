"""Run ``python -c CODE ARGS...`` jobs, each in a process of its own forked from one warm process.

For tests that run many short jobs in fresh processes (tests/test_hostile_cache.py: one per hostile
cache, for its one-line errors and its own peak RSS). A fresh interpreter per job paid Python's
start and the import of torch (through ``loaders``) every time, some 1.6 s each on 2 cores. Here
one server imports :data:`PRELOAD` once and forks a child per request; the child is a copy of that
server (nothing run by an earlier job reaches it), sets ``sys.argv`` as ``python -c`` would and runs
the code as ``__main__``. Its stdout and stderr go to files of their own; the server replies with
the exit code (as the interpreter gives it: an uncaught exception is 1 with its traceback on stderr)
and both outputs. A child still running after the request's timeout is killed (exit code -9).

A forked child's peak RSS (``VmHWM``) starts at the server's RSS at the fork (the imported modules,
some 300 MB with torch), where a fresh interpreter's started near zero: a bound on a job's peak
memory must leave room for it.

Protocol: one JSON request a line on stdin, ``{"code": str, "argv": [str, ...], "timeout": s}``;
one JSON reply a line on stdout, ``{"rc": int, "stdout": str, "stderr": str}``.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from typing import IO, Any

PRELOAD = ("numpy", "torch", "cachebuild", "loaders")
"""What the jobs import anyway: imported once, in the server."""


def _run_code(code: str, argv: list[str]) -> int:
    """The child's work: ``code`` as ``python -c`` runs it; the exit code the interpreter would give."""
    sys.argv = ["-c", *argv]
    try:
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _run_child(code: str, argv: list[str], timeout: float) -> dict[str, Any]:
    """Fork, run ``code`` in the child (stdout and stderr to files), wait at most ``timeout`` s."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            rc = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                rc = _run_code(code, argv)
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(rc)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                rc = -signal.SIGKILL
                break
            time.sleep(0.01)
        out.seek(0)
        err.seek(0)
        return {"rc": rc, "stdout": out.read().decode(errors="replace"), "stderr": err.read().decode(errors="replace")}


def serve(requests: IO[str], replies: IO[str]) -> None:
    """Import :data:`PRELOAD`, then answer requests until ``requests`` ends."""
    for name in PRELOAD:
        importlib.import_module(name)
    for line in requests:
        request = json.loads(line)
        replies.write(json.dumps(_run_child(request["code"], list(request["argv"]), float(request["timeout"]))) + "\n")
        replies.flush()


if __name__ == "__main__":
    serve(sys.stdin, sys.stdout)
