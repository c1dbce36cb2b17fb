"""Problems a reviewer hit as a new user: URLs in --out, ignored cluster flags, HDF5 dataset typos, noisy refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cachebuild.format.manifest import read_manifest
from click.testing import CliRunner

from cachebuild.cli import main


def _run(args: list[str], cwd: Path):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, args, catch_exceptions=False)
    finally:
        os.chdir(old)


@pytest.mark.parametrize("cmd", [["generate", "--graphs", "20"], ["mel", "--synthetic", "6"]])
def test_out_url_is_not_folded_into_a_local_folder(tmp_path, cmd):
    """click.Path used to turn file:///x into ./file:/x and report success."""
    target = tmp_path / "target" / "c"
    work = tmp_path / "work"
    work.mkdir()
    r = _run([*cmd, "--out", f"file://{target}", "-q", "-j", "1"], work)
    assert r.exit_code == 0, r.output
    assert (target / "manifest.json").exists()
    assert list(work.iterdir()) == []  # nothing landed in the working directory


@pytest.mark.parametrize("args,flag", [(["--scheduler", "tcp://127.0.0.1:1"], "--scheduler"), (["--address", "auto"], "--address")])
def test_a_cluster_address_without_its_backend_is_refused(tmp_path, args, flag):
    r = _run(["generate", "--graphs", "20", "--out", str(tmp_path / "c"), "-q", *args], tmp_path)
    assert r.exit_code == 2 and flag in r.output and "--backend" in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists()


def _h5(path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f.create_dataset("labels", data=np.array([0, 1, 0, 1], dtype=np.int16))
        f.create_dataset("segments_waveform", data=(rng.standard_normal((4, 40, 2, 512)) * 0.05).astype(np.float32))
        f.create_dataset("segments_mel", data=np.zeros((4, 40, 2, 64, 1), np.float16))
        f.attrs["label2id_json"] = json.dumps({"LEAK": 0, "NOLEAK": 1})


def test_a_misspelt_hdf5_dataset_is_refused_not_replaced(tmp_path):
    """--h5-dataset mel=typo used to recompute the mels from the waveforms without a word."""
    _h5(tmp_path / "u.h5")
    r = _run(["mel", "--from-h5", str(tmp_path / "u.h5"), "--h5-dataset", "mel=segments_mell", "--out", str(tmp_path / "c"), "-q"], tmp_path)
    assert r.exit_code != 0 and "segments_mell" in r.output and "segments_mel" in r.output
    assert len(r.output.strip().splitlines()) == 1
    r = _run(["mel", "--from-h5", str(tmp_path / "u.h5"), "--h5-dataset", "spectra=x", "--out", str(tmp_path / "c"), "-q"], tmp_path)
    assert r.exit_code == 2 and "labels, mel, waveform" in r.output


def test_an_overflowing_recipe_is_refused_in_one_line_without_numpy_warnings(tmp_path):
    args = [
        "generate",
        "--graphs",
        "40",
        "--out",
        str(tmp_path / "c"),
        "-q",
        "-j",
        "1",
        "--mechanism",
        "linear",
        "--n-min",
        "40",
        "--n-max",
        "60",
        "--set",
        "mechanism.weights=signed_uniform",
        "--set",
        "mechanism.w_lo=90",
        "--set",
        "mechanism.w_hi=100",
        "--set",
        "graph.family=er",
        "--set",
        "graph.expected_degree=30",
    ]
    # a real process: pytest would capture numpy's RuntimeWarnings that a user sees on stderr
    r = subprocess.run(
        [sys.executable, "-c", "from cachebuild.cli import main; main()", *args], capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    )
    assert r.returncode == 2, r.stderr
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert len(lines) == 1 and "non-finite" in lines[0] and "clip_value" not in lines[0], r.stderr


def test_an_output_server_that_refuses_writes_gives_one_line(tmp_path):
    """An http:// output whose server has no PUT (python's http.server answers 501): one line, exit 5, no traceback."""
    pytest.importorskip("aiohttp")
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/nowhere/c"
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                "from cachebuild.cli import main; main()",
                "build",
                "--config",
                str(Path(__file__).resolve().parents[1] / "configs" / "causal-linear.toml"),
                "--records",
                "20",
                "--out",
                url,
                "-q",
                "-j",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])),
        )
    finally:
        server.shutdown()
        server.server_close()
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert r.returncode == 5 and len(lines) == 1 and url in lines[0] and "Traceback" not in r.stderr, r.stderr[-2000:]


def _gen(out: Path, *extra: str):
    return CliRunner().invoke(main, ["generate", "--graphs", "300", "--shard-mb", "2", "-j", "1", "-q", "--out", str(out), *extra], catch_exceptions=False)


