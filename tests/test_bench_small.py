"""benchmarks/small_data.py and bench_small.py: the small-record datasets are what the caches hold, counted right.

The benchmark's numbers rest on three claims checked here: the records remade
from the seeds (what LitData gets, what the payload counts) are byte for byte
the records our builder stored; the payload count is the arrays' nbytes plus
the compact JSON text; and the mel segments look like log-mels (smooth,
compressible a little), not uniform noise. Plus the configuration handling:
``--set build.codec`` is refused, ``--packs`` values the code does not accept
are skipped, not faked.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_small  # noqa: E402
import small_data  # noqa: E402

from cachebuild import build  # noqa: E402
from cachebuild.format import open_cache, read_record  # noqa: E402
from cachebuild.recipes import BUILD_KEYS  # noqa: E402


@pytest.fixture(scope="module")
def caches(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("small")
    out = {}
    for ds in small_data.DATASETS:
        out[ds] = root / ds
        build(small_data.recipe(ds, 600, "none", shard_mb=0.5), out[ds], workers=1, progress=False)
    return out


def _stored(cache: Path) -> list[dict]:
    with open_cache(cache) as shards:
        return [read_record(shards, r) for r in range(shards.manifest.records)]


@pytest.mark.parametrize("ds", small_data.DATASETS)
def test_remade_records_are_the_stored_ones(caches, ds):
    stored = _stored(caches[ds])
    tasks = small_data.block_tasks(caches[ds])
    assert len({t[2] for t in tasks}) > 1, "the test should span several shards"
    remade = [s for t in tasks for s in small_data.litdata_samples(t)]
    assert len(remade) == len(stored) == 600
    for a, b in zip(stored, remade):
        assert set(a) == set(b)
        for k, v in a.items():
            if k == "meta":
                assert json.loads(b[k]) == v
            else:
                assert v.dtype == b[k].dtype and np.array_equal(v, b[k])


@pytest.mark.parametrize("ds", small_data.DATASETS)
def test_payload_is_array_bytes_plus_compact_json(caches, ds):
    stored = _stored(caches[ds])
    want = sum(len(json.dumps(v, sort_keys=True, separators=(",", ":"))) if k == "meta" else v.nbytes for rec in stored for k, v in rec.items())
    assert small_data.payload_bytes(caches[ds]) == (600, want)


def test_mel_segments_look_like_log_mels():
    rng = np.random.default_rng(0)
    mel = small_data.log_mels(rng, 256)
    assert mel.shape == (256, 32, 32) and mel.dtype == np.float16 and np.isfinite(mel).all()
    assert mel[0].nbytes == 2048
    per_record = mel.nbytes / sum(len(zstandard.ZstdCompressor(level=3).compress(m.tobytes())) for m in mel)
    assert 1.05 < per_record < 2.0, per_record  # compressible like real mels, not like uniform noise (1.0) or a constant
    noise = np.log(rng.random(mel.shape) + 1e-6).astype(np.float16)
    assert noise.nbytes / len(zstandard.ZstdCompressor(level=3).compress(noise.tobytes())) < per_record
    # smooth: neighbouring mel bands are much closer than random pairs of values
    f = mel.astype(np.float32)
    assert np.abs(np.diff(f, axis=1)).mean() < 0.5 * np.abs(f - f[::-1]).mean()
    assert not np.array_equal(mel[0], mel[1])
    np.testing.assert_array_equal(small_data.log_mels(np.random.default_rng(0), 256), mel)


def test_tokens_are_ragged_int32_in_range():
    cols = small_data.small_block(np.random.default_rng(1), 0, 256, dataset="tokens")
    lengths = np.array([len(t) for t in cols["tokens"]])
    assert lengths.min() >= 50 and lengths.max() <= 500 and len(set(lengths)) > 50
    assert all(t.dtype == np.int32 and t.min() >= 0 and t.max() < 32_000 for t in cols["tokens"])


def test_factory_rejects_unknown_params():
    with pytest.raises(TypeError, match="bogus"):
        small_data.make(dataset="mel", bogus=1)
    with pytest.raises(ValueError, match="dataset"):
        small_data.make(dataset="images")


def test_configs():
    assert [(c.label, c.overrides) for c in bench_small.configs(["build.level=3"], "", "")] == [("default", ["build.level=3"])]
    cfgs = bench_small.configs([], "x", "1,64")
    assert [(c.label, c.overrides, c.pack) for c in cfgs] == [("x pack=1", ["build.pack=1"], 1), ("x pack=64", ["build.pack=64"], 64)]
    with pytest.raises(SystemExit, match="--codecs"):
        bench_small.configs(["build.codec=none"], "", "")
    with pytest.raises(SystemExit, match="whole number"):
        bench_small.configs([], "", "1,x")


def test_pack_values_the_code_does_not_accept_are_skipped(tmp_path, capsys):
    accepted = "pack" in BUILD_KEYS
    one, many = bench_small.configs([], "", "1,64")
    assert bench_small.build_config(one, ["tokens"], ["none"], 300, 64, tmp_path)
    assert set(one.caches) == {("tokens", "none")} and (one.caches[("tokens", "none")] / "manifest.json").exists()
    assert (one.note == "") == accepted
    assert bench_small.build_config(many, ["tokens"], ["none"], 300, 64, tmp_path) == accepted
    if not accepted:
        assert not many.caches and "does not accept build.pack" in capsys.readouterr().out


def test_the_decompression_limit_decodes_a_shared_frame_once(tmp_path) -> None:
    """``peers.decompression_limit`` (bench_small's "limit" rows) took each record's entries, so a
    format-v4 label frame shared by ~500 records was decoded ~500 times: the limit came out 1.38x
    too low on 20,000 mel records. It now takes each zstd frame once, as the loader decodes it."""
    import peers

    root = tmp_path / "mel"
    build(small_data.recipe("mel", 600, "zstd", shard_mb=0.5), root, workers=1, progress=False)
    sh = open_cache(root)
    assert sh.manifest.codec.share and sh.layout(0).shared.any()
    frames, records, array_bytes = peers._payloads(root, 600)
    distinct = {(s, j, int(o)) for s in range(len(sh.manifest.shards)) for j in range(len(sh.manifest.fields)) for o in sh.index(s)[:, j]["offset"]}
    assert records == 600 and len(frames) == len(distinct) < 2 * 600
    decoded = sum(len(zstandard.ZstdDecompressor().decompress(f)) for f in frames)
    assert array_bytes <= decoded < array_bytes + 4096 * len(frames)
    import bench_mel  # (its payload ratio summed a shared frame's size once per record: 0.015 for labels)

    stored = sum(int(sh.index(s)[:, 1]["size"][np.unique(sh.index(s)[:, 1]["offset"], return_index=True)[1]].sum()) for s in range(len(sh.manifest.shards)))
    assert sh.manifest.field_names[1] == "label" and bench_mel.payload_ratio(root, "label") == pytest.approx(2 * 600 / stored)
