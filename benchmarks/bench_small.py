"""Small records (issue 15, item 2): stored ratio and read speed, ours vs LitData, for one or more shard layouts.

Three datasets of small records (``small_data.py``): ``mel`` (one 2 KB float16
log-mel segment + an int16 label per record), ``mel_meta`` (the same + a tiny
JSON dict) and ``tokens`` (ragged int32 sequences of 50..500 tokens). Each is
built by ``cachebuild.build`` from a recipe (``kind = "small_data:make"``) with
``codec`` zstd and none, once per configuration: ``--set KEY=VALUE`` overrides
go into every recipe (as ``cachebuild build --set``), ``--packs 1,64`` builds one
configuration per value of ``build.pack`` (records per tar member; a value the
code does not accept is skipped with a message, and ``1`` then means today's
layout, built without the key). LitData ``optimize`` (zstd) gets the same
records, remade from the generator's seeds.

Stored ratio = payload / bytes on disk. Payload: the arrays' ``nbytes`` plus the
compact JSON text (no headers). On disk: ours = the shards' tar and index files
+ manifest.json; LitData = its chunk files + index.json.

Read speed: samples/s of our ``ShardStream(view="records", batch_size=256)``
(shuffle on, the view's defaults) through ``make_loader`` and of LitData's
``StreamingDataset`` + ``StreamingDataLoader`` (shuffle on, batch 256,
``batch_decode="auto"``), at 0 and 2 workers, in ``--rounds`` interleaved rounds
(order reversed every other round), medians; then, for reference, the limit of
each of our caches (``peers.decompression_limit``: zstd decompression of its
stored frames on all cores, or the plain gather of a raw cache).

    python benchmarks/bench_small.py                         # today's layout
    python benchmarks/bench_small.py --packs 1,64            # one cache per build.pack value, same rounds
    python benchmarks/bench_small.py --set build.level=3 --label level3
    python benchmarks/bench_small.py --old /tmp/before --datasets tokens   # A/B: our reader, this tree vs another
    python benchmarks/bench_small.py --datasets tokens --set build.share=65536 --view mix=auto   # pooled reads

With ``--old DIR`` (a checkout of the code before a change: ``git worktree add DIR <commit>``), our
reader runs in a fresh process per measurement, this tree's code and ``DIR``'s alternately in every
round (same caches, built by this tree), and the table adds new / old per case: the median of the
per-round ratios (each round's pair ran back to back) and the load average at each round's start.

Appends a table to benchmarks/RESULTS.md (not in quick mode, ``BENCH_QUICK=1``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).parent))
import peers  # noqa: E402
import small_data  # noqa: E402
from _results import append, quick, quick_defaults  # noqa: E402

from cachebuild import build  # noqa: E402
from cachebuild.errors import ConfigError  # noqa: E402
from cachebuild.format import read_manifest  # noqa: E402
from loaders import ShardStream, make_loader  # noqa: E402

CODECS = ("zstd", "none")
HERE = Path(__file__).resolve().parent
OLD = " old"
"""Suffix of a case measured with ``--old``'s code (its partner without it: this tree's, in a fresh process too)."""

_CHILD = r"""
import json, os, sys
from pathlib import Path
import bench_small
d = bench_small.ours_rate(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), json.loads(sys.argv[6]))
print("RESULT " + json.dumps(d), flush=True)
os._exit(0)  # (skip interpreter shutdown after the workers were stopped, as bench_decode's children do)
"""


@dataclass
class Config:
    """One way of building the caches: a label and its ``--set`` overrides."""

    label: str
    overrides: list[str]
    pack: int | None = None
    note: str = ""
    caches: dict[tuple[str, str], Path] = field(default_factory=dict)  # (dataset, codec) -> cache


def configs(sets: list[str], label: str, packs: str) -> list[Config]:
    """The configurations to build: one, or one per ``--packs`` value (overrides + ``build.pack=N``)."""
    bad = [s for s in sets if s.split("=", 1)[0].strip() == "build.codec"]
    if bad:
        raise SystemExit(f"error: --set {bad[0]}: the codec is varied by the benchmark itself (zstd and none); use --codecs")
    if not packs:
        return [Config(label or "default", list(sets))]
    out = []
    for p in packs.split(","):
        try:
            n = int(p)
        except ValueError:
            raise SystemExit(f"error: --packs {packs}: {p!r} is not a whole number") from None
        out.append(Config(f"{label} pack={n}".strip(), [*sets, f"build.pack={n}"], n))
    return out


def _unknown_pack(exc: ConfigError) -> bool:
    return "build.pack" in str(exc) and "unknown" in str(exc)


def build_config(cfg: Config, datasets: list[str], codecs: list[str], records: int, shard_mb: float, root: Path) -> bool:
    """Build every (dataset, codec) cache of ``cfg`` under ``root``; False when the code does not accept ``build.pack``."""
    slug = cfg.label.replace(" ", "_").replace("=", "")
    for ds in datasets:
        for codec in codecs:
            out = root / slug / f"{ds}-{codec}"
            sets = [s for s in cfg.overrides if codec == "zstd" or not s.startswith(("build.level=", "build.share="))]  # (zstd-only settings)
            try:
                build(small_data.recipe(ds, records, codec, shard_mb), out, overrides=sets, progress=False, overwrite=True)
            except ConfigError as exc:
                if not (cfg.pack is not None and _unknown_pack(exc)):
                    raise
                if cfg.pack != 1:
                    print(f"{cfg.label}: skipped, this code does not accept build.pack ({exc})", flush=True)
                    return False
                cfg.overrides = [s for s in cfg.overrides if not s.startswith("build.pack=")]
                cfg.note = "build.pack is not known to this code: today's layout (one member per field of each record), built without the key"
                print(f"{cfg.label}: {cfg.note}", flush=True)
                return build_config(cfg, datasets, codecs, records, shard_mb, root)
            cfg.caches[(ds, codec)] = out
            print(f"built {cfg.label} {ds} {codec}: {out}", flush=True)
    return True


def ours_disk_bytes(cache: Path) -> int:
    """Bytes on disk of a cache: every shard's tar and index (named by the manifest) + manifest.json."""
    m = read_manifest(cache)
    return (cache / "manifest.json").stat().st_size + sum((cache / s.name).stat().st_size + (cache / s.index).stat().st_size for s in m.shards)


