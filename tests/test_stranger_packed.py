"""A stranger's cache in the packed layout (format v3): edits an attacker or a broken copy makes
to a packed shard, its compressed index and its manifest are refused with one clear line, in
bounded memory, by every reader.

Found by mutating small packed caches field by field (the manifest's shard entries, the
``.idx.npy.zst`` frame, index entries, tar headers, group ``.npy`` headers, JSON Lines and the
zstd frames inside a group). The cases here are the ones that were not refused cleanly before.
Each edit recomputes the manifest's sizes and sha256 where it must get past them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cachebuild import FunctionSource, build
from hostile_fixtures import load_doc, rehash, save_doc

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {"seg": "float16", "label": "int16", "tokens": "int32", "meta": "json"}


def _block(rng: np.random.Generator, start: int, stop: int) -> dict:
    """Stacked ``seg``, a 0-d ``label``, ragged (flat) ``tokens`` and JSON Lines ``meta``."""
    n = stop - start
    lengths = rng.integers(1, 40, n)
    return {
        "seg": rng.standard_normal((n, 8, 16)).astype(np.float16),
        "label": list((np.arange(start, stop) % 7).astype(np.int16)),
        "tokens": [rng.integers(0, 1000, int(k)).astype(np.int32) for k in lengths],
        "meta": [{"id": int(i)} for i in range(start, stop)],
    }


@pytest.fixture(scope="session")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two packed caches (zstd and raw) of 40 records in 2 shards, groups of 7 (the last ones short)."""
    base = tmp_path_factory.mktemp("stranger-packed")
    out = {}
    for codec in ("zstd", "none"):
        out[codec] = base / codec
        build(FunctionSource.per_block(_block, FIELDS), out[codec], records=40, pack=7, codec=codec, progress=False, shard_mb=0.01, backend="threading")
    return out


def _copy(src: Path, dst: Path) -> tuple[Path, dict]:
    shutil.copytree(src, dst)
    return dst, load_doc(dst)


def _frame_declaring(size: int) -> bytes:
    """A tiny zstd frame whose header declares ``size`` decoded bytes and holds one (RFC 8878: magic,
    single-segment header with an 8-byte content size, one last raw block of one byte)."""
    return b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + size.to_bytes(8, "little") + bytes([0x09, 0, 0]) + b"\0"


_LIMITED = textwrap.dedent(
    """
    import resource, sys
    from cachebuild.errors import CacheBuildError
    root, what = sys.argv[1], sys.argv[2]
    with open("/proc/self/status") as fh:
        vm = next(int(line.split()[1]) for line in fh if line.startswith("VmSize:")) << 10
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), vm + (1 << 30)))  # 1 GiB more than now
    try:
        if what == "loader":
            from cachebuild.format.manifest import read_manifest
            from cachebuild.format.reader import check_shard_files
            check_shard_files(read_manifest(root), root)
        else:
            from cachebuild.format.reader import open_cache
            open_cache(root).shard(0)
    except CacheBuildError as exc:
        print("ERROR", type(exc).__name__, exc)
    """
)


def _run_limited(root: Path, what: str) -> str:
    """Open shard 0 of ``root`` in a child process that may allocate at most 1 GiB more than after start-up."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", _LIMITED, str(root), what], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.startswith("ERROR"), f"rc {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    return r.stdout.strip()


@pytest.mark.parametrize("what", ["open", "loader"])
def test_truncated_shard_with_an_index_bomb_is_bounded(packed: dict[str, Path], tmp_path: Path, what: str) -> None:
    """A truncated tar makes the reader look into the index for the first record past the end: that
    read must be bounded by the shard's records x fields, like every other index read (it allocated
    the frame's declared size: 2.1 GB for a 2 GiB frame, 8 GiB here)."""
    root, doc = _copy(packed["zstd"], tmp_path / "c")
    (root / doc["shards"][0]["index"]).write_bytes(_frame_declaring(8 << 30))
    rehash(root, doc, 0)
    tar = root / doc["shards"][0]["name"]
    tar.write_bytes(tar.read_bytes()[:-2048])  # the manifest keeps the full size
    save_doc(root, doc)
    out = _run_limited(root, what)
    assert "ShardCorruptError" in out and "bytes on disk, manifest says" in out and "truncated" in out, out