def test_a_rerun_rebuilds_shards_that_were_truncated_or_deleted(tmp_path):
    out = tmp_path / "c"
    assert _gen(out).exit_code == 0
    ref = {p.name: p.read_bytes() for p in out.glob("shard-*") if not p.name.endswith(".json")}
    shards = sorted(out.glob("shard-*.tar"))
    assert len(shards) >= 3
    with open(shards[1], "r+b") as fh:
        fh.truncate(1000)
    (out / read_manifest(out).shards[2].index).unlink()
    r = _gen(out)
    assert r.exit_code == 0 and "2 built" in r.output, r.output
    assert {p.name: p.read_bytes() for p in out.glob("shard-*") if not p.name.endswith(".json")} == ref
    r = _gen(out)
    assert "already complete" in r.output or "nothing to do" in r.output, r.output


def test_a_build_that_failed_before_its_first_shard_does_not_block_the_folder(tmp_path):
    out = tmp_path / "c"
    bad = _gen(
        out,
        "--mechanism",
        "linear",
        "--n-min",
        "40",
        "--n-max",
        "60",
        "--set",
        "mechanism.weights=signed_uniform",
        "--set",
        "mechanism.w_lo=90",
        "--set",
        "mechanism.w_hi=100",
        "--set",
        "graph.family=er",
        "--set",
        "graph.expected_degree=30",
    )
    assert bad.exit_code == 2
    r = _gen(out)  # another recipe, no --overwrite needed: nothing was built
    assert r.exit_code == 0, r.output
    assert (out / "manifest.json").exists()


def test_a_recipe_of_another_kind_names_the_command_that_builds_it(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    r = _run(["generate", "--config", str(repo / "configs" / "mel-leak.toml"), "--out", str(tmp_path / "c"), "-q"], tmp_path)
    assert r.exit_code == 2 and "kind = 'mel'" in r.output and "cachebuild build" in r.output
    r = _run(["build", "--config", str(repo / "configs" / "mel-leak.toml"), "--out", str(tmp_path / "c"), "-q"], tmp_path)
    assert r.exit_code == 2 and "[source] table" in r.output
    assert not (tmp_path / "c").exists()


def test_an_unknown_view_lists_every_view():
    from loaders.views import make_view

    with pytest.raises(ValueError, match="mel, mel_files"):
        make_view("nope", None, 8)


def test_inspect_prints_mel_recipe_keys_that_set_accepts(tmp_path):
    """Every `key = value` line under 'recipe:' of a mel cache is accepted back by `cachebuild mel --set`."""
    assert _run(["mel", "--synthetic", "4", "--out", str(tmp_path / "a"), "-q", "-j", "1"], tmp_path).exit_code == 0
    out = _run(["inspect", str(tmp_path / "a")], tmp_path).output.splitlines()
    start = out.index("recipe:") + 1
    keys = [line.strip() for line in out[start:] if line.startswith("  ")]
    keys = keys[: next((i for i, k in enumerate(keys) if k.startswith("source.")), len(keys))]
    assert keys and not any(k.startswith("mel.") for k in keys)
    sets = [a for k in keys if " = null" not in k for a in ("--set", k.replace(" = ", "=", 1).replace('"', ""))]
    r = _run(["mel", "--synthetic", "4", "--out", str(tmp_path / "b"), "-q", "-j", "1", *sets], tmp_path)
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("argv", [["generate", "--workers", "0"], ["generate", "--graphs", "abc"], ["nope"], ["stage"], ["generate", "--no-such-flag"]])
def test_usage_errors_are_one_line_with_a_pointer_to_help(argv):
    r = subprocess.run(
        [sys.executable, "-c", "from cachebuild.cli import main; main()", *argv], capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    )
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "--help" in lines[0], r.stderr


def test_a_rank_outside_the_world_is_refused_at_construction(tmp_path):
    from loaders import ShardStream

    assert _gen(tmp_path / "c").exit_code == 0
    for rank, world in ((3, 2), (0, 0), (-1, 2)):
        with pytest.raises(ValueError, match="world"):
            ShardStream(tmp_path / "c", view="graphs", batch_size=8, rank=rank, world_size=world)


def test_a_wav_folder_without_audio_is_a_bad_input_exit_6(tmp_path):
    (tmp_path / "wav" / "LEAK").mkdir(parents=True)
    r = _run(["mel", "--from-wav", str(tmp_path / "wav"), "--out", str(tmp_path / "c"), "-q"], tmp_path)
    assert r.exit_code == 6 and "no usable audio files" in r.output