def dir_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (a LitData output: chunks + index.json)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def ours_rate(cache: Path, workers: int, batch: int, limit_s: float, per_record: float, view_options: dict | None = None) -> dict:
    """Samples/s of ``ShardStream(view="records", **view_options)`` + ``make_loader`` (shuffle on), timed as the peers are."""

    def make():
        return make_loader(ShardStream(cache, view="records", batch_size=batch, seed=0, **(view_options or {})), num_workers=workers)

    def count(b) -> tuple[int, int]:
        real = int((~b["is_pad"]).sum())
        return real, int(real * per_record)

    m = peers._measure(make, count, limit_s, peers._warmup(workers))
    return {"samples_per_s": m["items_per_s"], "payload_mb_per_s": m["mb_per_s"], "first_batch_s": m["first_batch_s"], "epochs_restarted": m["epochs_restarted"]}


def ours_rate_in(tree: Path, cache: Path, workers: int, batch: int, limit_s: float, per_record: float, view_options: dict | None = None) -> dict:
    """:func:`ours_rate` in a fresh process that imports cachebuild and loaders from ``tree`` ({} if it failed)."""
    env = dict(os.environ, PYTHONPATH=f"{tree}:{HERE}")
    try:
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(cache), str(workers), str(batch), str(limit_s), str(per_record), json.dumps(view_options or {})],
            env=env,
            cwd=tree,
            capture_output=True,
            text=True,
            check=False,
            timeout=limit_s + 120,
        )
    except subprocess.TimeoutExpired:
        print(f"  {cache.name} w{workers} in {tree}: no result in {limit_s + 120:.0f} s", flush=True)
        return {}
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if not line:
        print(f"  {cache.name} w{workers} in {tree} failed:\n{out.stderr[-2000:]}", flush=True)
        return {}
    return dict(json.loads(line[-1][7:]))


