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

A request may name a script (``"path"``) instead of code: it runs as ``python PATH ARGS...`` would
(``sys.argv[0]`` the script, so Lightning's DDP launcher starts the other ranks as
``python PATH ARGS...``), with the request's environment (``"env"``, the whole of it). Every child
leads a process group of its own, killed whole when the child ends or times out (as
tests/bounded_run.py does): no rank or DataLoader worker outlives its job.

Protocol: one JSON request a line on stdin, ``{"code": str} or {"path": str}``, with ``"argv": [str, ...],
"timeout": s`` and optionally ``"env": {...}``, or ``{"quit": true}`` to end the server; one JSON reply a line on stdout, ``{"rc": int, "stdout":
str, "stderr": str}``. The server imports the modules named on its command line (default :data:`PRELOAD`).
:class:`ForkServer` is the client.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Sequence

PRELOAD = ("numpy", "torch", "cachebuild", "loaders")
"""What the jobs import anyway: imported once, in the server."""


def _run_code(request: dict[str, Any]) -> int:
    """The child's work: the request's code as ``python -c`` runs it, or its script as ``python PATH``
    does; the exit code the interpreter would give."""
    if "env" in request:
        os.environ.clear()
        os.environ.update(request["env"])
    try:
        if "path" in request:
            sys.argv = [request["path"], *request["argv"]]
            sys.path.insert(0, str(Path(request["path"]).resolve().parent))
            runpy.run_path(request["path"], run_name="__main__")
        else:
            sys.argv = ["-c", *request["argv"]]
            sys.path.insert(0, "")
            exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _run_child(request: dict[str, Any]) -> dict[str, Any]:
    """Fork, run the request in the child (stdout and stderr to files, a process group of its own),
    wait at most its timeout; then kill what is left of the group."""
    timeout = float(request["timeout"])
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            rc = 1
            try:
                os.setsid()
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                rc = _run_code(request)
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(rc)
        try:
            rc = wait_child(pid, timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        out.seek(0)
        err.seek(0)
        stderr = err.read().decode(errors="replace") + (f"\n[test] killed after {timeout:g} s" if rc == -signal.SIGKILL else "")
        return {"rc": rc, "stdout": out.read().decode(errors="replace"), "stderr": stderr}


def wait_child(pid: int, timeout: float, kill: Callable[[int, int], None] = os.killpg) -> int:
    """The forked child's exit code, or -9 once ``kill(pid, SIGKILL)`` (its process group by default) ended it
    after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -signal.SIGKILL
        time.sleep(0.01)


def serve(requests: IO[str], replies: IO[str], preload: Sequence[str] = PRELOAD) -> None:
    """Import ``preload``, then answer requests until ``requests`` ends."""
    for name in preload:
        importlib.import_module(name)
    for line in requests:
        request = json.loads(line)
        if request.get("quit"):  # (the client's pipe may also be held open by processes it forked since)
            return
        replies.write(json.dumps(_run_child(request)) + "\n")
        replies.flush()


class ForkServer:
    """The client: a server started with ``env`` in ``cwd`` (its ``PYTHONPATH`` decides what ``preload``
    finds; variables read at start or at import, such as ``PYTHONWARNINGS`` or ``OMP_NUM_THREADS``, are
    the server's for every job)."""

    def __init__(self, env: Mapping[str, str], preload: Sequence[str] = PRELOAD, cwd: str | Path | None = None):
        cmd = [sys.executable, str(Path(__file__).resolve()), *preload]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(env), cwd=cwd)

    def request(self, **request: Any) -> dict[str, Any]:
        """One job (the protocol's fields as keywords); its reply."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        assert reply, f"the fork runner died (exit code {self.proc.poll()})"
        return dict(json.loads(reply))

    def run(self, cmd: Sequence[str], env: Mapping[str, str], timeout_s: float) -> subprocess.CompletedProcess:
        """``cmd`` (``[python, SCRIPT, ARGS...]``) run as tests/bounded_run.py's ``run_bounded`` runs it, forked."""
        assert Path(cmd[0]).name.startswith("python") and not cmd[1].startswith("-"), cmd
        r = self.request(path=str(cmd[1]), argv=list(cmd[2:]), env=dict(env), timeout=timeout_s)
        return subprocess.CompletedProcess(list(cmd), r["rc"], r["stdout"], r["stderr"])

    def close(self) -> None:
        """End the server (after its current job): a quit request, since the end of its stdin may never come
        (a process this one forked since, such as a persistent DataLoader worker, holds the pipe's write end)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.flush()
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()
        self.proc.wait(60)
        self.proc.stdout.close()


if __name__ == "__main__":
    # run as a script: this folder is sys.path[0]; a job sees the modules a fresh ``python`` would (its PYTHONPATH)
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]
    serve(sys.stdin, sys.stdout, sys.argv[1:] or PRELOAD)
