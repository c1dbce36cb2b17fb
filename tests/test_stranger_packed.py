"""A stranger's cache in the packed layout (format v3): edits an attacker or a broken copy makes
to a packed shard's manifest entry, its compressed index and its entries are refused with one
clear line, in bounded memory, by every reader (tar headers and JSON Lines:
``test_stranger_tar.py``).

Found by mutating small packed caches field by field (the manifest's shard entries, the
``.idx.npy.zst`` frame, index entries, tar headers, group ``.npy`` headers, JSON Lines and the
zstd frames inside a group; docs/DECISIONS.md, "A stranger's packed cache"). The cases here are
the ones that were not refused cleanly before. Each edit recomputes the manifest's sizes and
sha256 where it must get past them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hostile_fixtures import rehash, save_doc
from stranger_fixtures import ROOT, copy_packed, frame_declaring, loader_error, read_packed_index, write_packed_index
from stranger_fixtures import packed  # noqa: F401  (a fixture, used by name)


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
    root, doc = copy_packed(packed["zstd"], tmp_path / "c")
    (root / doc["shards"][0]["index"]).write_bytes(frame_declaring(8 << 30))
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

    root, doc = copy_packed(packed["zstd"], tmp_path / "c")
    doc["shards"][1][key] = value
    save_doc(root, doc)
    with pytest.raises(ManifestError, match=rf"shards\[1\]\.{key} = {value!r}, but a packed shard"):
        read_manifest(root)


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_a_shrunk_shape_inside_a_packed_member_is_refused_by_the_loader(packed: dict[str, Path], tmp_path: Path, codec: str) -> None:
    """Record 9 is inside its group (records 7..13): its entry holds its data and nothing else (no
    ``.npy`` header), so an index that says one token fewer than the entry holds is corrupt. The
    loader took the entry's last bytes as the record (one token silently dropped; only ``verify``'s
    header pass said so)."""
    root, doc = copy_packed(packed[codec], tmp_path / "c")
    index = read_packed_index(root, doc, 0)
    j = list(doc["fields"]).index("tokens")
    index[9, j]["shape"][0] -= 1
    index[9, j]["nbytes"] -= 4
    write_packed_index(root, doc, 0, index)
    save_doc(root, doc)
    msg = loader_error(root)
    assert "record 0000000009, field 'tokens'" in msg and "\n" not in msg, msg


def test_a_frame_longer_than_its_packed_entry_is_refused_by_the_loader(packed: dict[str, Path], tmp_path: Path) -> None:
    """A frame inside a group that decodes to 8 bytes more than the index's ``nbytes`` (so the data
    read is shifted by 8 bytes) is refused, not decoded."""
    import io

    import zstandard

    from cachebuild.format.tarball import END_OF_ARCHIVE, padding, tar_header

    root, doc = copy_packed(packed["zstd"], tmp_path / "c")
    index, j = read_packed_index(root, doc, 0), list(doc["fields"]).index("seg")
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
    write_packed_index(root, doc, 0, index)
    save_doc(root, doc)
    msg = loader_error(root)
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

    root, doc = copy_packed(packed["zstd"], tmp_path / "c")
    path = root / doc["shards"][0]["index"]
    data = index_bytes(read_packed_index(root, doc, 0))
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

    root, doc = copy_packed(packed["zstd"], tmp_path / "c")  # (a raw cache's members are bounded by its shards' sizes too)
    doc["fields"]["tokens"][key] = value
    save_doc(root, doc)
    faults = verify_cache(root).faults
    assert len(faults) == 1 and f"fields.tokens.{key} = {value}, but its records'" in faults[0] and "manifest.json" in faults[0], faults


_APPEND = textwrap.dedent(
    """
    import resource, sys
    from cachebuild import FunctionSource, build
    from cachebuild.errors import CacheBuildError
    from stranger_fixtures import FIELDS, block
    with open("/proc/self/status") as fh:
        vm = next(int(line.split()[1]) for line in fh if line.startswith("VmSize:")) << 10
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), vm + (1 << 30)))  # 1 GiB more than now
    try:
        build(FunctionSource.per_block(block, FIELDS), sys.argv[1], records=10, append=True, progress=False, shard_mb=0.01, backend="threading")
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

    root, doc = copy_packed(packed["zstd"], tmp_path / "c")
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


def test_a_batch_larger_than_memory_is_refused_before_allocating(packed: dict[str, Path], tmp_path: Path) -> None:
    """The loader sizes its batches by the manifest's ``max_shape`` (it cannot check it without
    every index; ``verify`` does): a claim of 2^30 tokens per record made the first batch a torch
    ``RuntimeError`` traceback (42.9 GB asked for at batch 8). A batch that cannot fit in this
    machine's memory is now one line naming the biggest key and what to do."""
    from cachebuild.errors import ConfigError
    from loaders import ShardStream

    root, doc = copy_packed(packed["zstd"], tmp_path / "c")
    doc["fields"]["tokens"]["max_shape"] = [1 << 30]
    save_doc(root, doc)
    rows = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (4 << 30) + 2  # 4 GiB a row
    with pytest.raises(ConfigError, match=r"batch_size \d+ on .* needs [\d.]+ GB per batch \(.tokens. \[\d+, 1073741824\] int32 alone: .*more than this machine.s"):
        ShardStream(root, view="records", batch_size=int(rows), shuffle=False)