def rate_of(d: dict) -> float:
    """The samples/s of a peer's or our result (LitData names its unit after the data)."""
    for key in ("samples_per_s", "graphs_per_s", "graphs_per_s_all"):
        if key in d:
            return float(d[key])
    return float("nan")


Case = tuple[str, Callable[[float], dict]]
"""A reader to measure: its name and a function of the seconds to measure it for."""


def run_rounds(cases: list[Case], rounds: int, seconds: float, loads: list[float] | None = None) -> dict[str, list[float]]:
    """Every case once per round, the order reversed every other round; samples/s per case and round
    (``loads``, when given, gets the 1-minute load average at each round's start).

    First, one short unrecorded run of our reader and of LitData's, so that no
    recorded case pays the process's one-time costs (first DataLoader, first
    torch ops).
    """
    for lit in (True, False):
        warm = next((fn for name, fn in cases if ("litdata" in name) == lit), None)
        if warm is not None:
            warm(min(seconds, 0.5))
    runs: dict[str, list[float]] = {}
    for r in range(rounds):
        if loads is not None:
            loads.append(os.getloadavg()[0])
        for name, fn in cases if r % 2 == 0 else cases[::-1]:
            v = rate_of(fn(seconds))
            runs.setdefault(name, []).append(v)
            print(f"round {r} {name}: {v:,.0f} samples/s", flush=True)
    return runs


def litdata_sets(datasets: list[str], first: Config, root: Path) -> dict[str, Path]:
    """LitData zstd of each dataset's records (those of ``first``'s zstd cache, remade from the seeds)."""
    if not (peers.installed("litdata") and peers.installed("zstd")):
        return {}
    out = {}
    for ds in datasets:
        tasks = small_data.block_tasks(first.caches[(ds, "zstd")])
        out[ds] = peers.litdata_optimize(small_data.litdata_samples, tasks, root / f"litdata-{ds}", "zstd")
        print(f"litdata optimize {ds}: {out[ds]}", flush=True)
    return out


def limits(cfgs: list[Config], cores: int, sample: int) -> dict[str, str]:
    """Per cache, ``peers.decompression_limit`` in samples/s (or why it could not be measured)."""
    out = {}
    for cfg in cfgs:
        for (ds, codec), cache in cfg.caches.items():
            try:
                d = peers.decompression_limit(cache, cores, sample_graphs=sample)
                out[f"{ds} {cfg.label} {codec}"] = f"{d['graphs_per_s_all']:,.0f} samples/s ({d['mb_per_s_all']:,.0f} MB/s of arrays, {d['all_method']})"
            except Exception as exc:  # a format this helper does not read (yet): say so, measure the rest
                out[f"{ds} {cfg.label} {codec}"] = f"n/a ({type(exc).__name__}: {exc})"
            print(f"limit {ds} {cfg.label} {codec}: {out[f'{ds} {cfg.label} {codec}']}", flush=True)
    return out


def _fmt_runs(v: list[float]) -> str:
    return f"{statistics.median(v):,.0f} samples/s ({', '.join(f'{x:,.0f}' for x in v)})"


