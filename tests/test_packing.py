"""Packed members (several records per tar member, ``build.pack``): same records, same batches,
plain tools still read the tar, smaller on disk, and damage is reported."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from cachebuild import FunctionSource, build
from cachebuild.errors import ConfigError, ManifestError, ShardCorruptError
from cachebuild.format.manifest import read_manifest
from cachebuild.format.packing import SHARE_BYTES
from cachebuild.format.reader import open_cache
from cachebuild.format.records import read_record
from cachebuild.tools.verify import verify_cache
from loaders import ShardStream

FIELDS = {"seg": "float16", "label": "int16", "tokens": "int32", "meta": "json"}


def small_block(rng: np.random.Generator, start: int, stop: int) -> dict:
    """Small records: a [8, 16] float16 segment, a 0-d label, a ragged token list and JSON."""
    n = stop - start
    seg = np.cumsum(rng.standard_normal((n, 8, 16)), axis=2).astype(np.float16)
    lengths = rng.integers(1, 40, n)
    tokens = [rng.integers(0, 1000, int(k)).astype(np.int32) for k in lengths]
    labels = (np.arange(start, stop) % 7).astype(np.int16)
    return {"seg": seg, "label": list(labels), "tokens": tokens, "meta": [{"id": int(i), "len": int(k)} for i, k in zip(range(start, stop), lengths)]}


SOURCE = FunctionSource.per_block(small_block, FIELDS)


def _build(root: Path, pack: int, codec: str = "zstd", records: int = 301, **kw) -> Path:
    out = root / f"{codec}-p{pack}"
    build(SOURCE, out, records=records, pack=pack, codec=codec, progress=False, shard_mb=0.05, backend="threading", **kw)
    return out


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], Path]:
    root = tmp_path_factory.mktemp("packing")
    caches = {(c, p): _build(root, p, c) for c in ("zstd", "none") for p in (1, 8)}
    caches[("zstd-v3", 8)] = root / "zstd-v3-p8"  # packed, every entry its own frame (format v3, share=0)
    build(SOURCE, caches[("zstd-v3", 8)], records=301, pack=8, share=0, codec="zstd", progress=False, shard_mb=0.05, backend="threading")
    return caches


@pytest.mark.parametrize("codec", ["zstd", "none", "zstd-v3"])
def test_packed_records_equal_unpacked(caches: dict, codec: str) -> None:
    one, packed = open_cache(caches[(codec.split("-")[0], 1)]), open_cache(caches[(codec, 8)])
    assert packed.manifest.records == one.manifest.records == 301
    for rid in (0, 1, 7, 8, 63, 64, 150, 299, 300):
        a, b = read_record(one, rid, strict=True), read_record(packed, rid, strict=True)
        assert a["meta"] == b["meta"] and a["meta"]["id"] == rid
        for name in ("seg", "label", "tokens"):
            np.testing.assert_array_equal(a[name], b[name])
            assert a[name].dtype == b[name].dtype


@pytest.mark.parametrize("codec", ["zstd", "none", "zstd-v3"])
def test_packed_batches_equal_unpacked(caches: dict, codec: str) -> None:
    def batches(path: Path) -> list[dict]:
        return list(ShardStream(str(path), view="records", batch_size=32, shuffle=True, seed=3))

    for x, y in zip(batches(caches[(codec.split("-")[0], 1)]), batches(caches[(codec, 8)]), strict=True):
        assert x.keys() == y.keys()
        for k in x:
            if hasattr(x[k], "numpy"):
                np.testing.assert_array_equal(x[k].numpy(), y[k].numpy())


def test_manifest_says_pack_and_version(caches: dict) -> None:
    doc1 = json.loads((caches[("zstd", 1)] / "manifest.json").read_text())
    doc8 = json.loads((caches[("zstd", 8)] / "manifest.json").read_text())
    assert doc1["version"] == 1 and all("pack" not in s for s in doc1["shards"]) and "pack" not in doc1["codec"]
    assert doc8["version"] == 4 and all(s["pack"] == 8 for s in doc8["shards"]) and doc8["codec"]["pack"] == 8 and doc8["codec"]["share"] == SHARE_BYTES
    v3 = json.loads((caches[("zstd-v3", 8)] / "manifest.json").read_text())
    assert v3["version"] == 3 and "share" not in v3["codec"]
    raw = json.loads((caches[("none", 8)] / "manifest.json").read_text())
    assert raw["version"] == 3 and "share" not in raw["codec"]  # (raw entries have no frames to share)


def test_small_entries_share_frames(caches: dict) -> None:
    """With codec.share, a member's small entries coincide in the index (one frame of at most codec.share
    bytes); v3 entries never do."""
    for key, shared in ((("zstd", 8), True), (("zstd-v3", 8), False)):
        sh = open_cache(caches[key])
        index = sh.index(0)
        off = index["offset"][:8]
        assert (off == off[:1]).all(axis=0).any() == shared
        if shared:  # every frame holds at most codec.share decoded bytes (data and separators)
            layout = sh.layout(0)
            assert layout.shared.any() and (layout.lo[layout.shared] <= SHARE_BYTES + 64).all()  # (+ the group's .npy header)


def test_packed_verify_ok(caches: dict) -> None:
    for path in caches.values():
        report = verify_cache(path)
        assert report.ok, report


@pytest.mark.skipif(shutil.which("zstd") is None or shutil.which("tar") is None, reason="needs the tar and zstd tools")
def test_tar_and_zstd_tools_recover_group_arrays(caches: dict, tmp_path: Path) -> None:
    """`tar -x` + `zstd -d` give one .npy per field and group (stacked, or flat for ragged) and JSON Lines."""
    cache = caches[("zstd", 8)]
    shard = read_manifest(cache).shards[0]
    subprocess.run(["tar", "-xf", str(cache / shard.name), "-C", str(tmp_path)], check=True)
    subprocess.run(["zstd", "-qd", "--rm", *sorted(str(p) for p in tmp_path.glob("*.zst"))], check=True)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[:4] == ["0000000000.label.npy", "0000000000.meta.jsonl", "0000000000.seg.npy", "0000000000.tokens.npy"]
    assert len(names) == 4 * -(-shard.records // 8)
    want = small_block(np.random.default_rng(), 0, 1)  # (only for dtypes)
    shards = open_cache(cache)
    recs = [read_record(shards, i) for i in range(8)]
    seg = np.load(tmp_path / "0000000000.seg.npy")
    assert seg.shape == (8, 8, 16) and seg.dtype == want["seg"].dtype
    np.testing.assert_array_equal(seg, np.stack([r["seg"] for r in recs]))
    np.testing.assert_array_equal(np.load(tmp_path / "0000000000.label.npy"), [r["label"] for r in recs])
    np.testing.assert_array_equal(np.load(tmp_path / "0000000000.tokens.npy"), np.concatenate([r["tokens"] for r in recs]))
    lines = (tmp_path / "0000000000.meta.jsonl").read_text().split("\n")
    assert [json.loads(line) for line in lines] == [r["meta"] for r in recs]


def test_python_tarfile_reads_raw_packed_shard(caches: dict) -> None:
    cache = caches[("none", 8)]
    shard = read_manifest(cache).shards[-1]
    with tarfile.open(cache / shard.name) as tf:
        members = tf.getmembers()
        last = [m for m in members if m.name.endswith(".seg.npy")][-1]
        arr = np.load(io.BytesIO(tf.extractfile(last).read()))
    first = int(last.name.split(".")[0])
    assert arr.shape == (shard.first_record + shard.records - first, 8, 16)
    np.testing.assert_array_equal(arr[-1], read_record(open_cache(cache), shard.first_record + shard.records - 1)["seg"])


def test_packing_stores_small_records_in_fewer_bytes(caches: dict) -> None:
    def stored(path: Path) -> int:
        return sum(p.stat().st_size for p in path.glob("shard-*.tar"))

    for codec in ("zstd", "none"):
        one, packed = stored(caches[(codec, 1)]), stored(caches[(codec, 8)])
        assert packed < 0.5 * one, (codec, one, packed)  # 4 members of >= 1 KB each per record before


def test_same_bytes_for_any_worker_count(tmp_path: Path) -> None:
    a = _build(tmp_path / "a", 8, records=700, workers=1)
    b = _build(tmp_path / "b", 8, records=700, workers=2)
    tars = sorted(p.name for p in a.glob("shard-*.tar"))
    assert len(tars) > 1
    for name in tars:
        assert (a / name).read_bytes() == (b / name).read_bytes()


@pytest.mark.parametrize("bad", [0, -1, 5000, 2.5, "8", True])
def test_bad_pack_is_refused(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ConfigError, match="pack"):
        build(SOURCE, tmp_path / "c", records=10, pack=bad, progress=False)  # type: ignore[arg-type]
    assert not (tmp_path / "c").exists()


def test_recipe_build_pack_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"build\.pack.*0"):
        build({"kind": "causal", "graphs": 10, "build": {"pack": 0}}, tmp_path / "c", progress=False)
    summary = build({"kind": "causal", "graphs": 40, "build": {"pack": 16}}, tmp_path / "ok", progress=False)
    assert summary
    assert {s.pack for s in read_manifest(tmp_path / "ok").shards} == {16}


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_manifest_with_bad_pack_is_refused(caches: dict, tmp_path: Path) -> None:
    cache = _copy(caches[("zstd", 8)], tmp_path / "c")
    doc = json.loads((cache / "manifest.json").read_text())
    doc["shards"][0]["pack"] = 0
    (cache / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match=r"shards\[0\]\.pack"):
        read_manifest(cache)
    doc["shards"][0]["pack"], doc["version"] = 8, 1
    (cache / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="needs format version 3"):
        read_manifest(cache)


def test_wrong_pack_in_manifest_is_caught(caches: dict, tmp_path: Path) -> None:
    """A manifest claiming another pack than the tar has (for the cache and every shard alike): the
    index layout check refuses the shard."""
    cache = _copy(caches[("zstd", 8)], tmp_path / "c")
    doc = json.loads((cache / "manifest.json").read_text())
    doc["codec"]["pack"] = 4
    for shard in doc["shards"]:
        shard["pack"] = 4
    (cache / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ShardCorruptError, match="gap inside|overlap"):
        read_record(open_cache(cache), 0)


def test_a_shard_packing_otherwise_than_its_cache_is_refused(caches: dict, tmp_path: Path) -> None:
    """Every shard of a cache packs alike (an append packs with the cache's ``codec.pack``): a shard
    entry saying otherwise is refused when the manifest is read, naming both keys (it was read with
    the shard's own value, and an append would have packed with the other)."""
    cache = _copy(caches[("zstd", 8)], tmp_path / "c")
    doc = json.loads((cache / "manifest.json").read_text())
    doc["shards"][-1]["pack"] = 4
    (cache / "manifest.json").write_text(json.dumps(doc))
    last = len(doc["shards"]) - 1
    with pytest.raises(ManifestError, match=rf"shards\[{last}\]\.pack = 4 but codec\.pack = 8"):
        read_manifest(cache)


def test_renamed_packed_member_is_caught(caches: dict, tmp_path: Path) -> None:
    cache = _copy(caches[("none", 8)], tmp_path / "c")
    shard = read_manifest(cache).shards[0]
    data = bytearray((cache / shard.name).read_bytes())
    at = data.find(b"0000000008.seg.npy")
    data[at : at + 10] = b"0000000009"
    (cache / shard.name).write_bytes(bytes(data))
    report = verify_cache(cache)
    assert not report.ok
    assert any("0000000008" in line and "0000000009.seg.npy" in line for line in report.faults)


def test_stray_header_inside_group_is_caught(caches: dict, tmp_path: Path) -> None:
    """An entry inside a packed member whose stored bytes start with something else than its data: strict read refuses it."""
    cache = _copy(caches[("none", 8)], tmp_path / "c")
    shards = open_cache(cache)
    col = shards.index(0)[:, shards.field_pos["meta"]]
    off = int(col[3]["offset"])
    data = bytearray((cache / shards.manifest.shards[0].name).read_bytes())
    assert data[off : off + 1] == b"\n"
    data[off : off + 1] = b" "
    (cache / shards.manifest.shards[0].name).write_bytes(bytes(data))
    with pytest.raises(ShardCorruptError, match=r"does not start with its '\\n' separator \(it starts with b' '\)"):
        read_record(open_cache(cache, verify="size"), 3, strict=True)


def test_append_keeps_the_cache_pack(caches: dict, tmp_path: Path) -> None:
    cache = _copy(caches[("zstd", 1)], tmp_path / "c")
    build(SOURCE, cache, records=50, append=True, progress=False, backend="threading")  # default pack: the cache's 1 is kept
    m = read_manifest(cache)
    assert {s.pack for s in m.shards} == {1}
    assert m.records == 351
    assert verify_cache(cache).ok


def test_large_records_get_smaller_groups(tmp_path: Path) -> None:
    """A group stays within MEMBER_BYTES by the source's size estimate (1 MiB records: 16 per member)."""
    from cachebuild.format.packing import MEMBER_BYTES, effective_pack

    assert effective_pack(256, 2050) == 256 and effective_pack(256, 1 << 20) == MEMBER_BYTES >> 20 and effective_pack(256, 1 << 30) == 1
    src = FunctionSource.per_block(small_block, FIELDS, record_bytes=1 << 20)
    with pytest.warns(UserWarning, match="packing 16 records per tar member instead"):
        build(src, tmp_path / "c", records=40, progress=False, backend="threading", pack=256)
    m = read_manifest(tmp_path / "c")
    assert {s.pack for s in m.shards} == {16} and m.codec.pack == 16
    assert verify_cache(tmp_path / "c").ok


def test_the_default_packs_only_small_records(tmp_path: Path) -> None:
    """Not given, ``pack`` is 256 to 4096 below PACK_BELOW_BYTES (small records, where tar framing would
    double the bytes: about 4 MB raw per member) and 1 from it up: the layout plain WebDataset reads (DESIGN.md)."""
    from cachebuild.format.packing import PACK_BELOW_BYTES, default_pack

    assert default_pack(PACK_BELOW_BYTES - 1) == 512 and default_pack(PACK_BELOW_BYTES) == 1
    assert default_pack(2050) == 1024 and default_pack(100) == 4096 and default_pack(1) == 4096
    for record_bytes, pack in ((2050, 1024), (PACK_BELOW_BYTES - 1, 512), (PACK_BELOW_BYTES, 1), (1 << 20, 1)):
        out = tmp_path / f"c{record_bytes}"
        build(FunctionSource.per_block(small_block, FIELDS, record_bytes=record_bytes), out, records=40, progress=False, backend="threading")
        assert read_manifest(out).codec.pack == pack and {s.pack for s in read_manifest(out).shards} == {pack}


def test_build_summary_explains_only_a_real_loss() -> None:
    from cachebuild.builder.builder import ratio_text

    assert ratio_text(0.98) == "ratio 0.98x"  # a raw packed cache: framing and index only
    assert "--pack" in ratio_text(0.4) and ratio_text(2.5) == "ratio 2.50x"


def _wide_block(rng: np.random.Generator, start: int, stop: int) -> dict:
    return {"x": rng.standard_normal((stop - start, 64, 64)).astype(np.float32)}  # 16 KB per record


def test_a_pack_asked_for_and_lowered_to_keep_members_small_is_said(tmp_path: Path) -> None:
    wide = FunctionSource.per_block(_wide_block, {"x": "float32"})
    with pytest.warns(UserWarning, match=r"build\.pack = 4096: packing 1024 records per tar member instead, so a member stays within 16 MB"):
        build(wide, tmp_path / "asked", records=40, pack=4096, progress=False, backend="threading")
    assert {s.pack for s in read_manifest(tmp_path / "asked").shards} == {1024}
    gen = subprocess.run([sys.executable, "-m", "cachebuild.cli", "generate", "--graphs", "64", "--pack", "4096", "--out", str(tmp_path / "g"), "-q"], capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0 and "build.pack = 4096: packing" in gen.stderr and len(gen.stderr.strip().splitlines()) == 1, gen.stderr


def test_a_rerun_without_pack_keeps_the_layout_of_the_cache_there(tmp_path: Path) -> None:
    """A cache packed by an older default (or by ``--pack``) is confirmed or resumed in its own layout
    by a rerun that leaves ``--pack`` out, not refused for a default that changed; an unfinished
    build's record counts the same."""
    from click.testing import CliRunner

    from cachebuild.builder.output import LocalOutput
    from cachebuild.builder.pack_choice import choose_pack
    from cachebuild.cli import main

    out = tmp_path / "c"
    args = ["generate", "--graphs", "30", "--out", str(out), "--shard-mb", "0.5", "--workers", "1", "-q"]
    assert CliRunner().invoke(main, [*args, "--pack", "256"]).exit_code == 0
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and "nothing to do" in r.output, r.output
    assert read_manifest(out).codec.pack == 256
    partial = tmp_path / "p"
    partial.mkdir()
    (partial / "build.json").write_text('{"doc": {"codec": {"name": "zstd", "level": 1, "pack": 9}}}')
    assert choose_pack(256, False, 30_000, LocalOutput(partial)) == 1  # no shard finished: nothing to resume
    (partial / "shard-00000.done.json").write_text("{}")
    assert choose_pack(256, False, 30_000, LocalOutput(partial)) == 9
    assert choose_pack(256, False, 30_000, LocalOutput(tmp_path / "new")) == 1
    assert choose_pack(256, True, 30_000, LocalOutput(partial)) == 256
    assert choose_pack(256, False, 30_000, None) == 1  # --overwrite: the cache there does not count
    r = CliRunner().invoke(main, [*args, "--overwrite"])  # replaces the packed cache with the default layout
    assert r.exit_code == 0 and read_manifest(out).codec.pack == 1, r.output


def test_overwrite_without_pack_writes_the_default_not_the_replaced_caches_pack(tmp_path: Path) -> None:
    """``--overwrite`` replaces the cache, so its pack is the default a fresh build of the same
    command gets, whatever the cache it replaces was packed with (found in review: the replaced
    cache's pack was kept, so the same command wrote other bytes depending on what was at ``--out``)."""
    from click.testing import CliRunner

    from cachebuild.cli import main

    out, fresh = tmp_path / "c", tmp_path / "fresh"
    args = ["generate", "--graphs", "30", "--shard-mb", "0.5", "--workers", "1", "-q"]
    assert CliRunner().invoke(main, [*args, "--out", str(out), "--pack", "256"]).exit_code == 0
    r = CliRunner().invoke(main, [*args, "--out", str(out), "--seed", "5", "--overwrite"])
    assert r.exit_code == 0, r.output
    assert CliRunner().invoke(main, [*args, "--out", str(fresh), "--seed", "5"]).exit_code == 0
    assert read_manifest(out).codec.pack == read_manifest(fresh).codec.pack == 1
    assert [(out / s.name).read_bytes() for s in read_manifest(out).shards] == [(fresh / s.name).read_bytes() for s in read_manifest(fresh).shards]
    r = CliRunner().invoke(main, [*args, "--out", str(out), "--seed", "5", "--pack", "256"])  # a plain rerun still refuses another pack
    assert r.exit_code == 4 and "codec.pack" in r.output, r.output


@pytest.mark.parametrize("command", ["generate", "mel", "build"])
def test_help_and_api_state_the_default_pack_by_record_size(command: str) -> None:
    """Every place a user reads the default ``pack`` states the rule by record size (found in review:
    ``build --help`` and ``build()``'s docstring still said a flat 256; ``mel --help`` said "files",
    which reads as the audio file's size, while the rule is the record's)."""
    from click.testing import CliRunner

    from cachebuild import build as build_api
    from cachebuild.cli import main

    text = " ".join(CliRunner().invoke(main, [command, "--help"], terminal_width=10_000).output.split())
    assert "8 KiB" in text and "pack (records per tar member: 256," not in text, text
    assert "records of 8 KiB" in text or "records (a file's" in text, text
    doc = " ".join((build_api.__doc__ or "").split())
    assert "8 KiB" in doc and "to 256;" not in doc, doc


def _shard_bytes(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.name.startswith("shard-") and not p.name.endswith(".done.json")}


def test_shared_frames_are_the_same_bytes_for_any_worker_count(tmp_path: Path) -> None:
    """Frames are cut inside a member, from the entries' sizes only: 1 or 3 workers write the same shards."""
    for workers in (1, 3):
        build(SOURCE, tmp_path / f"w{workers}", records=301, pack=8, workers=workers, progress=False, shard_mb=0.05, backend="threading")
    one, three = _shard_bytes(tmp_path / "w1"), _shard_bytes(tmp_path / "w3")
    assert len(one) > 4 and one == three
    assert read_manifest(tmp_path / "w1").codec.share == SHARE_BYTES


def test_reruns_and_appends_keep_a_cache_s_unshared_layout(tmp_path: Path) -> None:
    """A v3 cache (written before shared frames, or with share=0) is confirmed by a rerun that leaves
    ``share`` out and grows in its own layout; asking an append for another ``share`` is refused."""
    out = tmp_path / "c"
    build(SOURCE, out, records=60, pack=8, share=0, progress=False, shard_mb=0.05, backend="threading")
    before = _shard_bytes(out)
    again = build(SOURCE, out, records=60, pack=8, progress=False, shard_mb=0.05, backend="threading")
    assert again.built == 0 and _shard_bytes(out) == before
    build(SOURCE, out, records=40, append=True, progress=False, backend="threading")
    m = read_manifest(out)
    assert m.codec.share == 0 and m.version == 3 and m.records == 100 and verify_cache(out).ok
    assert not open_cache(out).layout(len(m.shards) - 1).shared.any()
    with pytest.raises(ConfigError, match=r"build\.share = 1024: the cache at .* shares frames up to 0 bytes"):
        build(SOURCE, out, records=40, append=True, share=1024, progress=False, backend="threading")
