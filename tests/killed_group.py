"""SIGKILL a build's whole process group, then remove what only its own processes could have removed.

A build with loky workers keeps, while it runs, joblib's memmapping folders (two empty
``/dev/shm/joblib_memmapping_folder_<pid>_...``) and loky's named semaphores (eight
``/dev/shm/sem.loky-<pid>-...``), named by the pid of the process that started the pool. They go
however the build ends but one: its atexit hooks remove them, or, after Ctrl-C, SIGTERM or a
SIGKILL of the build's own process, loky's resource tracker does (a process of the build that
ignores SIGINT and SIGTERM and cleans up once the others have gone). A SIGKILL of the whole process
group kills the tracker too, and nothing is left to remove them: a test that kills a group removes
them itself (:func:`kill_group`), and only those named by a process of the group it killed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable

SHM = Path("/dev/shm")
"""Where glibc keeps named semaphores (``sem.<name>``) and joblib its memmapping folders (when it has 2 GB free;
else in the temporary folder)."""


def leftovers(pids: Iterable[int]) -> list[Path]:
    """joblib's memmapping folders and loky's semaphores named by one of ``pids`` (in :data:`SHM` or the temporary folder)."""
    named = list(pids)
    folders = tuple(f"joblib_memmapping_folder_{pid}_" for pid in named)
    sems = tuple(f"sem.loky-{pid}-" for pid in named)
    found = set()
    for where in {SHM, Path(tempfile.gettempdir())}:
        with contextlib.suppress(FileNotFoundError):
            found |= {where / n for n in os.listdir(where) if n.startswith(folders) or (where == SHM and n.startswith(sems))}
    return sorted(found)


def group_pids(pgid: int) -> set[int]:
    """The live processes of process group ``pgid`` (``pgid`` alone where there is no ``/proc``)."""
    pids = set()
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if name.isdigit():
            with contextlib.suppress(OSError):  # (gone since the listing)
                if os.getpgid(int(name)) == pgid:
                    pids.add(int(name))
    return pids | {pgid}


def remove_leftovers(pids: Iterable[int]) -> list[str]:
    """Remove :func:`leftovers` of ``pids`` (processes that are dead); return their names."""
    removed = []
    for path in leftovers(pids):
        with contextlib.suppress(FileNotFoundError):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path.name)
    return removed


def kill_group(proc: subprocess.Popen) -> list[str]:
    """SIGKILL the process group ``proc`` leads (started with ``start_new_session=True``), wait for ``proc``,
    and remove what the group's processes left in :data:`SHM` (returned: the names removed)."""
    pids = group_pids(proc.pid)
    with contextlib.suppress(ProcessLookupError):  # (every process of the group had ended)
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return remove_leftovers(pids)
