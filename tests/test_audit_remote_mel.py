"""Acceptance audit of issues 4, 5 and 6 (seventeenth session): what it found, as tests.

Builds on a running Dask cluster whose workers were started in another folder: a relative
``--out`` (the README's ``--out cache/mel``), ``--from-wav DIR`` or ``--from-h5 FILE`` reached
the workers as relative paths, so they failed ("cannot write cache/shard-00000.tar: No such file
or directory", "leaks.h5: no such file") or, had that relative path existed in the worker's
folder, read or written the wrong place. Sources and outputs sent to workers now carry absolute
paths (the manifest and the messages of the build's own process keep the user's spelling).

`cachebuild bench`'s per-stage times of a view that decodes whole pools (`mel`, `twins`):
the whole pool was decoded in the untimed warm-up batch, so on a cache of one pool (a mel
cache of up to 6,553 files at the default ``mix="auto"``) every sampled batch read and
decompressed nothing and the table said ``read 0`` and ``decompress 0`` on a zstd cache.

Also: a build to ``s3://`` left its empty local staging folder in ``$TMPDIR``; a float32
``segments_mel`` was rounded to float16 without a word; ``cachebuild stage``'s free-space check
left out most of the manifest and stamp, so a target that passed it could fill up at the end.
"""

from __future__ import annotations

import os
import wave
from pathlib import Path

import numpy as np
import pytest

from loaders import ShardStream
from loaders.bench.stages import stage_times


@pytest.fixture(scope="module")
def zstd_mel(tmp_path_factory) -> Path:
    from cachebuild.jobs import run_mel_build

    out = tmp_path_factory.mktemp("audit") / "mel"
    run_mel_build(None, [], {"build.shard_mb": 0.2, "build.codec": "zstd"}, out, synthetic=48, workers=1, progress=False)
    return out


def test_bench_stages_of_a_pooled_view_count_the_pool_decode(zstd_mel: Path) -> None:
    """A zstd mel cache of one pool: read and decompress are the epoch's decode spread over its batches, not 0."""
    stream = ShardStream(zstd_mel, view="mel", batch_size=256, shuffle=True, seed=0)
    plan = stream.plan(0)
    assert plan.pools is not None and len(plan.pools) == 2  # one pool: the warm-up batch decodes all of it
    got = stage_times(stream, sample=4)
    assert got["sampled_batches"] == 4
    assert got["read"] > 0 and got["decompress"] > 0, got
    assert got["assemble"] >= 0


def test_bench_stages_of_an_unpooled_view_unchanged(zstd_mel: Path) -> None:
    """Without pools (``shuffle=False``) each sampled batch decodes its own records, as before."""
    stream = ShardStream(zstd_mel, view="mel", batch_size=256, shuffle=False)
    got = stage_times(stream, sample=4)
    assert got["read"] > 0 and got["decompress"] > 0, got


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_build_into_s3_leaves_no_staging_folder(tmp_path, monkeypatch) -> None:
    """A build to ``s3://`` staged each shard in ``$TMPDIR/cachebuild-staging/<digest>/`` and left that
    folder (empty) behind after every build; it is removed when the build is done (the parent too when empty)."""
    import tempfile

    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from conftest import build_toy
    from remote_fixtures import moto_s3

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    with moto_s3("audit") as (fs, options):
        summary = build_toy("s3://audit/toy", records=60, workers=1, storage_options=options)
        assert summary.built == summary.shards > 1
        assert "manifest.json" in [p.rsplit("/", 1)[-1] for p in fs.ls("audit/toy")]
    assert list(tmp.iterdir()) == []


