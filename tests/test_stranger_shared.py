"""A stranger's cache with shared frames (format v4, ``codec.share``): small entries of a packed zstd
member share one frame, every entry of it pointing at the frame, each record's data ending ``tail``
bytes before the frame's end (docs/DECISIONS.md, "Shared frames for small entries").

Every reader gives the records the plain tools give (``tarfile`` + ``zstd`` + ``np.load``:
:class:`loader_fixtures.Reference`), and the edits that would make the second data-position rule
read the wrong bytes are refused with one line naming the record and field: a shrunk shape or
``nbytes``, coinciding entries in a cache that does not share frames, a shared frame over
``codec.share``, a frame that decodes to more than its entries, a manifest that claims sharing
below format version 4, a JSON Lines separator replaced inside a shared frame.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import zstandard

from cachebuild.errors import ManifestError
from cachebuild.format.manifest import read_manifest
from cachebuild.format.reader import open_cache
from cachebuild.format.records import read_record
from cachebuild.tools.verify import verify_cache
from hostile_fixtures import save_doc
from loader_fixtures import Reference
from loaders import ShardStream
from stranger_fixtures import copy_packed, loader_error, read_packed_index, write_packed_index
from stranger_fixtures import packed  # noqa: F401  (a fixture, used by name)


def _field(doc: dict, name: str) -> int:
    return list(doc["fields"]).index(name)


def test_the_shared_cache_shares_frames_and_reads_as_the_plain_tools_do(packed: dict[str, Path]) -> None:
    root = packed["shared"]
    m = read_manifest(root)
    assert m.codec.share == 512 and json.loads((root / "manifest.json").read_text())["version"] == 4
    sh = open_cache(root)
    layout = sh.layout(0)
    assert layout.shared[:, [m.field_names.index(n) for n in ("label", "meta", "tokens")]].any(axis=0).all()
    assert (layout.lo[layout.shared] <= 512).all() and (layout.tail[~layout.shared] == 0).all()
    ref = Reference(root)
    for rid in range(m.records):
        want, got = ref.record(rid), read_record(sh, rid, strict=True)
        assert want["meta"] == got["meta"]
        for name in ("seg", "label", "tokens"):
            np.testing.assert_array_equal(want[name], got[name])
    assert verify_cache(root).ok
    from cachebuild.tools.inspect import inspect_cache

    assert any("7 records per member, small entries share frames of up to 512 bytes" in line for line in inspect_cache(root, 0))


def test_batches_of_a_shared_cache_equal_the_unshared_ones(packed: dict[str, Path]) -> None:
    """Same records, same batches: the loader decodes each shared frame once per block and gathers."""

    def batches(path: Path) -> list[dict]:
        return list(ShardStream(str(path), view="records", batch_size=16, shuffle=True, seed=5))

    for x, y in zip(batches(packed["zstd"]), batches(packed["shared"]), strict=True):
        assert x.keys() == y.keys()
        for k in x:
            if hasattr(x[k], "numpy"):
                np.testing.assert_array_equal(x[k].numpy(), y[k].numpy())
            else:
                assert x[k] == y[k]


@pytest.mark.skipif(subprocess.run(["which", "zstd"], capture_output=True).returncode != 0, reason="needs the zstd tool")
def test_zstd_tool_gives_the_plain_member(packed: dict[str, Path], tmp_path: Path) -> None:
    """``zstd -d`` of a member whose entries share frames is the same ``.npy`` / ``.jsonl`` as unshared."""
    import tarfile

    for key in ("zstd", "shared"):
        with tarfile.open(packed[key] / read_manifest(packed[key]).shards[0].name) as tf:
            for name in ("0000000007.label.npy.zst", "0000000007.meta.jsonl.zst"):
                data = tf.extractfile(name).read()  # type: ignore[union-attr]
                (tmp_path / f"{key}-{name}").write_bytes(data)
                subprocess.run(["zstd", "-qdf", str(tmp_path / f"{key}-{name}")], check=True)
    for name in ("0000000007.label.npy", "0000000007.meta.jsonl"):
        assert (tmp_path / f"zstd-{name}").read_bytes() == (tmp_path / f"shared-{name}").read_bytes()
    assert np.load(tmp_path / "shared-0000000007.label.npy").tolist() == [0, 1, 2, 3, 4, 5, 6]


def test_a_shrunk_shape_in_a_shared_frame_is_refused(packed: dict[str, Path], tmp_path: Path) -> None:
    """One token fewer in the index would shift every earlier record of the frame: the frame's size no
    longer matches its entries, so the loader refuses it (naming a record and field of that frame)."""
    root, doc = copy_packed(packed["shared"], tmp_path / "c")
    index, j = read_packed_index(root, doc, 0), _field(doc, "tokens")
    r = _shared_inner(packed["shared"], j)
    index[r, j]["shape"][0] -= 1
    index[r, j]["nbytes"] -= 4
    write_packed_index(root, doc, 0, index)
    save_doc(root, doc)
    msg = loader_error(root)
    assert "field 'tokens'" in msg and "zstd frame declares" in msg and "\n" not in msg, msg


def test_coinciding_entries_without_codec_share_are_refused(packed: dict[str, Path], tmp_path: Path) -> None:
    """A manifest that drops ``codec.share`` (and says v3) reads the shared entries as overlapping."""
    root, doc = copy_packed(packed["shared"], tmp_path / "c")
    del doc["codec"]["share"]
    doc["version"] = 3
    save_doc(root, doc)
    msg = loader_error(root)
    assert "entry does not follow the one before it" in msg, msg


def test_a_shared_frame_over_codec_share_is_refused(packed: dict[str, Path], tmp_path: Path) -> None:
    """A random read decodes a record's whole frame: a frame over the manifest's bound is refused."""
    root, doc = copy_packed(packed["shared"], tmp_path / "c")
    doc["codec"]["share"] = 16
    save_doc(root, doc)
    msg = loader_error(root)
    assert "shared zstd frame holds more than codec.share = 16 bytes" in msg, msg


def test_sharing_below_version_4_is_refused(packed: dict[str, Path], tmp_path: Path) -> None:
    root, doc = copy_packed(packed["shared"], tmp_path / "c")
    doc["version"] = 3
    save_doc(root, doc)
    with pytest.raises(ManifestError, match="codec.share = 512 needs format version 4, the manifest says 3"):
        read_manifest(root)
    doc["version"], doc["codec"]["share"] = 4, -1
    save_doc(root, doc)
    with pytest.raises(ManifestError, match="share"):
        read_manifest(root)


def _replace_frame(root: Path, doc: dict, j: int, r: int, frame: bytes) -> None:
    """Put ``frame`` in place of the frame of record ``r``'s field ``j`` in shard 0: the member rebuilt
    around it (tar header size, padding), every later offset shifted, the entries sharing it resized,
    index and sha256 rewritten (what a careful attacker would do)."""
    from cachebuild.format.tarball import padding, tar_header

    index, pack = read_packed_index(root, doc, 0), int(doc["shards"][0]["pack"])
    tar = (root / doc["shards"][0]["name"]).read_bytes()
    off, size = int(index[r, j]["offset"]), int(index[r, j]["size"])
    g0 = r // pack * pack
    col = index[g0 : g0 + pack, j]
    start, end = int(col["offset"][0]), int((col["offset"] + col["size"]).max())
    member = tar[start:off] + frame + tar[off + size : end]
    name = tar[start - 512 : start - 412].split(b"\0", 1)[0].decode()
    old_total, new_total = end - start + len(padding(end - start)), len(member) + len(padding(len(member)))
    out = tar[: start - 512] + tar_header(name, len(member)) + member + padding(len(member)) + tar[start + old_total :]
    same = index["offset"] == off
    same[:, [k for k in range(index.shape[1]) if k != j]] = False
    inside = (index["offset"] > off) & (index["offset"] < end)
    later = index["offset"] >= end
    index["size"][same] = len(frame)
    index["offset"][inside] += len(frame) - size
    index["offset"][later] += new_total - old_total
    (root / doc["shards"][0]["name"]).write_bytes(out)
    write_packed_index(root, doc, 0, index)
    save_doc(root, doc)


def _shared_inner(root: Path, j: int) -> int:
    """A record whose entry shares a frame and does not open it."""
    layout = open_cache(root).layout(0)
    return int(np.flatnonzero(layout.shared[:, j] & ~layout.opens[:, j])[0])


def test_a_json_separator_replaced_inside_a_shared_frame_is_named(packed: dict[str, Path], tmp_path: Path) -> None:
    """``verify`` checks each JSON Lines entry's ``\\n`` inside a shared frame (the loader reads lines by
    position from the frame's end, so a missing separator would glue two texts)."""
    root, doc = copy_packed(packed["shared"], tmp_path / "c")
    j = _field(doc, "meta")
    r = _shared_inner(root, j)
    e = read_packed_index(root, doc, 0)[r, j]
    layout = open_cache(root).layout(0)
    tar = (root / doc["shards"][0]["name"]).read_bytes()
    plain = zstandard.ZstdDecompressor().decompress(tar[int(e["offset"]) : int(e["offset"]) + int(e["size"])])
    at = len(plain) - int(layout.tail[r, j]) - int(e["nbytes"]) - 1
    assert plain[at : at + 1] == b"\n"
    _replace_frame(root, doc, j, r, zstandard.ZstdCompressor(write_content_size=True, write_checksum=True).compress(plain[:at] + b" " + plain[at + 1 :]))
    faults = verify_cache(root).faults
    assert len(faults) == 1 and "field 'meta': JSON Lines entry does not start with its '\\n' separator (it starts with b' ')" in faults[0], faults


