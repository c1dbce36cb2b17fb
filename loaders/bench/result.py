"""What one ``cachebuild bench`` run measured, as a dataclass, JSON and an aligned table."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["BenchResult", "STAGES", "format_table"]

STAGES = ("read", "decompress", "assemble", "pin", "copy")
"""The per-batch stages :func:`loaders.bench.stage_times` times."""


@dataclass
class BenchResult:
    """What :func:`loaders.bench.run_bench` measured (see :mod:`loaders.bench` for the meaning of each field)."""

    cache: str
    view: str
    batch_size: int
    workers: int
    step_ms: float
    consumer: str
    device: str
    codec: str
    batches: int
    records_per_s: float
    samples_per_s: float
    payload_mb_per_s: float
    batch_mb_per_s: float
    first_batch_s: float
    wait_fraction: float
    wait_p95_ms: float
    wall_s: float
    stages_ms: dict[str, Any] = field(default_factory=dict)
    compare: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON-able values (the schema in :mod:`loaders.bench`)."""
        return asdict(self)

    def to_json(self) -> str:
        """:meth:`to_dict` as one line of JSON (``cachebuild bench --json``)."""
        return json.dumps(self.to_dict())


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}{unit}"
        return f"{v:.3g}{unit}" if abs(v) < 10 else f"{v:.1f}{unit}"
    return f"{v}{unit}"


def _rows(r: BenchResult) -> list[tuple[str, str, str]]:
    c = r.compare
    no_consumer = " (no consumer: all of it)" if r.consumer == "none" else ""
    return [
        ("batches", _fmt(r.batches), _fmt(c["batches"]) if c else ""),
        ("records/s", _fmt(r.records_per_s), _fmt(c["records_per_s"]) if c else ""),
        ("samples/s", _fmt(r.samples_per_s), _fmt(c["samples_per_s"]) if c else ""),
        ("payload MB/s", _fmt(r.payload_mb_per_s), _fmt(c["payload_mb_per_s"]) if c else ""),
        ("time to first batch", _fmt(r.first_batch_s, " s"), _fmt(c["first_batch_s"], " s") if c else ""),
        ("wait fraction" + no_consumer, f"{r.wait_fraction:.1%}", f"{c['wait_fraction']:.1%}" if c else ""),
        ("wait p95", _fmt(r.wait_p95_ms, " ms"), _fmt(c["wait_p95_ms"], " ms") if c else ""),
    ]


def format_table(r: BenchResult) -> list[str]:
    """The result as aligned lines (one column per reader when ``compare`` ran)."""
    head = [
        f"cache {r.cache}: view {r.view}, batch {r.batch_size}, {r.workers} worker(s), codec {r.codec}, "
        f"device {r.device}, consumer {r.consumer}" + (f" ({r.step_ms:g} ms/step)" if r.consumer == "sleep" else "")
    ]
    c = r.compare
    rows = _rows(r)
    w0 = max(len(k) for k, _, _ in rows + [("stage (ms/batch)", "", "")])
    w1 = max(len("cachebuild"), *(len(v) for _, v, _ in rows))
    lines = head + [f"  {'':<{w0}}  {'cachebuild':>{w1}}" + ("  webdataset" if c else "")]
    for k, a, b in rows:
        lines.append(f"  {k:<{w0}}  {a:>{w1}}" + (f"  {b:>10}" if c else ""))
    sm = r.stages_ms
    lines.append(f"  stage ms/batch (mean of {sm.get('sampled_batches', 0)} batches, 1 thread, in-process):")
    for k in STAGES:
        lines.append(f"    {k:<{w0 - 2}}  {_fmt(sm.get(k), ''):>{w1}}")
    return lines
