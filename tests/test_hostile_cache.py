"""A stranger's cache: every hostile edit is refused with one clear error, in bounded memory,
touching nothing outside the cache.

Each case copies a good toy cache, edits it as an attacker would (names, numbers, payloads,
then recomputes every size and sha256 in the manifest), and runs ``verify``, ``inspect``,
the loader with 0 and 2 workers and ``stage`` in a fresh process (for its peak RSS), forked from a
warm one that imported torch and ours once (tests/fork_runner.py).
Each must fail with a cachebuild error (no traceback, one line) whose message matches the
case; a sentinel file outside the cache stays as it was, nothing new appears beside the
cache, and the stage destination is never created. Two kinds of edit touch bytes that some
readers never interpret, and those readers may finish: JSON members (no loader view decodes
them) and a member's ``.npy`` header (the loader and ``stage`` read array data at the
index's offset as the manifest's dtype; ``verify`` and ``inspect`` check the header).
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import zlib
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest
import zstandard

from conftest import build_toy
from fork_runner import ForkServer
from cachebuild.format.codec import Codec
from hostile_fixtures import copy_cache, field_pos, load_doc, read_index, rehash, rewrite_shard, save_doc, write_index, zstd_bomb

ROOT = Path(__file__).resolve().parents[1]
ALL = ("verify", "inspect", "loader0", "loader2", "stage")
NO_JSON_READERS = ("verify", "inspect", "stage")  # the loader's views never decode JSON members
PEAK_RSS_MB = 900  # a 1 GiB bomb decoded anywhere would exceed it

RUNNER = textwrap.dedent(
    """
    import json, resource, sys, traceback
    from cachebuild.errors import CacheBuildError
    cache, dst, actions = sys.argv[1], sys.argv[2], sys.argv[3].split(",")

    def verify():
        from cachebuild.tools.verify import verify_cache
        report = verify_cache(cache)
        if report.faults:
            return report.faults[0]

    def inspect():
        from cachebuild.tools.inspect import inspect_cache
        inspect_cache(cache, 0)

    def loader(workers):
        from loaders import ShardStream, make_loader
        from loaders.loader import shutdown_workers
        stream = ShardStream(cache, view="records", batch_size=64, shuffle=False)
        if workers == 0:
            for _ in stream:
                pass
            return
        dl = make_loader(stream, num_workers=workers, multiprocessing_context="fork")
        try:
            for _ in dl:
                pass
        finally:
            shutdown_workers(dl)

    def stage():
        from cachebuild.tools.stage import stage_cache
        stage_cache(cache, dst, progress=False)

    run = {"verify": verify, "inspect": inspect, "loader0": lambda: loader(0), "loader2": lambda: loader(2), "stage": stage}
    for name in actions:
        try:
            fault = run[name]()
            out = {"action": name, "error": None} if fault is None else {"action": name, "error": "fault", "message": fault}
        except CacheBuildError as exc:
            out = {"action": name, "error": type(exc).__name__, "message": str(exc)}
        except BaseException as exc:
            out = {"action": name, "error": "UNEXPECTED " + type(exc).__name__, "message": traceback.format_exc()}
        print(json.dumps(out), flush=True)
    # This process's own peak from VmHWM (its memory since the fork, from the warm server's RSS then, about
    # 300 MB): ru_maxrss of RUSAGE_SELF would keep the peak of a process it was exec'd from (Linux carries
    # it over exec), such as the whole pytest run.
    own = next((int(ln.split()[1]) // 1024 for ln in open("/proc/self/status") if ln.startswith("VmHWM:")), None)
    rss = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 if own is None else own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024]
    print(json.dumps({"peak_mb": max(rss)}), flush=True)
    """
)


# ---- the edits (root, manifest doc, folder outside the cache holding a sentinel)


def traversal_shard(root: Path, doc: dict, outside: Path) -> None:
    doc["shards"][0]["name"] = "../outside/victim.tar"


def absolute_shard(root: Path, doc: dict, outside: Path) -> None:
    doc["shards"][0]["name"] = str(outside / "victim.tar")


def traversal_index(root: Path, doc: dict, outside: Path) -> None:
    doc["shards"][1]["index"] = "../outside/victim.idx.npy"


def absolute_index(root: Path, doc: dict, outside: Path) -> None:
    doc["shards"][0]["index"] = str(outside / "victim.idx.npy")


def _edit_entry(key: str, value: int, field: str = "mat", record: int = 0) -> callable:
    def edit(root: Path, doc: dict, outside: Path) -> None:
        index = read_index(root, doc, 0)
        index[record, field_pos(doc, field)][key] = value
        write_index(root, doc, 0, index)

    return edit


def object_dtype_manifest(root: Path, doc: dict, outside: Path) -> None:
    doc["fields"]["mat"]["dtype"] = "|O"


def object_npy_header(root: Path, doc: dict, outside: Path) -> None:
    """Raw cache: record 0's ``vec`` header says ``|O`` (same length), hashes recomputed."""
    e = doc["shards"][0]
    index = read_index(root, doc, 0)
    ent = index[0, field_pos(doc, "vec")]
    tar = bytearray((root / e["name"]).read_bytes())
    off = int(ent["offset"])
    header = bytes(tar[off : off + int(ent["size"]) - int(ent["nbytes"])])
    assert b"'<f8'" in header
    tar[off : off + len(header)] = header.replace(b"'<f8'", b"'|O' ")
    (root / e["name"]).write_bytes(bytes(tar))
    index[0, field_pos(doc, "vec")]["crc32"] = zlib.crc32(bytes(tar[off : off + int(ent["size"])]))
    write_index(root, doc, 0, index)


def bomb_in_array(root: Path, doc: dict, outside: Path) -> None:
    rewrite_shard(root, doc, 0, {(0, field_pos(doc, "mat")): zstd_bomb(1 << 30)})


def bomb_in_json(root: Path, doc: dict, outside: Path) -> None:
    rewrite_shard(root, doc, 0, {(0, field_pos(doc, "json")): zstd_bomb(1 << 30)})


def deep_json(root: Path, doc: dict, outside: Path) -> None:
    text = b"[" * 200_000 + b"]" * 200_000
    payload = zstandard.ZstdCompressor(write_content_size=True, write_checksum=True).compress(text)
    j = field_pos(doc, "json")
    rewrite_shard(root, doc, 0, {(0, j): payload})
    index = read_index(root, doc, 0)
    index[0, j]["nbytes"] = len(text)
    write_index(root, doc, 0, index)


def huge_records(root: Path, doc: dict, outside: Path) -> None:
    doc["shards"][0]["records"] = 10**15
    doc["records"] = sum(s["records"] for s in doc["shards"])


def huge_max_shape(root: Path, doc: dict, outside: Path) -> None:
    doc["fields"]["mat"]["max_shape"] = [10**9, 10**9]


def float_records(root: Path, doc: dict, outside: Path) -> None:
    doc["shards"][0]["records"] = float(doc["shards"][0]["records"])


def huge_bytes(root: Path, doc: dict, outside: Path) -> None:
    doc["shards"][0]["bytes"] = 10**20


def swapped_shards(root: Path, doc: dict, outside: Path) -> None:
    a, b = doc["shards"][0], doc["shards"][1]
    keys = ("name", "index", "bytes", "sha256", "index_sha256", "raw_bytes", "index_bytes")
    for k in keys:
        a[k], b[k] = b[k], a[k]
    a["records"], b["records"] = b["records"], a["records"]
    b["first_record"] = a["records"]


def _link_outside(key: str, shard: int) -> callable:
    """Shard ``shard``'s tar or index replaced by a symbolic link to an exact copy outside the
    cache: every size and hash still matches, so only the link itself can be refused."""

    def edit(root: Path, doc: dict, outside: Path) -> None:
        name = doc["shards"][shard][key]
        victim = outside / ("victim.tar" if key == "name" else "victim.idx.npy")
        victim.write_bytes((root / name).read_bytes())
        (root / name).unlink()
        (root / name).symlink_to(victim)

    return edit


def fifo_index(root: Path, doc: dict, outside: Path) -> None:
    name = doc["shards"][0]["index"]
    (root / name).unlink()
    os.mkfifo(root / name)


CASES = [
    # id, codec, edit, expected message (regex), actions that must fail
    ("symlink-shard-outside", "zstd", _link_outside("name", 0), r"shard-00000\.tar is a symbolic link to .*outside/victim\.tar, outside the cache", ALL),
    ("symlink-index-outside", "raw", _link_outside("index", 0), r"shard-00000\.idx\.npy(\.zst)? is a symbolic link to .*outside/victim\.idx\.npy, outside the cache", ALL),
    ("fifo-index", "zstd", fifo_index, r"shard-00000\.idx\.npy(\.zst)?(: 0 bytes, manifest says| is not a regular file)", ALL),
    ("traversal-shard", "zstd", traversal_shard, r"shards\[0\]\.name = '\.\./outside/victim\.tar' is not a plain file name", ALL),
    ("absolute-shard", "zstd", absolute_shard, r"shards\[0\]\.name = '/.*victim\.tar' is not a plain file name", ALL),
    ("traversal-index", "zstd", traversal_index, r"shards\[1\]\.index = '\.\./outside/victim\.idx\.npy' is not a plain file name", ALL),
    ("absolute-index", "raw", absolute_index, r"shards\[0\]\.index = '/.*' is not a plain file name", ALL),
    ("negative-offset", "raw", _edit_entry("offset", -4096), r"record 0000000000, field 'mat': corrupt index entry: payload offset before", ALL),
    ("huge-offset", "zstd", _edit_entry("offset", 1 << 62), r"record 0000000000, field 'mat': corrupt index entry: payload lies past the end", ALL),
    ("huge-size", "raw", _edit_entry("size", 1 << 62, "vec", 3), r"record 0000000003, field 'vec': corrupt index entry: raw payload size", ALL),
    ("negative-size", "zstd", _edit_entry("size", -1, "ident", 2), r"record 0000000002, field 'ident': corrupt index entry: negative payload size", ALL),
    ("huge-nbytes", "zstd", _edit_entry("nbytes", 1 << 40, "json", 1), r"record 0000000001, field 'json': corrupt index entry: JSON length", ALL),
    ("object-dtype-manifest", "zstd", object_dtype_manifest, r"fields\.mat\.dtype = '\|O' is not an allowed dtype", ALL),
    ("object-npy-header", "raw", object_npy_header, r"record 0000000000, field 'vec': \.npy header says dtype \|O", ("verify", "inspect")),
    ("bomb-array", "zstd", bomb_in_array, r"record 0000000000, field 'mat': zstd frame declares 1073741824 bytes.*decompression bomb", ALL),
    ("bomb-json", "zstd", bomb_in_json, r"record 0000000000, field 'json': zstd frame declares 1073741824 bytes.*decompression bomb", NO_JSON_READERS),
    ("deep-json", "zstd", deep_json, r"record 0000000000, field 'json': JSON nested 200000 levels deep", NO_JSON_READERS),
    ("huge-records", "zstd", huge_records, r"shards\[0\]\.records = 1000000000000000 is not a whole number in", ALL),
    ("huge-max-shape", "zstd", huge_max_shape, r"fields\.mat\.max_shape = \[1000000000, 1000000000\]", ALL),
    ("float-records", "raw", float_records, r"shards\[0\]\.records = \d+\.0 is not a whole number", ALL),
    ("huge-bytes", "zstd", huge_bytes, r"shards\[0\]\.bytes = 100000000000000000000 is not a whole number", ALL),
    ("swapped-shards", "zstd", swapped_shards, r"shard shard-00001\.tar, record 0000000000, field 'mat': tar member is '00000000\d\d\.mat\.npy\.zst'.*swapped", ALL),
]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("hostile-good")
    return {
        "zstd": build_toy(base / "zstd", records=200, shard_bytes=20_000) and base / "zstd",
        "raw": build_toy(base / "raw", records=200, shard_bytes=20_000, codec=Codec("none", 0)) and base / "raw",
    }


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def runner() -> Iterator[Callable[[list[str], float], dict]]:
    """Runs :data:`RUNNER` in a fresh process forked from one warm one (tests/fork_runner.py): a new
    interpreter per case paid Python's start and torch's import each time (24 cases, ~1.6 s each)."""
    server = ForkServer(dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}"))
    try:
        yield lambda argv, timeout: server.request(code=RUNNER, argv=argv, timeout=timeout)
    finally:
        server.close()


def _run(runner: Callable[[list[str], float], dict], cache: Path, dst: Path, actions: tuple[str, ...]) -> tuple[dict[str, dict], int]:
    r = runner([str(cache), str(dst), ",".join(actions)], 240)
    lines = [json.loads(ln) for ln in r["stdout"].splitlines() if ln.startswith("{")]
    assert r["rc"] == 0 and lines and "peak_mb" in lines[-1], f"runner failed ({r['rc']}):\n{r['stdout']}\n{r['stderr'][-4000:]}"
    return {d["action"]: d for d in lines[:-1]}, lines[-1]["peak_mb"]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case,codec,edit,pattern,failing", CASES, ids=[c[0] for c in CASES])
def test_hostile_cache_is_refused_clearly(tmp_path, good, runner, case, codec, edit, pattern, failing):
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("victim.tar", "victim.idx.npy", "sentinel"):
        (outside / name).write_bytes(b"do not touch " * 100)
    root = copy_cache(good[codec], tmp_path / "cache")
    doc = load_doc(root)
    edit(root, doc, outside)
    save_doc(root, doc)
    dst = tmp_path / "staged"
    before_outside, before_tmp = _tree(outside), sorted(p.name for p in tmp_path.iterdir())

    results, peak_mb = _run(runner, root, dst, ALL)

    for action in ALL:
        res = results[action]
        if action in failing:
            assert res["error"] and not res["error"].startswith("UNEXPECTED"), f"{action}: {res}"
            assert "\n" not in res["message"] and len(res["message"]) < 600, f"{action}: not one clear line: {res['message']!r}"
            assert re.search(pattern, res["message"]), f"{action}: {res['message']!r} does not match {pattern!r}"
        else:  # readers that never decode what was tampered with: they finish, or refuse clearly
            assert res["error"] is None or not res["error"].startswith("UNEXPECTED"), f"{action}: {res}"
    assert peak_mb < PEAK_RSS_MB, f"peak RSS {peak_mb} MB"
    assert _tree(outside) == before_outside
    assert sorted(p.name for p in tmp_path.iterdir()) == before_tmp + (["staged"] if "stage" not in failing and dst.exists() else [])
    if "stage" in failing:
        assert not dst.exists()


def test_good_cache_passes_every_reader_in_the_runner(tmp_path, good, runner):
    """The runner itself: on an untouched cache every action succeeds (so refusals above mean something)."""
    results, peak_mb = _run(runner, good["zstd"], tmp_path / "staged", ALL)
    assert all(r["error"] is None for r in results.values()), results
    assert peak_mb < PEAK_RSS_MB


def test_index_checks_are_vectorised_and_name_the_first_bad_entry(good):
    from cachebuild.errors import ShardCorruptError
    from cachebuild.format import read_manifest
    from cachebuild.format.index import load_index
    from cachebuild.format.index_check import check_index

    m = read_manifest(good["raw"])
    e = m.shards[1]
    index = load_index(good["raw"] / e.index)
    check_index(index, m.fields, "none", e.records, e.name, e.first_record, e.bytes)
    bad = index.copy()
    bad[2, 0]["shape"][0] = 99  # beyond max shape 6
    bad[4, 1]["offset"] = -1
    with pytest.raises(ShardCorruptError, match=rf"record {e.first_record + 2:010d}, field 'mat': corrupt index entry: shape outside"):
        check_index(bad, m.fields, "none", e.records, e.name, e.first_record, e.bytes)
    assert np.array_equal(index, load_index(good["raw"] / e.index))


def test_flipped_bits_in_raw_array_data_are_caught_by_default(tmp_path, good):
    """The default ``verify="crc"``: any bit flipped in a raw payload's array data is an error naming the record."""
    from cachebuild.errors import ShardCorruptError
    from loaders import ShardStream

    rng = np.random.default_rng(0)
    src = good["raw"]
    doc = load_doc(src)
    for trial in range(12):
        root = copy_cache(src, tmp_path / f"flip{trial}")
        index = read_index(root, doc, 1)
        r, j = int(rng.integers(index.shape[0])), int(rng.integers(3))  # an array field: mat, vec, ident
        e = index[r, j]
        pos = int(e["offset"]) + int(e["size"]) - 1 - int(rng.integers(int(e["nbytes"])))
        tar = bytearray((root / doc["shards"][1]["name"]).read_bytes())
        tar[pos] ^= 1 << int(rng.integers(8))
        (root / doc["shards"][1]["name"]).write_bytes(bytes(tar))
        rehash(root, doc, 1)  # even with the manifest's sha256 updated
        save_doc(root, doc)
        rid = doc["shards"][1]["first_record"] + r
        with pytest.raises(ShardCorruptError, match=rf"record {rid:010d}, field '{list(doc['fields'])[j]}': crc32 mismatch"):
            for _ in ShardStream(root, view="records", batch_size=32, shuffle=False):
                pass


@pytest.mark.parametrize("key,value", [("name", "../../escape.tar"), ("index", "/etc/passwd"), ("name", "sub/shard.tar")])
def test_remote_fetcher_and_stream_refuse_traversal_names(tmp_path, good, key, value):
    """A remote manifest naming files outside the cache: refused before any shard request or local write."""
    from cachebuild.errors import ManifestError
    from loaders import ShardStream
    from loaders.remote import RemoteOptions, fetch_manifest
    from remote_fixtures import serve_folder

    root = copy_cache(good["zstd"], tmp_path / "served" / "cache")
    doc = load_doc(root)
    doc["shards"][0][key] = value
    save_doc(root, doc)
    local = tmp_path / "local"
    opts = RemoteOptions(cache_dir=str(local), cache_limit_bytes=1 << 30, timeout_s=5, retries=0)
    requests: list[str] = []
    with serve_folder(root.parent, requests) as (url, _):
        with pytest.raises(ManifestError, match=rf"shards\[0\]\.{key} = '{re.escape(value)}' is not a plain file name"):
            fetch_manifest(f"{url}/cache", opts)
        with pytest.raises(ManifestError, match=rf"shards\[0\]\.{key}"):
            ShardStream(f"{url}/cache", view="records", batch_size=8, remote=opts)
    assert requests == ["/cache/manifest.json"] * 2
    assert not local.exists() or not any(local.rglob("*.tar"))
