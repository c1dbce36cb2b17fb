"""Append a benchmark's results to benchmarks/RESULTS.md with date, machine and command."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import sys
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


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
    if not RESULTS.exists():
        RESULTS.write_text("# Benchmark results\n\nAppended by the scripts in benchmarks/; compare numbers within one run (shared machines drift).\n\n")
    with RESULTS.open("a") as fh:
        fh.write(text)
    print(text)
