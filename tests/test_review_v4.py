"""Review as a new user of packed and v4 caches (docs/DECISIONS.md, "Review as a new user of packed and
v4 caches"): what broke on caches whose small entries share zstd frames, each through the real thing.

* A ``Mixture`` of caches of different layouts (format v1 pack 1, v3 packed, v4 shared frames, v4 of
  another ``codec.share``) read every shard against the *first* cache's ``codec.share``: with a v1 or
  v3 cache first, the v4 cache's shards were refused as corrupt ("entry does not follow the one
  before it"); with a smaller bound first, "shared zstd frame holds more than codec.share".
* A manifest whose ``codec.share`` was edited to 0 (or removed) was refused with a hint at the wrong
  key (``shards[i].pack``).
* ``cachebuild verify`` listed one flipped byte in a frame that 64 (up to 512) records share as 64
  faults, one per record.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cachebuild import FunctionSource, build
from cachebuild.format.reader import open_cache
from hostile_fixtures import save_doc
from loader_fixtures import Reference
from loaders import ShardStream, make_loader
from loaders.remote import RemoteOptions
from remote_fixtures import serve_folder
from stranger_fixtures import FIELDS, block, copy_packed, packed  # noqa: F401  (packed: a fixture, used by name)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory, packed: dict[str, Path]) -> dict[str, Path]:
    """The same source in four layouts: ``v1`` (pack 1), ``v3`` (pack 7, own frames), ``v4`` (pack 7,
    frames shared up to 512 bytes: the ``packed`` fixture's) and ``v4small`` (shared up to 128)."""
    base = tmp_path_factory.mktemp("layouts")
    out = {"v3": packed["zstd"], "v4": packed["shared"]}
    for key, pack, share, seed in (("v1", 1, None, 1), ("v4small", 7, 128, 2)):
        out[key] = base / key
        build(FunctionSource.per_block(block, FIELDS), out[key], records=30, pack=pack, share=share, seed=seed, progress=False, shard_mb=0.01, backend="threading")
    return out


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cachebuild", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def _check_epoch(roots: list[str], refs: list[Path], workers: int = 0, **kw: object) -> None:
    """Every record of every cache once in an epoch, each equal to its own cache's record (read by
    ``tarfile`` + ``zstd`` + ``np.load``: :class:`loader_fixtures.Reference`)."""
    stream = ShardStream(roots, view="records", batch_size=16, seed=3, **kw)  # type: ignore[arg-type]
    sizes = [open_cache(r).manifest.records for r in refs]
    starts = np.cumsum([0, *sizes])
    ref = [Reference(r) for r in refs]
    seen: list[int] = []
    for batch in make_loader(stream, num_workers=workers):
        keep = ~batch["is_pad"].numpy()
        ids = batch["record_id"].numpy()
        for i in np.flatnonzero(keep).tolist():
            c = int(np.searchsorted(starts, ids[i], side="right") - 1)
            want = ref[c].record(int(ids[i] - starts[c]))
            for name in ("seg", "label"):
                np.testing.assert_array_equal(batch[name][i].numpy(), want[name], err_msg=name)
            n = len(want["tokens"])
            np.testing.assert_array_equal(batch["tokens"][i, :n].numpy(), want["tokens"])
            assert not batch["tokens"][i, n:].any()
        seen += ids[keep].tolist()
    assert sorted(seen) == list(range(int(starts[-1])))


@pytest.mark.parametrize("order", [("v1", "v3", "v4"), ("v3", "v4", "v1"), ("v4small", "v4"), ("v4", "v4small", "v1")])
def test_a_mixture_of_every_layout_reads_in_any_order(layouts: dict[str, Path], order: tuple[str, ...]) -> None:
    roots = [layouts[k] for k in order]
    _check_epoch([str(r) for r in roots], roots)


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_a_mixture_of_every_layout_streams_over_http_with_workers(layouts: dict[str, Path], tmp_path: Path) -> None:
    """The same over a real HTTP server on 127.0.0.1, 2 DataLoader workers fetching the shards."""
    import shutil

    site = tmp_path / "site"
    for k in ("v1", "v3", "v4small", "v4"):
        shutil.copytree(layouts[k], site / k)
    order = ["v1", "v4small", "v3", "v4"]
    with serve_folder(site) as (url, _):
        _check_epoch([f"{url}/{k}" for k in order], [site / k for k in order], workers=2, remote=RemoteOptions(cache_dir=str(tmp_path / "fetched")))


def test_a_v4_cache_resumes_mid_epoch_in_a_mixture(layouts: dict[str, Path]) -> None:
    """A loader state taken mid-epoch over (v1, v4) loads into a fresh stream: the same remaining batches."""
    roots = [str(layouts["v1"]), str(layouts["v4"])]

    def loader() -> torch.utils.data.DataLoader:
        return make_loader(ShardStream(roots, view="records", batch_size=8, seed=1), num_workers=0)

    first = loader()
    batches = []
    for i, b in enumerate(first):
        if i == 2:
            state = first.state_dict()
        if i > 2:
            batches.append(b)
    again = loader()
    again.load_state_dict(state)
    rest = list(again)
    assert len(rest) == len(batches) > 0
    for a, b in zip(rest, batches):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("edit", ["zero", "absent"])
def test_codec_share_edited_away_is_named(packed: dict[str, Path], tmp_path: Path, edit: str) -> None:  # noqa: F811
    root, doc = copy_packed(packed["shared"], tmp_path / "c")
    if edit == "zero":
        doc["codec"]["share"] = 0
    else:
        del doc["codec"]["share"]
    save_doc(root, doc)
    for cmd in (["inspect", str(root)], ["verify", "-q", str(root)]):
        r = _cli(*cmd)
        assert r.returncode == 3, r.stdout + r.stderr
        line = [x for x in r.stderr.splitlines() if "field" in x][0] if cmd[0] == "inspect" else [x for x in r.stderr.splitlines() if x.startswith("FAULT")][0]
        assert "the manifest's codec.share (0 or absent) is not the cache's: its entries share zstd frames" in line, line
        assert "pack" not in line.split("; or ", 1)[1], line
    assert "Traceback" not in r.stderr


def test_a_wrong_pack_is_still_named_as_pack(packed: dict[str, Path], tmp_path: Path) -> None:  # noqa: F811
    """A v3 cache (no shared frames) whose ``pack`` was edited keeps the ``pack`` hint."""
    root, doc = copy_packed(packed["zstd"], tmp_path / "c")
    doc["codec"]["pack"] = 5
    for s in doc["shards"]:
        s["pack"] = 5
    save_doc(root, doc)
    r = _cli("inspect", str(root))
    assert r.returncode == 3 and "the manifest's shards[0].pack = 5 is not the shard's" in r.stderr, r.stderr


def test_verify_names_a_bad_shared_frame_once(packed: dict[str, Path], tmp_path: Path) -> None:  # noqa: F811
    """One flipped byte in a zstd frame that several records share is one fault line naming them all."""
    root, doc = copy_packed(packed["shared"], tmp_path / "c")
    sh = open_cache(root)
    j = sh.manifest.field_names.index("label")
    layout, index = sh.layout(0), sh.shard(0).index
    r = int(np.flatnonzero(layout.shared[:, j] & layout.opens[:, j])[0])
    off, size = int(index[r, j]["offset"]), int(index[r, j]["size"])
    sharing = np.flatnonzero((index[:, j]["offset"] == off))
    assert len(sharing) >= 3
    sh.close()
    tar = root / doc["shards"][0]["name"]
    data = bytearray(tar.read_bytes())
    data[off + size - 2] ^= 0x10  # inside the frame's content checksum
    tar.write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}
    out = _cli("verify", "-q", str(root))
    assert out.returncode == 3
    faults = [x for x in out.stderr.splitlines() if x.startswith("FAULT")]
    assert len(faults) == 2, faults  # the shard's sha256, and the frame once
    key = f"{int(doc['shards'][0]['first_record']) + int(sharing[0]):010d}"
    assert f"record {key}, field 'label'" in faults[1] and f"the same fault in all {len(sharing)})" in faults[1], faults[1]
    assert f"{int(sharing[1]):010d}..{int(sharing[-1]):010d}" in faults[1], faults[1]
    assert f"error: 2 fault(s) in {root}" in out.stderr
    assert before == {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}  # verify changes nothing