@pytest.mark.parametrize("key,value", [("index_bytes", 0), ("index_sha256", "")])
def test_packed_shard_needs_its_index_size_and_hash(packed: dict[str, Path], tmp_path: Path, key: str, value: object) -> None:
    """A packed shard's compressed index has no size to infer (an old ``.idx.npy``'s follows from its
    records), so its manifest entry must give it, and its sha256: without them the local readers
    skipped those checks while the remote fetcher failed with "connection cut?" or a sha256 mismatch."""
    from cachebuild.errors import ManifestError
    from cachebuild.format.manifest import read_manifest

    root, doc = _copy(packed["zstd"], tmp_path / "c")
    doc["shards"][1][key] = value
    save_doc(root, doc)
    with pytest.raises(ManifestError, match=rf"shards\[1\]\.{key} = {value!r}, but a packed shard"):
        read_manifest(root)


def _read_index(root: Path, doc: dict, i: int) -> np.ndarray:
    import io

    import zstandard

    return np.load(io.BytesIO(zstandard.ZstdDecompressor().decompress((root / doc["shards"][i]["index"]).read_bytes())), allow_pickle=False).copy()


def _write_index(root: Path, doc: dict, i: int, index: np.ndarray) -> None:
    from cachebuild.format.index import compress_index, index_bytes

    (root / doc["shards"][i]["index"]).write_bytes(compress_index(index_bytes(index)))
    rehash(root, doc, i)


def _loader_error(root: Path) -> str:
    """What the loader's own pass (records view, 0 workers: no header checks) says about ``root``."""
    from cachebuild.errors import ShardCorruptError
    from loaders import ShardStream

    with pytest.raises(ShardCorruptError) as info:
        for _ in ShardStream(root, view="records", batch_size=8, shuffle=False):
            pass
    return str(info.value)


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_a_shrunk_shape_inside_a_packed_member_is_refused_by_the_loader(packed: dict[str, Path], tmp_path: Path, codec: str) -> None:
    """Record 9 is inside its group (records 7..13): its entry holds its data and nothing else (no
    ``.npy`` header), so an index that says one token fewer than the entry holds is corrupt. The
    loader took the entry's last bytes as the record (one token silently dropped; only ``verify``'s
    header pass said so)."""
    root, doc = _copy(packed[codec], tmp_path / "c")
    index = _read_index(root, doc, 0)
    j = list(doc["fields"]).index("tokens")
    index[9, j]["shape"][0] -= 1
    index[9, j]["nbytes"] -= 4
    _write_index(root, doc, 0, index)
    save_doc(root, doc)
    msg = _loader_error(root)
    assert "record 0000000009, field 'tokens'" in msg and "\n" not in msg, msg


def test_a_frame_longer_than_its_packed_entry_is_refused_by_the_loader(packed: dict[str, Path], tmp_path: Path) -> None:
    """A frame inside a group that decodes to 8 bytes more than the index's ``nbytes`` (so the data
    read is shifted by 8 bytes) is refused, not decoded."""
    import io

    import zstandard

    from cachebuild.format.tarball import END_OF_ARCHIVE, padding, tar_header

    root, doc = _copy(packed["zstd"], tmp_path / "c")
    index, j = _read_index(root, doc, 0), list(doc["fields"]).index("seg")
    tar = (root / doc["shards"][0]["name"]).read_bytes()
    e = index[9, j]
    frame = zstandard.ZstdDecompressor().decompress(tar[int(e["offset"]) : int(e["offset"]) + int(e["size"])])
    longer = zstandard.ZstdCompressor(level=1, write_content_size=True, write_checksum=True).compress(frame + b"\0" * 8)
    # rebuild the member of records 7..13 with the longer frame, shifting what follows
    first, last = index[7, j], index[13, j]
    start, end = int(first["offset"]), int(last["offset"] + last["size"])
    member = tar[start : int(e["offset"])] + longer + tar[int(e["offset"] + e["size"]) : end]
    hdr = bytearray(tar_header(tar[start - 512 : start - 412].split(b"\0", 1)[0].decode(), len(member)))
    out = io.BytesIO()
    out.write(tar[: start - 512])
    out.write(bytes(hdr) + member + padding(len(member)))
    rest = tar[end + len(padding(end - start)) :]
    out.write(rest)
    grow = len(longer) - int(e["size"])
    shift = (len(member) + len(padding(len(member)))) - (end - start + len(padding(end - start)))
    index[9, j]["size"] = len(longer)
    index[10:14, j]["offset"] += grow
    later = index["offset"] > end
    index["offset"][later] += shift
    assert out.getvalue().endswith(END_OF_ARCHIVE)
    (root / doc["shards"][0]["name"]).write_bytes(out.getvalue())
    _write_index(root, doc, 0, index)
    save_doc(root, doc)
    msg = _loader_error(root)
    assert "record 0000000009, field 'seg'" in msg and "declares" in msg, msg