def storage_rows(cfgs: list[Config], datasets: list[str], payload: dict[tuple[str, str, str], tuple[int, int]], lit: dict[str, Path], lit_payload: dict[str, int]) -> list[tuple[str, str]]:
    """Stored ratio (payload / bytes on disk) of each cache and of LitData; the target for zstd."""
    rows = []
    for ds in datasets:
        lit_ratio = float("nan")
        if ds in lit:
            lit_ratio = lit_payload[ds] / dir_bytes(lit[ds])
            rows.append((f"stored {ds}: LitData zstd", f"ratio {lit_ratio:.2f} ({lit_payload[ds] / 1e6:.1f} MB payload / {dir_bytes(lit[ds]) / 1e6:.1f} MB)"))
        for cfg in cfgs:
            for (d, codec), cache in cfg.caches.items():
                if d != ds:
                    continue
                n, p = payload[(cfg.label, d, codec)]
                disk = ours_disk_bytes(cache)
                extra = "; target >= 1.2" if codec == "zstd" else ""
                extra += f"; {p / disk / lit_ratio:.2f}x LitData's" if codec == "zstd" and ds in lit else ""
                rows.append((f"stored {ds}: ours {cfg.label} {codec}", f"ratio {p / disk:.2f} ({p / 1e6:.1f} MB payload, {p / n:,.0f} B/record / {disk / 1e6:.1f} MB{extra})"))
    return rows


def speed_rows(cfgs: list[Config], runs: dict[str, list[float]], datasets: list[str], workers: list[int]) -> list[tuple[str, str]]:
    """Medians of every case, then ours / LitData: at the same workers (LitData's default decoding),
    and best of ours / best of LitData (any workers, ``batch_decode`` auto or False)."""
    rows = [(f"read {name}", _fmt_runs(v)) for name, v in runs.items()]
    med = {k: statistics.median(v) for k, v in runs.items() if not k.endswith(OLD)}
    for ds in datasets:
        if any(f"{ds} litdata zstd w{w}" not in med for w in workers):
            continue
        lit = {w: med[f"{ds} litdata zstd w{w}"] for w in workers}
        lit_best = max(v for k, v in med.items() if k.startswith(f"{ds} litdata zstd "))  # batch_decode=False too
        for cfg in cfgs:
            for codec in CODECS:
                ours = {w: med.get(f"{ds} {cfg.label} {codec} w{w}") for w in workers}
                if None in ours.values():
                    continue
                per_w = ", ".join(f"w{w} {ours[w] / lit[w]:.2f}x" for w in workers)
                best = max(ours.values()) / lit_best
                target = " (target >= 3x)" if codec == "zstd" else ""
                rows.append((f"speed {ds}: ours {cfg.label} {codec} / LitData zstd", f"{per_w}; best / best {best:.2f}x{target}"))
    return rows


def ab_rows(runs: dict[str, list[float]]) -> list[tuple[str, str]]:
    """``--old``: this tree / the old tree per case, the median of per-round ratios (each round's two runs were neighbours)."""
    rows = []
    for name, old in runs.items():
        if not name.endswith(OLD) or name[: -len(OLD)] not in runs:
            continue
        new = runs[name[: -len(OLD)]]
        ratios = [n / o for n, o in zip(new, old) if o > 0]
        if ratios:
            rows.append(
                (
                    f"A/B {name[: -len(OLD)]}: new / old",
                    f"{statistics.median(ratios):.2f}x (rounds {', '.join(f'{x:.2f}' for x in ratios)}; new {statistics.median(new):,.0f}, old {statistics.median(old):,.0f} samples/s)",
                )
            )
    return rows


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=50_000, help="records per dataset")
    ap.add_argument("--datasets", default=",".join(small_data.DATASETS), help=f"comma-separated, of {', '.join(small_data.DATASETS)}")
    ap.add_argument("--codecs", default=",".join(CODECS), help="our codecs to build (zstd, none)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help="recipe override for every build (repeatable), e.g. build.level=3")
    ap.add_argument("--label", default="", help="name of this configuration in the table")
    ap.add_argument("--packs", default="", help="comma-separated build.pack values: one configuration (caches) per value")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="measured seconds per reader and round")
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--shard-mb", type=float, default=64, help="our build.shard_mb (LitData's chunk_bytes is 64MB)")
    ap.add_argument("--limit-records", type=int, default=20_000, help="records per cache for the decompression limit")
    ap.add_argument("--root", type=Path, default=Path("/dev/shm/cachebuild-bench-small"))
    ap.add_argument("--old", type=Path, default=None, help="checkout of the code before a change: our reader A/B, this tree vs that one, in fresh processes")
    ap.add_argument(
        "--view",
        dest="views",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="option of our records view (repeatable), e.g. mix=auto (pooled reads, for caches built with --set build.share=65536)",
    )
    ap.add_argument("--skip-litdata", action="store_true")
    ap.add_argument("--litdata-per-sample", action=argparse.BooleanOptionalAction, default=True, help="also LitData with workers and batch_decode=False")
    quick_defaults(ap, records=600, rounds=1, seconds=0.3, limit_records=300, root=Path("/dev/shm/cachebuild-bench-small-quick"))
    return ap.parse_args()


def view_options(pairs: list[str]) -> dict:
    """``--view KEY=VALUE`` pairs as keyword arguments: whole numbers as ints, ``None``/``true``/``false`` as such, else strings."""
    out: dict = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"error: --view {pair!r}: expected KEY=VALUE, e.g. mix=auto")
        v = value.strip()
        out[key.strip()] = int(v) if v.lstrip("-").isdigit() else {"None": None, "true": True, "false": False}.get(v, v)
    return out