def test_each_help_names_only_flags_its_command_has() -> None:
    """``cachebuild mel --help`` said "a rerun or --append: the cache's own" of ``--pack``, but ``mel``
    has no ``--append`` (a mel recipe reads a fixed set of inputs: its append is refused)."""
    import re

    from click.testing import CliRunner

    from cachebuild.cli import main

    elsewhere = {"prune": {"--append"}}  # (prune's help says what it does to another command's unfinished append)
    for name, cmd in main.commands.items():
        text = CliRunner().invoke(main, [name, "--help"]).output
        flags = {o for p in cmd.params for o in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]} | {"--help"}
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
        assert named - flags <= elsewhere.get(name, set()), (name, sorted(named - flags))


def test_the_ratio_counts_the_members_shards_hold(tmp_path: Path) -> None:
    """A packed cache whose shards hold fewer records than ``pack`` (a small ``shard_mb``): ``inspect``
    and the build summary said "one [member] per 4096 records and field" of members holding ~10."""
    import json

    root = tmp_path / "c"
    build(FunctionSource.per_block(block, FIELDS), root, records=120, shard_mb=0.002, progress=False, backend="threading")
    doc = json.loads((root / "manifest.json").read_text())
    pack, counts = doc["codec"]["pack"], [s["records"] for s in doc["shards"]]
    assert pack >= 256 and max(counts) < 20 and "share" in doc["codec"]
    per = round(sum(counts) / len(counts))
    r = _cli("inspect", str(root))
    line = next(x for x in r.stdout.splitlines() if x.startswith("bytes"))
    assert f"one per {per} records and field: shards hold fewer records than pack = {pack}, a larger --shard-mb packs more per member" in line, line