def _write_wav(path: Path, samples: np.ndarray, rate: int = 4096) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((samples * 20000).astype("<i2").tobytes())


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_relative_paths_on_a_dask_cluster_started_elsewhere(tmp_path, monkeypatch) -> None:
    """A running Dask cluster whose workers' working folder is not the build's: relative --from-wav and --out."""
    distributed = pytest.importorskip("distributed")
    from cachebuild.jobs import run_mel_build

    here, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    elsewhere.mkdir()
    rng = np.random.default_rng(0)
    for label in ("LEAK", "NOLEAK"):
        for i in range(2):
            _write_wav(here / "wav" / label / f"{i}.wav", rng.uniform(-1, 1, 4096 * 10))
    monkeypatch.chdir(elsewhere)  # the cluster's workers start here
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0") as cluster:
        monkeypatch.chdir(here)
        summary = run_mel_build(None, [], {}, "cache", from_wav="wav", workers=1, backend="dask", address=cluster.scheduler_address, progress=False)
    assert summary.records == 4
    assert (here / "cache" / "manifest.json").is_file()
    assert os.listdir(elsewhere) == []
    run_mel_build(None, [], {}, here / "local", from_wav=here / "wav", workers=1, progress=False)
    for name in ("shard-00000.tar", "shard-00000.idx.npy"):
        assert (here / "cache" / name).read_bytes() == (here / "local" / name).read_bytes()


def test_stored_float32_mels_cast_to_float16_are_named(tmp_path) -> None:
    """The README says stored mels are "copied as they are"; a float32 ``segments_mel`` was rounded to the
    config's float16 without a word. Now a warning names the file, the dataset, both dtypes and the flag;
    with ``--set dtype=float32`` the values are kept exactly, with no warning."""
    import warnings

    h5py = pytest.importorskip("h5py")
    from cachebuild.jobs import run_mel_build
    from cachebuild.mel.h5 import StoredMelWarning

    mel = np.random.default_rng(0).normal(-40, 10, (3, 40, 2, 64, 1)).astype(np.float32)
    path = tmp_path / "f32.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("labels", data=np.array([0, 1, 0], dtype=np.int16))
        f.create_dataset("segments_mel", data=mel)
    with pytest.warns(StoredMelWarning, match=r"f32\.h5: dataset 'segments_mel' is float32, stored as float16.*--set dtype=float32"):
        run_mel_build(None, [], {}, tmp_path / "c16", from_h5=path, workers=1, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_mel_build(None, ["dtype=float32"], {}, tmp_path / "c32", from_h5=path, workers=1, progress=False)
    stream = ShardStream(tmp_path / "c32", view="mel_files", batch_size=3, shuffle=False)
    batch = next(iter(stream))
    assert batch["mel"].numpy().tobytes() == mel.tobytes()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_stage_space_check_counts_the_manifest_and_stamp(tmp_path) -> None:
    """The free-space check counted one block each for the manifest and the stamp; a cache of a few dozen
    shards has a manifest of several blocks and a stamp of ~190 bytes per file, rewritten atomically (old
    and new at once), so a tmpfs that passed the check filled up after every shard was copied ("cannot
    write .../manifest.json: disk full"), leaving the copies behind. Now such a target is refused before
    anything is written, and a little more room works."""
    import subprocess

    from cachebuild.errors import OutputError
    from cachebuild.format.manifest import read_manifest
    from cachebuild.tools.stage import stage_cache

    from conftest import build_toy

    src = tmp_path / "src"
    build_toy(src, records=300, shard_bytes=8_000)
    m = read_manifest(src)
    assert len(m.shards) >= 15 and (src / "manifest.json").stat().st_size > 4096
    files = [src / e.name for e in m.shards] + [src / e.index for e in m.shards]
    old_need = sum(-(-p.stat().st_size // 4096) * 4096 for p in files) + 2 * 4096
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for size, fits in ((old_need, False), (old_need + 64 * 1024, True)):
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True).returncode:
            pytest.skip("cannot mount a tmpfs here")
        try:
            if fits:
                assert stage_cache(src, mnt / "c", progress=False).manifest_written
            else:
                with pytest.raises(OutputError, match=r"not enough space to stage"):
                    stage_cache(src, mnt / "c", progress=False)
                assert not (mnt / "c").exists()
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
