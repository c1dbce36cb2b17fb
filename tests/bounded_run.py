"""Run a test's helper script in its own process group, bounded in time, and kill the whole group
(ranks, DataLoader workers) when it ends or hangs: no process outlives its run. ``tails`` is the
assertion message for any finished subprocess: its exit code and the end of its stdout and stderr."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Mapping, Sequence


def tails(done: subprocess.CompletedProcess, chars: int = 4000) -> str:
    """``done``'s exit code and the last ``chars`` characters of its stdout and stderr (an assertion's message:
    a failed run says why)."""

    def end(text: str | bytes | None) -> str:
        text = text.decode(errors="replace") if isinstance(text, bytes) else (text or "")
        return text[-chars:] if text.strip() else "(empty)"

    return f"exit code {done.returncode}\n--- stdout (end) ---\n{end(done.stdout)}\n--- stderr (end) ---\n{end(done.stderr)}"


def run_bounded(cmd: Sequence[str], env: Mapping[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    """``cmd`` run to its end or for ``timeout_s`` seconds (then killed, said at the end of its stderr)."""
    proc = subprocess.Popen(list(cmd), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        stderr += f"\n[test] killed after {timeout_s:g} s"
    finally:  # a killed run orphans its ranks and workers
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(list(cmd), proc.returncode, stdout, stderr)