def test_inspect_names_the_tar_key_of_a_pruned_caches_record(tmp_path: Path) -> None:
    """``inspect --record N`` takes a position (the loader's ``record_id``); once a generation is pruned
    the record's tar key starts later, and the line now says it (it read "record 0" of key 30)."""
    root = tmp_path / "c"
    src = FunctionSource.per_block(block, FIELDS)
    build(src, root, records=30, shard_mb=0.01, progress=False, backend="threading")
    build(src, root, records=20, shard_mb=0.01, progress=False, backend="threading", append=True, keep=1)
    r = _cli("inspect", str(root), "--record", "3")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("record 3 "))
    assert line.endswith(", tar key 0000000033):"), line
    assert '"id": 33' in r.stdout  # (the record's own JSON: its id is its key)


def test_bench_stages_read_and_decode_a_shared_frame_once(packed: dict[str, Path]) -> None:  # noqa: F811
    """``cachebuild bench``'s ``read``/``decompress`` stages gathered and decoded a shared zstd frame once
    per record (256 times for a batch of labels in one frame), where the loader decodes it once per block."""
    import zstandard

    from loaders.bench.stages import stored_payloads

    root = packed["shared"]
    sh = open_cache(root)
    fields = ["seg", "label", "tokens"]
    ids = np.arange(sh.manifest.records)
    frames = {(s, int(o)) for s in range(len(sh.manifest.shards)) for j in (sh.field_pos[n] for n in fields) for o in sh.index(s)[:, j]["offset"]}
    got = stored_payloads(sh, ids, fields)
    assert len(got) == len(frames) < len(ids) * len(fields)
    decoded = sum(len(zstandard.ZstdDecompressor().decompress(bytes(p))) for p in got)
    data = sum(int(sh.index(s)[:, sh.field_pos[n]]["nbytes"].sum()) for s in range(len(sh.manifest.shards)) for n in fields)
    assert data <= decoded < data + 4096 * len(frames)  # each record's data decoded once (plus member headers)


