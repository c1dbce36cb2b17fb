"""Stacks of stuck DDP test ranks and of their DataLoader workers, for the failure message of a hang.

A gloo rank calls :func:`arm` before anything forks: ``SIGUSR1`` then makes
:mod:`faulthandler` write the Python stacks of every thread to
``out_dir/rank{r}.stacks``. The handler and the open file are inherited by the
DataLoader workers the rank forks (``fork`` keeps signal handlers and file
descriptors), so the same signal makes a worker write its own stack to its
rank's file. faulthandler's handler is async-signal-safe: it writes even from a
process whose threads are all stuck on a lock, the GIL included.

When ranks miss their deadline, the test process calls :func:`collect` before
killing them: it signals each rank and each of its descendants in turn and
cuts the file between signals, so every stack is labelled with its process;
where ``py-spy`` (else ``gdb``) is installed it adds each process's native
stacks (C/C++ frames: gloo, torch, CPython's own locks, libc), which
faulthandler cannot see.
"""

from __future__ import annotations

import faulthandler
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["arm", "collect", "diagnosis", "kill_tree", "stacks_file", "IN_FORK_HINT"]

_ARMED: list[IO[str]] = []  # the open stacks files (faulthandler keeps only their descriptors)
_SETTLE_S = 2.0  # a signalled process writes its stacks within this (faulthandler writes at once)
_PY_SPY_S = 30.0
_MAX_CHARS = 6000  # per process and source, in the failure message


def stacks_file(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"rank{rank}.stacks"


def arm(out_dir: str | Path, rank: int) -> None:
    """In a rank, before it forks workers: ``SIGUSR1`` dumps every thread's stack to :func:`stacks_file`."""
    f = open(stacks_file(out_dir, rank), "a", buffering=1)
    _ARMED.append(f)
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=False)


def _descendants(pid: int) -> list[Any]:
    import psutil

    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def _describe(proc: Any) -> str:
    try:
        return f"pid {proc.pid} ({proc.status()}): {' '.join(proc.cmdline())[:160]}"
    except Exception:
        return f"pid {proc.pid} (gone)"


def _py_spy() -> str | None:
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def _run(cmd: list[str]) -> tuple[bool, str]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=_PY_SPY_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"{cmd[0]} failed: {exc}"
    return out.returncode == 0, out.stdout + out.stderr


def _native(py_spy: str | None, pid: int) -> str:
    """Native stacks of ``pid``: py-spy's (Python and C frames), else gdb's where py-spy cannot unwind
    (it fails on a child stuck inside ``fork()``'s own bookkeeping)."""
    ok, text = _run([py_spy, "dump", "--native", "--pid", str(pid)]) if py_spy is not None else (False, "")
    gdb = shutil.which("gdb")
    if not ok and gdb is not None:
        ok, text = _run([gdb, "-batch", "-p", str(pid), "-ex", "thread apply all bt"])
        text = "\n".join(line[:160] for line in text.splitlines() if line.startswith(("Thread ", "#")))  # the stacks, not gdb's chatter
    return text[:_MAX_CHARS]  # innermost frames first: keep the head


def _catches_sigusr1(pid: int) -> bool:
    """Whether ``pid`` has a handler for ``SIGUSR1`` (Linux ``SigCgt``): one that does not (a process
    started by exec, such as multiprocessing's resource tracker) would be killed by it."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((int(line.split()[1], 16) for line in text.splitlines() if line.startswith("SigCgt:")), 0)
    return bool(caught >> (signal.SIGUSR1 - 1) & 1)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _signalled(pid: int, path: Path) -> str:
    """``SIGUSR1`` to ``pid``; what it appended to ``path`` (its rank's stacks file)."""
    if not _catches_sigusr1(pid):
        return "(not armed: no SIGUSR1 handler, not signalled)"
    before = _size(path)
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError as exc:
        return f"(not signalled: {exc})"
    deadline, size = time.monotonic() + _SETTLE_S, before
    while time.monotonic() < deadline:  # until it wrote and then stopped writing for a moment
        time.sleep(0.1)
        now = _size(path)
        if now == size and size > before:
            break
        size = now
    if size == before:
        return "(wrote nothing: faulthandler not armed in it, or it is stopped)"
    with open(path, "rb") as f:
        f.seek(before)
        return f.read(size - before).decode(errors="replace")[-_MAX_CHARS:]


_IN_FORK = re.compile(r'Current thread [^\n]*\n\s*File "[^"]*popen_fork\.py", line \d+ in _launch\n')
IN_FORK_HINT = (
    "--- this process never left os.fork(): the child's half of fork() is stuck, before any line of the worker ran. "
    "On Python <= 3.11 that is CPython gh-112275 (an interpreter lock held by another thread of the rank, gloo's, at the fork); "
    "see docs/DECISIONS.md, 'A DataLoader worker forked in a gloo rank can hang inside fork()'"
)


def diagnosis(python_stacks: str) -> str | None:
    """A known cause read from a process's faulthandler stacks, or None: a forked child whose current
    thread's innermost frame is still the ``os.fork()`` call of ``multiprocessing``'s ``Popen._launch``."""
    return IN_FORK_HINT if _IN_FORK.search(python_stacks) else None


def collect(rank_pids: list[int], out_dir: str | Path) -> str:
    """The stacks of each rank (``rank_pids[r]``) and of every process below it, labelled; for a failure message.

    Call it while the processes still run (before killing them).
    """
    py_spy = _py_spy()
    parts = []
    for rank, pid in enumerate(rank_pids):
        import psutil

        wrote = Path(out_dir, f"rank{rank}.json").exists()  # yes: stuck after its body (leaving the group, exiting)
        try:
            procs = [psutil.Process(pid), *_descendants(pid)]
        except psutil.Error:
            parts.append(f"=== rank {rank}: pid {pid} already exited (rank{rank}.json written: {wrote})")
            continue
        for k, proc in enumerate(procs):
            who = f"rank {rank}" if k == 0 else f"rank {rank} child"
            result = f"\n--- rank{rank}.json written: {'yes (stuck after its body)' if wrote else 'no (stuck in its body)'}" if k == 0 else ""
            stacks = _signalled(proc.pid, stacks_file(out_dir, rank))
            hint = diagnosis(stacks)
            parts.append(f"=== {who}, {_describe(proc)}{result}\n--- Python stacks (faulthandler):\n{stacks}" + (f"\n{hint}" if hint else ""))
            if py_spy is not None or shutil.which("gdb") is not None:
                parts.append(f"--- native stacks (py-spy dump --native, else gdb):\n{_native(py_spy, proc.pid)}")
    if py_spy is None:
        parts.append("(py-spy not installed: `pip install py-spy` adds each process's native stacks)")
    return "\n".join(parts)


def kill_tree(pids: list[int]) -> None:
    """SIGKILL each of ``pids`` and every process below it (workers would otherwise outlive their rank)."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs += [psutil.Process(pid), *_descendants(pid)]
        except psutil.Error:
            pass
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)
