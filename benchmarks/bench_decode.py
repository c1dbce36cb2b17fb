"""Decode straight into the batch (issue 15): the loader before and after, the peers and the limits, in one run.

Readers of ``bench_load.py`` (``ours``: graphs view zstd and raw, twins compact
and full rows) and ``bench_mel.py`` (``ours_rate``: the mel view), each with 0
and 2 workers, run from two source trees in alternation (old, new, new, old,
...; each measurement in a fresh process), ``--rounds`` times; LitData (zstd
and none, 0 and 2 workers) and the limits (``peers.decompression_limit``: zstd
decompression of our own frames on all cores, and for the raw cache the plain
gather of the same bytes) are measured once per round, between the trees'
measurements. Medians are reported, with every run.

    python benchmarks/bench_decode.py --old /tmp/cachebuild-before --rounds 3

``--old`` is a checkout of the code before the change (``git archive <commit> | tar -x -C DIR``).
``twins pool`` (``compact="pool"``; timed in the new tree only when the old tree has no such mode) counts the batches
delivered plus the consumer's pool loading (``TwinsContext.load`` per batch, on the CPU, no expand),
with the context's default decode thread, with ``decoder="process"`` and with 2 decode processes.
``--only 'graphs raw'`` times only the setups a change touches (the limits are always measured;
the old/new batch comparison still covers every setup).
Appends a table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NEW = HERE.parent

_CHILD = r"""
import json, os, sys
from pathlib import Path
kind, path, workers, batch, limit, opts = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), json.loads(sys.argv[6])
if kind.startswith("digest "):  # sha256 of every key of the first batches of two epochs
    import hashlib
    from loaders import ShardStream, make_loader
    from loaders.loader import shutdown_workers
    view = kind.split()[1]
    loader = make_loader(ShardStream(path, view=view, batch_size=batch, seed=0, **opts), num_workers=workers)
    h, n = hashlib.sha256(), 0
    for epoch in range(2):
        for i, b in enumerate(loader):
            for key in sorted(b):
                h.update(key.encode())
                h.update(b[key].numpy().tobytes())
            n += 1
            if i + 1 >= int(limit):
                break
    shutdown_workers(loader)
    d = {"sha256": h.hexdigest(), "batches": n}
elif kind == "mel":
    import bench_mel
    d = bench_mel.ours_rate(path, workers, batch, limit)
elif kind == "litdata":
    import peers
    d = peers.litdata_rate(path, workers, batch, limit)
elif kind == "twins pool":
    import bench_load
    d = bench_load.ours_pool(path, batch, workers, limit, **opts)
elif kind == "expand times":
    import bench_load
    d = bench_load.expand_times(path, batch)
elif kind == "limit":
    import peers
    d = peers.decompression_limit(path, os.cpu_count() or 1)
else:
    import bench_load
    d = bench_load.ours(path, kind, batch, workers, limit, **opts)
