"""A stranger's packed cache, its tar and JSON Lines: what ``tar -x`` would read differently from
the index (header bytes, a hidden member, the end blocks), a JSON Lines entry without its
separator, and faults in a remote cache named by URL (see ``test_stranger_packed.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hostile_fixtures import rehash, save_doc
from stranger_fixtures import copy_packed, patch_tar, read_packed_index, with_checksum
from stranger_fixtures import packed  # noqa: F401  (a fixture, used by name)


@pytest.mark.parametrize("edit", ["checksum", "symlink", "end-blocks"])
def test_verify_refuses_tar_headers_that_tar_reads_differently(packed: dict[str, Path], tmp_path: Path, edit: str) -> None:
    """``verify`` promises a cache that ``tar -x`` reads as the loader does; it compared each member's
    name and size only, so a bad header checksum, a member turned into a symlink (its data then
    read as headers by ``tar``) or junk in the end-of-archive blocks passed."""
    from cachebuild.tools.verify import verify_cache

    root, doc = copy_packed(packed["zstd"], tmp_path / "c")
    index = read_packed_index(root, doc, 0)
    j = list(doc["fields"]).index("tokens")
    at = int(index[7, j]["offset"]) - 512  # the header of the member of records 7..13
    tar = (root / doc["shards"][0]["name"]).read_bytes()
    if edit == "checksum":
        patch_tar(root, doc, at + 148, b"000000\0 ")
        want = r"record 0000000007, field 'tokens': tar header field chksum is b'000000"
    elif edit == "symlink":
        patch_tar(root, doc, at, with_checksum(tar[at : at + 156] + b"2" + b"/etc/passwd".ljust(100, b"\0") + tar[at + 257 : at + 512]))
        want = r"record 0000000007, field 'tokens': tar header field typeflag is b'2'"
    else:
        patch_tar(root, doc, len(tar) - 1000, b"junk")
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

    root, doc = copy_packed(packed["none"], tmp_path / "c")
    index = read_packed_index(root, doc, 0)
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

    root, doc = copy_packed(packed["zstd"], tmp_path / "c")  # (in a raw cache the entry's size alone tells, at open)
    index = read_packed_index(root, doc, 0)
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


def test_a_remote_cache_fault_names_the_url_not_the_local_copy(packed: dict[str, Path], tmp_path: Path) -> None:
    """A remote shard is checked in the local fetch folder; its faults named that folder's copy
    (``index /tmp/.../52f1c5393ed5e643/shard-00000.idx.npy.zst: ...``), a path the user never gave."""
    from cachebuild.errors import ShardCorruptError
    from loaders import ShardStream
    from loaders.remote import RemoteOptions
    from remote_fixtures import serve_folder

    root, doc = copy_packed(packed["zstd"], tmp_path / "site" / "c")
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
