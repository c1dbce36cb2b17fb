"""StallMonitor outputs: the logging hook (any logger, TensorBoard), the per-epoch table, the PNG plot, bench --plot."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import struct
import time
import zlib
from pathlib import Path

import pytest
import torch

from loaders.monitor import StallMonitor
from loaders.monitor_out import METRIC_KEYS, tensorboard_hook


def _epoch(monitor: StallMonitor, n: int, delay_s: float = 0.0) -> None:
    def batches():
        for _ in range(n):
            if delay_s:
                time.sleep(delay_s)
            yield torch.zeros(4, 2)

    for _ in monitor.wrap(batches()):
        pass


def _check_png(path: Path) -> tuple[int, int]:
    """Walk the PNG's chunks (signature, IHDR first, CRCs, IDAT that inflates, IEND last); (width, height)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, kinds, idat = 8, [], b""
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos : pos + 4]), data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        assert struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])[0] == zlib.crc32(kind + body), kind
        kinds.append(kind)
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds
    width, height = struct.unpack(">II", data[16:24])
    assert len(zlib.decompress(idat)) >= height * width  # a whole image's rows
    return width, height


def test_hook_gets_a_dict_every_n_steps_and_one_per_epoch():
    calls = []
    monitor = StallMonitor(log_every=10, on_log=lambda m, step: calls.append((step, m)), sample_every_s=None, warn=None)
    _epoch(monitor, 35)
    _epoch(monitor, 20)
    steps = [s for s, _ in calls]
    assert steps == [10, 20, 30, 35, 45, 55, 55]  # windows at 10, 20, 30; epoch end 35; then global steps go on
    window, epoch_end = calls[0][1], calls[3][1]
    assert set(window) <= set(METRIC_KEYS) and {"data/wait_fraction", "data/batches_per_s", "data/samples_per_s"} <= set(window)
    assert all(isinstance(v, float) for v in window.values())
    assert set(epoch_end) == {f"epoch/{k}" for k in window} and epoch_end["epoch/data/samples_per_s"] > 0


def test_tensorboard_hook_writes_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    hook = tensorboard_hook(tmp_path / "tb")
    monitor = StallMonitor(log_every=5, on_log=hook, sample_every_s=None, warn=None)
    _epoch(monitor, 12)
    hook.writer.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "data/wait_fraction" in tags and "epoch/data/batches_per_s" in tags
    assert [e.step for e in acc.Scalars("data/batches_per_s")] == [5, 10]


def test_table_has_a_row_per_epoch_and_is_logged(caplog):
    monitor = StallMonitor(sample_every_s=None, warn=None, epoch_table=True)
    with caplog.at_level(logging.INFO, logger="loaders.monitor"):
        _epoch(monitor, 12, 0.001)
        _epoch(monitor, 7)
    lines = monitor.table().splitlines()
    assert lines[0].split()[:3] == ["epoch", "steps", "wait"] and len(lines) == 4
    assert lines[2].split()[:2] == ["0", "11"] and lines[3].split()[:2] == ["1", "6"]  # warm-up step left out
    assert "epochs so far" in caplog.text and lines[3] in caplog.text


def test_plot_is_a_valid_png(tmp_path):
    pytest.importorskip("matplotlib")
    monitor = StallMonitor(sample_every_s=None, warn=None)
    with pytest.raises(ValueError, match="nothing to plot"):
        monitor.plot(tmp_path / "empty.png")
    _epoch(monitor, 30, 0.001)
    _epoch(monitor, 10)
    w, h = _check_png(monitor.plot(tmp_path / "stalls.png"))
    assert (w, h) == (1000, 600)


def test_bench_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from cachebuild.cli import main
    from loader_fixtures import build_causal

    cache = build_causal(tmp_path / "cache", graphs=60)
    out = tmp_path / "bench.png"
    r = CliRunner().invoke(main, ["bench", str(cache), "--batches", "12", "--workers", "0", "--plot", str(out)])
    assert r.exit_code == 0, r.output
    assert f"plot: {out}" in r.output
    _check_png(out)
    r = CliRunner().invoke(main, ["bench", str(cache), "--batches", "4", "--plot", str(tmp_path / "no" / "x.png")])
    assert r.exit_code == 5 and "does not exist" in r.output


@contextlib.contextmanager
def _tmpfs(where: Path, options: str):
    """A real small tmpfs at ``where`` (root only), unmounted afterwards."""
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)


def test_bench_plot_into_a_read_only_folder_is_refused_before_the_run(tmp_path):
    """An unwritable --plot folder is one line and exit 5 before the drain, not a traceback after it."""
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from cachebuild.cli import main
    from loader_fixtures import build_causal

    cache = build_causal(tmp_path / "cache", graphs=60)
    with _tmpfs(tmp_path / "ro", "ro,size=64k") as ro:
        t0 = time.perf_counter()
        r = CliRunner().invoke(main, ["bench", str(cache), "--seconds", "30", "--workers", "0", "--plot", str(ro / "x.png")])
        assert r.exit_code == 5 and "not writable" in r.output, r.output
        assert time.perf_counter() - t0 < 25  # refused up front, not after the 30 s run


def test_bench_plot_on_a_full_disk_is_one_line(tmp_path):
    """A PNG that does not fit (a real 8 KiB tmpfs) is an OutputError, exit 5, not a traceback."""
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from cachebuild.cli import main
    from loader_fixtures import build_causal

    cache = build_causal(tmp_path / "cache", graphs=60)
    with _tmpfs(tmp_path / "small", "size=8k") as small:
        r = CliRunner().invoke(main, ["bench", str(cache), "--batches", "30", "--workers", "0", "--plot", str(small / "x.png")])
    assert r.exit_code == 5 and "cannot write the PNG" in r.output, r.output
    assert isinstance(r.exception, SystemExit), r.exception