@pytest.mark.parametrize("tail", [b"junk", "frame"], ids=["junk", "second-frame"])
@pytest.mark.parametrize("streamed", [False, True], ids=["sized", "streamed"])
def test_bytes_after_the_index_frame_are_refused(packed: dict[str, Path], tmp_path: Path, tail: object, streamed: bool) -> None:
    """``shard-N.idx.npy.zst`` is one zstd frame: bytes after it (junk, a second frame) were ignored,
    so a file that is not what the writer wrote passed every check; it is refused like trailing
    bytes after an uncompressed ``.idx.npy``."""
    import io

    import zstandard

    from cachebuild.errors import ShardCorruptError
    from cachebuild.format.index import index_bytes
    from cachebuild.format.reader import open_cache

    root, doc = _copy(packed["zstd"], tmp_path / "c")
    path = root / doc["shards"][0]["index"]
    data = index_bytes(_read_index(root, doc, 0))
    if streamed:  # what `cat shard.idx.npy | zstd` writes: no declared size
        buf = io.BytesIO()
        with zstandard.ZstdCompressor(level=3).stream_writer(buf, closefd=False) as w:
            w.write(data)
        frame = buf.getvalue()
    else:
        frame = path.read_bytes()
    path.write_bytes(frame + (tail if isinstance(tail, bytes) else zstandard.ZstdCompressor().compress(b"x" * 100)))
    rehash(root, doc, 0)
    save_doc(root, doc)
    with pytest.raises(ShardCorruptError, match=r"idx\.npy\.zst: \d+ bytes after its zstd frame"):
        open_cache(root).index(0)


@pytest.mark.parametrize("key,value", [("max_shape", [1 << 28]), ("min_shape", [0])])
def test_verify_checks_the_manifest_shapes_against_the_records(packed: dict[str, Path], tmp_path: Path, key: str, value: list) -> None:
    """The writer's ``max_shape``/``min_shape`` are those of its records (every build and append
    computes them from the indexes); the loader's views size every batch by ``max_shape``, so a
    manifest claiming 2^28 tokens (1 GiB per row, within the member limit) made the loader zero
    gigabytes per batch while ``verify`` said ok."""
    from cachebuild.tools.verify import verify_cache

    root, doc = _copy(packed["zstd"], tmp_path / "c")  # (a raw cache's members are bounded by its shards' sizes too)
    doc["fields"]["tokens"][key] = value
    save_doc(root, doc)
    faults = verify_cache(root).faults
    assert len(faults) == 1 and f"fields.tokens.{key} = {value}, but its records'" in faults[0] and "manifest.json" in faults[0], faults


_APPEND = textwrap.dedent(
    """
    import resource, sys
    from cachebuild import FunctionSource, build
    from cachebuild.errors import CacheBuildError
    from test_stranger_packed import FIELDS, _block
    with open("/proc/self/status") as fh:
        vm = next(int(line.split()[1]) for line in fh if line.startswith("VmSize:")) << 10
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), vm + (1 << 30)))  # 1 GiB more than now
    try:
        build(FunctionSource.per_block(_block, FIELDS), sys.argv[1], records=10, append=True, progress=False, shard_mb=0.01, backend="threading")
    except CacheBuildError as exc:
        print("ERROR", type(exc).__name__, exc)
    """
)