def test_a_share_that_cannot_apply_is_said(tmp_path: Path) -> None:
    """``generate --set build.share=512`` writes one member per record and field (causal graphs are
    over 8 KiB): nothing can share a frame, and the build said nothing of the setting it dropped."""
    import json

    r = _cli("generate", "--graphs", "20", "--out", str(tmp_path / "c"), "--set", "build.share=512", "-j", "1", "-q")
    assert r.returncode == 0, r.stderr
    assert "warning: build.share = 512: no effect, this cache stores 1 record per tar member (pack 1)" in r.stderr, r.stderr
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["codec"] == {"name": "zstd", "level": 1}
    r = _cli("generate", "--graphs", "20", "--out", str(tmp_path / "d"), "--pack", "4", "--set", "build.share=512", "-j", "1", "-q")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())["codec"]["share"] == 512


def _xy(rng: np.random.Generator, index: int) -> dict:
    return {"x": np.float32(index), "y": np.int16(index % 5), "z": np.int32(index), "w": np.uint8(index % 7)}


def test_verify_stops_listing_at_max_faults(tmp_path: Path) -> None:
    """A wholly corrupt shard (every frame's checksum flipped in shard 0) is listed up to ``MAX_FAULTS`` lines, as before
    shared frames were grouped (the grouping must not run past the cap)."""
    from cachebuild.tools.verify import MAX_FAULTS

    root = tmp_path / "c"
    build(FunctionSource.per_record(_xy, {"x": "float32", "y": "int16", "z": "int32", "w": "uint8"}), root, records=600, pack=1, progress=False, backend="threading")
    sh = open_cache(root)
    assert sh.manifest.shards[0].records * 4 > 1000  # (shard 0 alone holds more faulty members than the cap)
    index = sh.shard(0).index.copy()
    sh.close()
    tar = root / sh.manifest.shards[0].name
    data = bytearray(tar.read_bytes())
    for e in index.reshape(-1):
        data[int(e["offset"]) + int(e["size"]) - 1] ^= 0xFF  # the frame's content checksum
    tar.write_bytes(bytes(data))
    r = _cli("verify", "-q", str(root))
    faults = [x for x in r.stderr.splitlines() if x.startswith("FAULT")]
    assert r.returncode == 3 and len(faults) == MAX_FAULTS == 1000, len(faults)
    assert "sha256 mismatch" in faults[0] and "record 0000000000, field 'x'" in faults[1]


def test_inspect_says_when_members_hold_fewer_records_than_the_pack(tmp_path: Path) -> None:
    """A pack of 4096 on shards of a few records: ``inspect``'s codec line said "4096 records per member"
    of members that hold 5; it now says what the members hold (and says nothing more when they are full)."""
    from cachebuild.tools.inspect import inspect_cache

    small = tmp_path / "small"
    build(FunctionSource.per_block(block, FIELDS), small, records=30, pack=4096, progress=False, shard_mb=0.01, backend="threading")
    shards = open_cache(small).manifest.shards
    held = max(min(s.pack, s.records) for s in shards)
    assert len(shards) > 1 and held < 4096
    codec = next(line for line in inspect_cache(small, 0) if line.startswith("codec"))
    assert f"4096 records per member (members here hold at most {held}: the shards are smaller)" in codec
    full = tmp_path / "full"
    build(FunctionSource.per_block(block, FIELDS), full, records=30, pack=3, progress=False, shard_mb=0.01, backend="threading")
    codec = next(line for line in inspect_cache(full, 0) if line.startswith("codec"))
    assert "3 records per member" in codec and "hold at most" not in codec
