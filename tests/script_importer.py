"""Import scripts, each in a process of its own, forked from one warm process (tests/test_examples.py).

Each script must be imported in a fresh process: what its import does (``sys.path``, module-level
state, a half-imported module after a failure) must not reach the next script. A fresh interpreter
per script paid Python's start and the import of torch (every script's heavy import) once per
script, some 2 s each on 2 cores. Here one server process imports the common libraries once
(:data:`PRELOAD`), then forks a child per request: the child is a copy of that process, nothing
imported by an earlier script, and imports the script as ``python -c`` did before (the script's
folder, ``benchmarks/`` and ``examples/`` first on ``sys.path``; the script run as a module named by
its stem); the server replies with the child's exit code and its output. A child still running
after the request's timeout is killed (exit code -9).

Protocol: the server reads one JSON request a line on stdin, ``{"path": ..., "timeout": s}``, and
writes one JSON reply a line on stdout, ``{"rc": int, "output": str}``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import IO, Any

from fork_runner import wait_child

REPO = Path(__file__).resolve().parents[1]
PRELOAD = ("numpy", "torch", "cachebuild", "loaders")
"""What every script imports anyway (directly or through cachebuild and loaders): imported once, in the server."""


def _import_script(file: Path) -> int:
    """The child's work: import ``file`` as its own module; the exit code a fresh interpreter would give."""
    sys.path[:0] = [str(file.parent), str(REPO / "benchmarks"), str(REPO / "examples")]
    try:
        spec = importlib.util.spec_from_file_location(file.stem, file)
        assert spec is not None and spec.loader is not None, file
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    except SystemExit as exc:  # as the interpreter treats it
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _run_child(file: Path, timeout: float) -> dict[str, Any]:
    """Fork, import ``file`` in the child (its stdout and stderr to a file), wait at most ``timeout`` s."""
    with tempfile.TemporaryFile() as log:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                code = _import_script(file)
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
        rc = wait_child(pid, timeout, os.kill)  # (the child leads no group of its own)
        log.seek(0)
        return {"rc": rc, "output": log.read().decode(errors="replace")}


def serve(requests: IO[str], replies: IO[str]) -> None:
    """Import :data:`PRELOAD`, then answer requests until ``requests`` ends."""
    for name in PRELOAD:
        importlib.import_module(name)
    for line in requests:
        request = json.loads(line)
        replies.write(json.dumps(_run_child(Path(request["path"]), float(request["timeout"]))) + "\n")
        replies.flush()


if __name__ == "__main__":
    # Started as ``python -c`` is (from the repository root, its first sys.path entry ''): this folder
    # leaves sys.path, so a script sees the modules a fresh ``python -c`` run from the root would.
    here = Path(__file__).resolve().parent
    sys.path[:] = ["", *(p for p in sys.path if p and Path(p).resolve() != here)]
    serve(sys.stdin, sys.stdout)