def _cases(
    cfgs: list[Config], lit: dict[str, Path], payload: dict, datasets: list[str], workers: list[int], batch: int, per_sample: bool, old: Path | None = None, opts: dict | None = None
) -> list[Case]:
    """Our reader on every cache and LitData on every dataset, at each worker count, grouped by dataset;
    with ``per_sample``, LitData with workers also with ``batch_decode=False`` (no window re-decoding);
    with ``old``, our reader in fresh processes, this tree's and ``old``'s next to each other."""
    cases: list[Case] = []
    for ds in datasets:
        for w in workers:
            for cfg in cfgs:
                for (d, codec), cache in cfg.caches.items():
                    if d == ds:
                        n, p = payload[(cfg.label, ds, codec)]
                        name = f"{ds} {cfg.label} {codec} w{w}"
                        if old is None:
                            cases.append((name, lambda s, c=cache, w=w, per=p / n: ours_rate(c, w, batch, s, per, opts)))
                            continue
                        for tree, suffix in ((HERE.parent, ""), (old, OLD)):
                            cases.append((name + suffix, lambda s, t=tree, c=cache, w=w, per=p / n: ours_rate_in(t, c, w, batch, s, per, opts)))
            if ds in lit:
                cases.append((f"{ds} litdata zstd w{w}", lambda s, o=lit[ds], w=w: peers.litdata_rate(o, w, batch, s)))
                if per_sample and w > 0:
                    cases.append((f"{ds} litdata zstd w{w} batch_decode=False", lambda s, o=lit[ds], w=w: peers.litdata_rate(o, w, batch, s, batch_decode=False)))
    return cases


def main() -> None:
    args = parse_args()
    t0, load0 = time.time(), os.getloadavg()
    datasets, codecs = args.datasets.split(","), args.codecs.split(",")
    workers = [int(w) for w in args.workers.split(",")]
    bad = sorted(set(datasets) - set(small_data.DATASETS)) + sorted(set(codecs) - set(CODECS))
    if bad:
        raise SystemExit(f"error: unknown dataset or codec {bad[0]!r} (datasets: {', '.join(small_data.DATASETS)}; codecs: {', '.join(CODECS)})")
    if args.old is not None and not all((args.old / pkg / "__init__.py").is_file() for pkg in ("cachebuild", "loaders")):
        raise SystemExit(f"error: --old {args.old}: not a checkout of this project (no cachebuild/ and loaders/ packages there)")
    shutil.rmtree(args.root, ignore_errors=True)
    try:
        _run(args, datasets, codecs, workers, t0, load0)
    except ConfigError as exc:  # a bad --set or recipe value: one line, as the CLI says it
        raise SystemExit(f"error: {exc}") from None
    finally:
        shutil.rmtree(args.root, ignore_errors=True)