def test_append_reads_the_old_indexes_bounded(packed: dict[str, Path], tmp_path: Path) -> None:
    """An append recomputes the field schemas from every listed shard's index: those reads are
    bounded by each shard's records x fields too (a 1.5 GiB zstd bomb as an old shard's index was
    decoded whole)."""
    import io

    import zstandard

    root, doc = _copy(packed["zstd"], tmp_path / "c")
    buf = io.BytesIO()
    with zstandard.ZstdCompressor(level=1, write_content_size=True).stream_writer(buf, size=3 << 29, closefd=False) as w:
        chunk = b"\0" * (1 << 24)
        for _ in range((3 << 29) // len(chunk)):
            w.write(chunk)
    (root / doc["shards"][0]["index"]).write_bytes(buf.getvalue())
    rehash(root, doc, 0)
    save_doc(root, doc)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", _APPEND, str(root)], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.startswith("ERROR"), f"rc {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert "shard-00000.idx.npy.zst: zstd frame declares 1610612736 bytes" in r.stdout, r.stdout


def _patch_tar(root: Path, doc: dict, at: int, data: bytes) -> None:
    tar = root / doc["shards"][0]["name"]
    b = bytearray(tar.read_bytes())
    b[at : at + len(data)] = data
    tar.write_bytes(bytes(b))
    rehash(root, doc, 0)
    save_doc(root, doc)


def _with_checksum(header: bytes) -> bytes:
    h = bytearray(header)
    h[148:156] = b"        "
    h[148:156] = f"{sum(h):06o}\0 ".encode()
    return bytes(h)


@pytest.mark.parametrize("edit", ["checksum", "symlink", "end-blocks"])
def test_verify_refuses_tar_headers_that_tar_reads_differently(packed: dict[str, Path], tmp_path: Path, edit: str) -> None:
    """``verify`` promises a cache that ``tar -x`` reads as the loader does; it compared each member's
    name and size only, so a bad header checksum, a member turned into a symlink (its data then
    read as headers by ``tar``) or junk in the end-of-archive blocks passed."""
    from cachebuild.tools.verify import verify_cache

    root, doc = _copy(packed["zstd"], tmp_path / "c")
    index = _read_index(root, doc, 0)
    j = list(doc["fields"]).index("tokens")
    at = int(index[7, j]["offset"]) - 512  # the header of the member of records 7..13
    tar = (root / doc["shards"][0]["name"]).read_bytes()
    if edit == "checksum":
        _patch_tar(root, doc, at + 148, b"000000\0 ")
        want = r"record 0000000007, field 'tokens': tar header field chksum is b'000000"
    elif edit == "symlink":
        _patch_tar(root, doc, at, _with_checksum(tar[at : at + 156] + b"2" + b"/etc/passwd".ljust(100, b"\0") + tar[at + 257 : at + 512]))
        want = r"record 0000000007, field 'tokens': tar header field typeflag is b'2'"
    else:
        _patch_tar(root, doc, len(tar) - 1000, b"junk")
        want = r"shard-00000.tar: 4 bytes that are not zero in the tar's 1024-byte end"
    faults = verify_cache(root).faults
    assert len(faults) == 1 and re.search(want, faults[0]), faults


def test_a_hidden_member_between_groups_is_refused(packed: dict[str, Path], tmp_path: Path) -> None:
    """Members lie end to end (header, data, padding), so bytes between two members are not the
    writer's: an extra member hidden there (``tar -x`` extracts it, the index skips it) is refused
    at open, where before any gap after a member was allowed."""
    from cachebuild.errors import ShardCorruptError
    from cachebuild.format.index import compress_index, index_bytes
    from cachebuild.format.reader import open_cache
    from cachebuild.format.tarball import padding, tar_header

    root, doc = _copy(packed["none"], tmp_path / "c")
    index = _read_index(root, doc, 0)
    at = int(index[7, 0]["offset"]) - 512  # where the member of records 7..13 begins
    extra = tar_header("run-me.sh", 10) + b"echo hi\n\0\0" + padding(10)
    tar = root / doc["shards"][0]["name"]
    data = tar.read_bytes()
    tar.write_bytes(data[:at] + extra + data[at:])
    index["offset"][index["offset"] > at] += len(extra)
    (root / doc["shards"][0]["index"]).write_bytes(compress_index(index_bytes(index)))
    rehash(root, doc, 0)
    save_doc(root, doc)
    with pytest.raises(ShardCorruptError, match=r"record 0000000007, field 'seg': corrupt index entry: .*gap"):
        open_cache(root).shard(0)


def test_a_json_lines_entry_without_its_separator_is_named_so(packed: dict[str, Path], tmp_path: Path) -> None:
    """A later JSON Lines entry that lost its ``\\n`` (its text still valid) was reported as "0 stray
    bytes before the JSON text (b'')": the message now says what is missing."""
    from cachebuild.format.index import compress_index, index_bytes
    from cachebuild.format.tarball import END_OF_ARCHIVE, padding, tar_header
    from cachebuild.tools.verify import verify_cache

    import zstandard

    root, doc = _copy(packed["zstd"], tmp_path / "c")  # (in a raw cache the entry's size alone tells, at open)
    index = _read_index(root, doc, 0)
    tar = (root / doc["shards"][0]["name"]).read_bytes()
    out, new = bytearray(), index.copy()
    j = list(doc["fields"]).index("meta")
    for g in range(0, len(index), 7):  # rebuild the tar, record 9's JSON entry without its "\n"
        for f in range(index.shape[1]):
            start = int(index[g, f]["offset"])
            parts = [tar[int(e["offset"]) : int(e["offset"] + e["size"])] for e in index[g : g + 7, f]]
            if f == j and g == 7:
                text = zstandard.ZstdDecompressor().decompress(parts[2])
                parts[2] = zstandard.ZstdCompressor(write_content_size=True, write_checksum=True).compress(text[1:])
            out += tar_header(tar[start - 512 : start - 412].split(b"\0", 1)[0].decode(), sum(map(len, parts)))
            for k, p in enumerate(parts):
                new[g + k, f]["offset"], new[g + k, f]["size"] = len(out), len(p)
                out += p
            out += padding(sum(map(len, parts)))
    (root / doc["shards"][0]["name"]).write_bytes(bytes(out) + END_OF_ARCHIVE)
    (root / doc["shards"][0]["index"]).write_bytes(compress_index(index_bytes(new)))
    rehash(root, doc, 0)
    save_doc(root, doc)
    faults = verify_cache(root).faults
    assert len(faults) == 1 and "record 0000000009, field 'meta': JSON Lines entry does not start with its '\\n' separator" in faults[0], faults


def test_a_batch_larger_than_memory_is_refused_before_allocating(packed: dict[str, Path], tmp_path: Path) -> None:
    """The loader sizes its batches by the manifest's ``max_shape`` (it cannot check it without
    every index; ``verify`` does): a claim of 2^30 tokens per record made the first batch a torch
    ``RuntimeError`` traceback (42.9 GB asked for at batch 8). A batch that cannot fit in this
    machine's memory is now one line naming the biggest key and what to do."""
    from cachebuild.errors import ConfigError
    from loaders import ShardStream

    root, doc = _copy(packed["zstd"], tmp_path / "c")
    doc["fields"]["tokens"]["max_shape"] = [1 << 30]
    save_doc(root, doc)
    rows = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (4 << 30) + 2  # 4 GiB a row
    with pytest.raises(ConfigError, match=r"batch_size \d+ on .* needs [\d.]+ GB per batch \(.tokens. \[\d+, 1073741824\] int32 alone: .*more than this machine.s"):
        ShardStream(root, view="records", batch_size=int(rows), shuffle=False)


def test_a_remote_cache_fault_names_the_url_not_the_local_copy(packed: dict[str, Path], tmp_path: Path) -> None:
    """A remote shard is checked in the local fetch folder; its faults named that folder's copy
    (``index /tmp/.../52f1c5393ed5e643/shard-00000.idx.npy.zst: ...``), a path the user never gave."""
    from cachebuild.errors import ShardCorruptError
    from loaders import ShardStream
    from loaders.remote import RemoteOptions
    from remote_fixtures import serve_folder

    root, doc = _copy(packed["zstd"], tmp_path / "site" / "c")
    idx = root / doc["shards"][0]["index"]
    idx.write_bytes(idx.read_bytes()[:-10])  # a truncated frame, hashes recomputed: it arrives intact
    rehash(root, doc, 0)
    save_doc(root, doc)
    fetched = tmp_path / "fetched"
    with serve_folder(tmp_path / "site") as (url, _):
        with pytest.raises(ShardCorruptError) as info:
            for _ in ShardStream(f"{url}/c", view="records", batch_size=8, shuffle=False, remote=RemoteOptions(cache_dir=str(fetched))):
                pass
    msg = str(info.value)
    assert f"index {url}/c/shard-00000.idx.npy.zst: zstd frame is truncated" in msg and str(fetched) not in msg, msg