def test_a_shared_frame_longer_than_its_entries_is_refused_by_the_loader(packed: dict[str, Path], tmp_path: Path) -> None:
    """A shared frame that decodes to 2 bytes more than its entries (every record of it shifted) is
    refused from its header, before it is decoded."""
    root, doc = copy_packed(packed["shared"], tmp_path / "c")
    j = _field(doc, "label")
    r = _shared_inner(root, j)
    e = read_packed_index(root, doc, 0)[r, j]
    tar = (root / doc["shards"][0]["name"]).read_bytes()
    plain = zstandard.ZstdDecompressor().decompress(tar[int(e["offset"]) : int(e["offset"]) + int(e["size"])])
    _replace_frame(root, doc, j, r, zstandard.ZstdCompressor(write_content_size=True, write_checksum=True).compress(plain + b"\0\0"))
    msg = loader_error(root)
    assert "field 'label'" in msg and "zstd frame declares" in msg and "\n" not in msg, msg


def test_an_unshared_cache_is_read_by_the_old_rule(packed: dict[str, Path]) -> None:
    """Format v3 (every entry its own frame) reads as before: no entry coincides, every tail is 0."""
    sh = open_cache(packed["zstd"])
    layout = sh.layout(0)
    assert not layout.shared.any() and not layout.tail.any()
    assert read_manifest(packed["zstd"]).codec.share == 0