def _run(args: argparse.Namespace, datasets: list[str], codecs: list[str], workers: list[int], t0: float, load0: tuple[float, ...]) -> None:
    from joblib.externals.loky import get_reusable_executor

    all_cfgs = configs(args.sets, args.label, args.packs)
    cfgs = [c for c in all_cfgs if build_config(c, datasets, codecs, args.records, args.shard_mb, args.root)]
    get_reusable_executor().shutdown(wait=True)  # no pool threads left when DataLoader workers fork
    if not cfgs:
        raise SystemExit("error: no configuration could be built (see the messages above)")
    payload = {(c.label, ds, codec): small_data.payload_bytes(cache) for c in cfgs for (ds, codec), cache in c.caches.items()}
    lit = {} if args.skip_litdata else litdata_sets(datasets, cfgs[0], args.root) if "zstd" in codecs else {}
    lit_payload = {ds: payload[(cfgs[0].label, ds, "zstd")][1] for ds in lit}
    t_build = time.time() - t0
    loads: list[float] = []
    opts = view_options(args.views)
    runs = run_rounds(_cases(cfgs, lit, payload, datasets, workers, args.batch, args.litdata_per_sample, args.old, opts), args.rounds, args.seconds, loads)
    lim = limits(cfgs, os.cpu_count() or 1, args.limit_records)
    rows = storage_rows(cfgs, datasets, payload, lit, lit_payload) + speed_rows(cfgs, runs, datasets, workers) + ab_rows(runs)
    rows += [(f"limit {k}", v) for k, v in lim.items()]
    skipped = [c.label for c in all_cfgs if c not in cfgs]
    notes = [
        f"{args.records:,} records per dataset (mel, mel_meta: one [32, 32] float16 log-mel segment + int16 label (+ JSON); tokens: int32 of 50..500), seed 0, shard_mb {args.shard_mb:g}, in {args.root}",
        "stored ratio = payload (arrays' nbytes + compact JSON text) / bytes on disk (ours: shard tars + indexes + manifest.json; LitData: chunks + index.json)",
        f"read: batch {args.batch}, shuffle on, {args.seconds:g} s per reader after warm-up, {args.rounds} interleaved rounds, medians (runs in brackets); "
        "ours = ShardStream(view='records') + make_loader (ragged fields padded to the cache max, with masks; JSON not batched); "
        "LitData = StreamingDataset + StreamingDataLoader (batch_decode='auto' unless it says False, pad_collate to the batch max; its JSON string decoded, not batched); "
        "ours / LitData: at the same workers (LitData's default decoding), and best of ours over best of LitData's runs",
        *[f"{c.label}: {c.note}" for c in cfgs if c.note],
        *[f"{s}: skipped, build.pack is not accepted by this code" for s in skipped],
        f"--set {' '.join(args.sets)}" if args.sets else "no --set overrides",
        f"our view's options: {opts} (--view)" if opts else "our view's defaults (no --view)",
        *([f"--old {args.old}: our reader in a fresh process per run, this tree (no suffix) and the old tree ('old') alternately; A/B = median of per-round new/old ratios"] if args.old else []),
        f"load average (1 min) at each round's start: {', '.join(f'{x:.1f}' for x in loads)}",
        f"total {time.time() - t0:.0f} s ({t_build:.0f} s building); load average at start {tuple(round(x, 2) for x in load0)}, "
        f"at end {tuple(round(x, 2) for x in os.getloadavg())} ({os.cpu_count()} cores shared with other processes)",
    ]
    title = "bench_small: small records (issue 15, item 2), stored ratio and samples/s vs LitData"
    append(title + (f" [{args.label}]" if args.label else ""), rows, notes)
    if quick():
        print(f"(quick mode: {len(runs)} readers measured)")


if __name__ == "__main__":
    main()