print("RESULT " + json.dumps(d), flush=True)
os._exit(0)  # see bench_mix.py: skip interpreter shutdown after the workers were stopped
"""


def measure(tree: Path, kind: str, path: Path, workers: int, batch: int, limit: float, opts: dict, tries: int = 3) -> dict:
    """One measurement in a fresh process with ``tree`` first on the path (killed and run again after ``limit + 90`` s)."""
    env = dict(os.environ, PYTHONPATH=f"{tree}:{tree / 'benchmarks'}:{HERE}")
    for _ in range(tries):
        try:
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, kind, str(path), str(workers), str(batch), str(limit), json.dumps(opts)],
                env=env,
                cwd=tree,
                capture_output=True,
                text=True,
                check=False,
                timeout=limit + 90,
            )
        except subprocess.TimeoutExpired:
            print(f"  {kind} w{workers} in {tree}: no result, run again", flush=True)
            continue
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if line:
            return json.loads(line[-1][7:])
        print(f"  {kind} w{workers} in {tree} failed:\n{out.stderr[-2000:]}", flush=True)
    return {}


def _digests(cases: list, old: Path, per_epoch: int) -> str:
    """sha256 over every key of the first ``per_epoch`` batches of epochs 0 and 1, old tree vs new, for every case."""
    same, total, differ = 0, 0, []
    for label, kind, path, w, batch, opts in cases:
        view = "mel" if kind == "mel" else kind
        got = [measure(tree, f"digest {view}", path, w, batch, per_epoch, opts) for tree in (old, NEW)]
        if got[0].get("sha256") and got[0].get("sha256") == got[1].get("sha256"):
            same, total = same + 1, total + got[1]["batches"]
        else:
            differ.append(label)
        print(f"digest {label}: old {got[0].get('sha256', '?')[:16]} new {got[1].get('sha256', '?')[:16]}", flush=True)
    if differ:
        return f"NO: {', '.join(differ)} differ ({same} of {len(cases)} setups identical)"
    return f"yes: {total} batches over {len(cases)} setups (views x 0/2 workers, 2 epochs each), sha256 of every key"


def rate(d: dict) -> float:
    for key in ("graphs_per_s", "rows_per_s", "segments_per_s", "items_per_s", "samples_per_s"):
        if key in d:
            return float(d[key])
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True, help="checkout of the code before the change")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0, help="measured seconds per reader")
    ap.add_argument("--graphs", type=int, default=5000)
    ap.add_argument("--mel-files", type=int, default=3000)
    ap.add_argument("--digest-batches", type=int, default=120, help="batches per epoch hashed (2 epochs) for the old/new identity check")
    ap.add_argument(
        "--only",
        default="",
        help="time only the setups whose label starts with one of these comma-separated prefixes (e.g. 'graphs raw'); "
        "the limits are always measured, LitData only when it is named; batches of every setup are still compared",
    )
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    sys.path[:0] = [str(NEW), str(HERE)]
    import bench_mel
    import peers
    from _results import append
    from cachebuild.jobs import run_causal_build

    t0, load0 = time.time(), os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-decode-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        causal = {c: work / f"causal-{c}" for c in ("zstd", "none")}
        for codec, path in causal.items():
            run_causal_build(None, [], {"graphs": args.graphs, "build.codec": codec}, path, progress=False)
        bench_mel.write_user_h5(work / "user.h5", args.mel_files)
        bench_mel.build(work / "user.h5", work / "mel-none", "none")
        only = [o.strip() for o in args.only.split(",") if o.strip()]
        lit = {}
        try:
            for comp in ("zstd", None) if not only or any(o.startswith("litdata") for o in only) else ():
                lit[comp or "none"] = peers.litdata_prepare(causal["zstd"], work / f"litdata-{comp or 'none'}", comp)
        except ImportError as exc:
            print(f"litdata not installed ({exc}); skipped", flush=True)
        cases = []
        for w in (0, 2):
            cases += [
                (f"graphs zstd w{w}", "graphs", causal["zstd"], w, 256, {}),
                (f"graphs raw w{w}", "graphs", causal["none"], w, 256, {}),
                (f"twins compact zstd w{w}", "twins", causal["zstd"], w, 4096, {"compact": True}),
                (f"twins full rows zstd w{w}", "twins", causal["zstd"], w, 4096, {}),
                (f"mel view raw w{w}", "mel", work / "mel-none", w, 8192, {}),
            ]
        pool_cases = [(f"twins pool zstd w{w}", "twins pool", causal["zstd"], w, 4096, {}) for w in (0, 2)]  # new only
        pool_cases += [(f"twins pool, decode process, zstd w{w}", "twins pool", causal["zstd"], w, 4096, {"decoder": "process"}) for w in (0, 2)]
        pool_cases += [(f"twins pool, decode 2 processes, zstd w{w}", "twins pool", causal["zstd"], w, 4096, {"decoder": "process", "processes": 2}) for w in (0, 2)]
        peer_cases = [(f"litdata {c} w{w}", "litdata", p, w, 256, {}) for c, p in lit.items() for w in (0, 2)]
        peer_cases += [("limit zstd (all cores)", "limit", causal["zstd"], 0, 0, {}), ("limit raw gather (all cores)", "limit", causal["none"], 0, 0, {})]
        timed = [c for c in cases if not only or c[0].startswith(tuple(only))]
        new_only = [c for c in pool_cases if not only or c[0].startswith(tuple(only))]
        pooled = bool(new_only)
        if (Path(args.old) / "loaders" / "twins_context.py").exists():  # the old tree has compact="pool" too: old vs new
            timed, new_only = timed + new_only, []
        expand: list[dict] = []
        runs: dict[str, list[float]] = {}
        limits: dict[str, list[dict]] = {}
        for r in range(args.rounds):
            trees = [("old", args.old), ("new", NEW)] if r % 2 == 0 else [("new", NEW), ("old", args.old)]
            for label, kind, path, w, batch, opts in timed:
                for name, tree in trees:
                    v = rate(measure(tree, kind, path, w, batch, args.seconds, opts))
                    runs.setdefault(f"{label} {name}", []).append(v)
                    print(f"round {r} {name} {label}: {v:,.0f}/s", flush=True)
            for label, kind, path, w, batch, opts in new_only:
                v = rate(measure(NEW, kind, path, w, batch, args.seconds, opts))
                runs.setdefault(f"{label} new", []).append(v)
                print(f"round {r} new {label} (+ context loading): {v:,.0f}/s", flush=True)
            if pooled:
                expand.append(measure(NEW, "expand times", causal["zstd"], 0, 4096, 0, {}))
            for label, kind, path, w, batch, opts in peer_cases:
                d = measure(NEW, kind, path, w, batch, args.seconds, opts)
                limits.setdefault(label, []).append(d)
                runs.setdefault(label, []).append(d.get("graphs_per_s_all", float("nan")) if kind == "limit" else rate(d))
                print(f"round {r} {label}: {runs[label][-1]:,.0f}/s", flush=True)
        med = {k: statistics.median(v) for k, v in runs.items()}
        rows = _rows(timed, runs, med) + _new_rows(new_only, runs, med, expand) + (_expand_rows(expand) if pooled else [])
        rows.append(("batches identical, old vs new (sha256)", _digests(cases, args.old, args.digest_batches)))
        rows += _targets(med, rows_per_graph(causal["zstd"]))
        notes = [
            f"old = {args.old}, new = this tree; {'setups timed: ' + ', '.join(c[0] for c in timed + new_only) + '; ' if only else ''}{args.rounds} rounds alternating old/new, {args.seconds:.0f} s per reader after warm-up, each in a fresh process; medians (every run in brackets)",
            "twins pool: compact='pool' (timed in this tree only where the old has no such mode); its rate counts TwinsContext.load of every batch "
            "(the pools decoded in the consumer, ahead on one thread), on the CPU, without expand (as twins compact is timed without expand_compact); "
            "expand times: one batch, the process's default torch threads",
            f"data: {args.graphs} causal graphs (default recipe) zstd and raw, {args.mel_files} mel files raw, in {work}; graphs batch 256, twins batch 4096 rows, mel batch 8192 segments",
            f"total {time.time() - t0:.0f} s; load average at start {tuple(round(x, 2) for x in load0)}, at end "
            f"{tuple(round(x, 2) for x in os.getloadavg())} ({os.cpu_count()} cores shared with other processes)",
        ]
        if args.no_record:
            for k, v in rows:
                print(f"{k}: {v}")
        else:
            append("bench_decode: decode straight into the batch (issue 15), old vs new, interleaved", rows, notes)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _rows(cases: list, runs: dict[str, list[float]], med: dict[str, float]) -> list[tuple[str, str]]:
    rows = []
    for label, *_ in cases:
        old, new = med[f"{label} old"], med[f"{label} new"]
        rows.append(
            (label, f"old {old:,.0f}/s, new {new:,.0f}/s: {new / old:.2f}x (old {', '.join(f'{v:,.0f}' for v in runs[f'{label} old'])}; new {', '.join(f'{v:,.0f}' for v in runs[f'{label} new'])})")
        )
    for label in runs:
        if label.startswith(("litdata", "limit")):
            rows.append((label, f"{med[label]:,.0f}/s ({', '.join(f'{v:,.0f}' for v in runs[label])})"))
    return rows


def _new_rows(cases: list, runs: dict[str, list[float]], med: dict[str, float], expand: list[dict]) -> list[tuple[str, str]]:
    """Setups of this tree only (no old measurement)."""
    return [(f"{label} (+ context loading)", f"new {med[f'{label} new']:,.0f}/s ({', '.join(f'{v:,.0f}' for v in runs[f'{label} new'])})") for label, *_ in cases]


def _expand_rows(expand: list[dict]) -> list[tuple[str, str]]:
    """The expand times of this tree."""
    rows = []
    ok = [e for e in expand if e]
    if ok:
        p, c = (statistics.median(e[k] for e in ok) * 1e3 for k in ("pool_expand_s", "compact_expand_s"))
        rows.append(("expand on the CPU, one 4,096-row batch: TwinsContext.expand vs expand_compact", f"{p:.2f} ms vs {c:.2f} ms (medians of 15 per round, {len(ok)} rounds)"))
    return rows


def rows_per_graph(cache: Path) -> float:
    """Mean twin rows per graph (interventions x rows per world), from the indexes."""
    from cachebuild.format import load_index, read_manifest

    m = read_manifest(cache)
    c = m.field_names.index("int")
    rows = sum(int((load_index(cache / s.index)["shape"][:, c, 0].astype("int64") * load_index(cache / s.index)["shape"][:, c, 1]).sum()) for s in m.shards)
    return rows / m.records


def _targets(med: dict[str, float], per_graph: float) -> list[tuple[str, str]]:
    """The issue's targets, from the medians (best of 0 and 2 workers); a target whose setups were not timed (``--only``) is left out."""
    nan = float("nan")

    def best(prefix: str, tree: str = "new") -> float:
        return max(med.get(f"{prefix} w{w} {tree}", nan) for w in (0, 2))

    lit_z = max(med.get("litdata zstd w0", nan), med.get("litdata zstd w2", nan))
    z, raw = best("graphs zstd"), best("graphs raw")
    zlim, rawlim = med.get("limit zstd (all cores)", nan), med.get("limit raw gather (all cores)", nan)
    ceiling = z * per_graph  # rows/s if the graphs view's graphs were expanded to twin rows on the device
    out = [
        (z / lit_z, "target: graphs zstd vs LitData zstd", f"{z / lit_z:.2f}x (target >= 3x; old {best('graphs zstd', 'old') / lit_z:.2f}x)"),
        (z / zlim, "target: graphs zstd vs zstd limit (all cores)", f"{z / zlim:.0%} (target >= 70%; old {best('graphs zstd', 'old') / zlim:.0%})"),
        (raw / rawlim, "target: graphs raw vs gather limit (all cores)", f"{raw / rawlim:.0%} (target >= 50%; old {best('graphs raw', 'old') / rawlim:.0%})"),
        (
            best("twins compact zstd") / ceiling,
            "target: twins compact vs the graphs-view ceiling",
            f"{best('twins compact zstd') / ceiling:.0%} of {ceiling:,.0f} rows/s ({per_graph:.0f} rows per graph; "
            f"target >= 60%; old {best('twins compact zstd', 'old') / (best('graphs zstd', 'old') * per_graph):.0%} of its own ceiling)",
        ),
        (
            best("twins pool, decode process, zstd") / ceiling,
            "target: twins pool, decode process (+ context loading) vs the graphs-view ceiling",
            f"{best('twins pool, decode process, zstd') / ceiling:.0%} of {ceiling:,.0f} rows/s (target >= 60%; TwinsContext(decoder='process'))",
        ),
        (
            best("twins pool, decode 2 processes, zstd") / ceiling,
            "target: twins pool, decode 2 processes (+ context loading) vs the graphs-view ceiling",
            f"{best('twins pool, decode 2 processes, zstd') / ceiling:.0%} of {ceiling:,.0f} rows/s (target >= 60%; TwinsContext(decoder='process', processes=2))",
        ),
        (
            best("twins pool zstd") / ceiling,
            "target: twins pool (+ context loading) vs the graphs-view ceiling",
            f"{best('twins pool zstd') / ceiling:.0%} of {ceiling:,.0f} rows/s (target >= 60%; compact='pool', TwinsContext.load per batch on the CPU, no expand)",
        ),
    ]
    for view in (
        "graphs zstd",
        "graphs raw",
        "twins compact zstd",
        "twins pool zstd",
        "twins pool, decode process, zstd",
        "twins pool, decode 2 processes, zstd",
        "twins full rows zstd",
        "mel view raw",
    ):
        for tree in ("old", "new"):
            w0, w2 = med.get(f"{view} w0 {tree}", nan), med.get(f"{view} w2 {tree}", nan)
            out.append((w2 / w0, f"2 workers vs 0: {view} ({tree})", f"{w2 / w0:.2f}x (target >= 1)"))
    return [(label, text) for value, label, text in out if value == value]  # NaN: not timed


if __name__ == "__main__":
    main()
