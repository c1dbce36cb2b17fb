"""Append a benchmark's results to benchmarks/RESULTS.md with date, machine and command; the quick mode.

Quick mode (``BENCH_QUICK=1`` in the environment, ``make bench-quick``): every
benchmark runs end to end on tiny inputs for a short time, to show that it
still runs (CI's smoke test); its numbers mean nothing, so :func:`append`
prints the table and records nothing.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("RESULTS.md")


def quick() -> bool:
    """True in quick mode (``BENCH_QUICK=1``)."""
    return os.environ.get("BENCH_QUICK", "") not in ("", "0")


SCRATCH_KEYS = ("root", "out", "dir")
"""Options that name a benchmark's scratch folder (deleted and rebuilt by the script)."""


def quick_defaults(parser: argparse.ArgumentParser, **defaults: Any) -> None:
    """In quick mode, replace the parser's defaults with these small ones (flags given still win).

    A scratch folder's default (:data:`SCRATCH_KEYS`) gets this process's id, so two quick
    runs at once (the test suite next to a developer's ``make bench-quick``) never build
    into, or delete, each other's folder.
    """
    if quick():
        for key in SCRATCH_KEYS:
            if key in defaults:
                defaults[key] = type(defaults[key])(f"{defaults[key]}-{os.getpid()}")
        parser.set_defaults(**defaults)


def machine() -> str:
    cpu = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Python {platform.python_version()}"


def append(title: str, rows: list[tuple[str, str]], notes: list[str] = ()) -> None:
    """Write a section: title, date, machine, command, then a two-column table."""
    lines = [
        f"## {title}",
        "",
        f"- date: {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')}",
        f"- machine: {machine()}",
        f"- command: `{' '.join(shlex.quote(a) for a in [Path(sys.argv[0]).as_posix()] + sys.argv[1:])}`",
        "",
        "| measure | value |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {v} |" for k, v in rows]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    text = "\n".join(lines) + "\n\n"
    if quick():
        print(text + "(quick mode: BENCH_QUICK=1, tiny inputs; not recorded in RESULTS.md)")
        return
    if not RESULTS.exists():
        RESULTS.write_text("# Benchmark results\n\nAppended by the scripts in benchmarks/; compare numbers within one run (shared machines drift).\n\n")
    with RESULTS.open("a") as fh:
        fh.write(text)
    print(text)
