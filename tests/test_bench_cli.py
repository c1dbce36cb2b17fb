"""`cachebuild bench`: JSON schema, --compare, mel caches with the default view, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cachebuild.cli import main

SCHEMA = {
    "cache": str,
    "view": str,
    "batch_size": int,
    "workers": int,
    "step_ms": float,
    "batches": int,
    "records_per_s": float,
    "samples_per_s": float,
    "payload_mb_per_s": float,
    "first_batch_s": float,
    "wait_fraction": float,
    "stages_ms": dict,
}
STAGES = ("read", "decompress", "assemble", "pin", "copy")
COMPARE = ("reader", "batches", "records_per_s", "samples_per_s", "payload_mb_per_s", "first_batch_s", "wait_fraction")


def _bench(*args: str):
    return CliRunner().invoke(main, ["bench", *args])


@pytest.fixture(scope="module")
def causal_cache(tmp_path_factory) -> Path:
    from cachebuild.jobs import run_causal_build

    out = tmp_path_factory.mktemp("bench") / "causal"
    run_causal_build(None, [], {"graphs": 300, "build.shard_mb": 1}, out, workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def mel_cache(tmp_path_factory) -> Path:
    from cachebuild.jobs import run_mel_build

    out = tmp_path_factory.mktemp("bench") / "mel"
    run_mel_build(None, [], {"build.shard_mb": 1}, out, synthetic=60, workers=1, progress=False)
    return out


def _check_schema(d: dict) -> None:
    for key, typ in SCHEMA.items():
        assert key in d, key
        assert isinstance(d[key], typ) or (typ is float and isinstance(d[key], int)), (key, d[key])
    assert "compare" in d
    for s in STAGES:
        assert s in d["stages_ms"]
    assert d["stages_ms"]["read"] >= 0 and d["stages_ms"]["decompress"] >= 0 and d["stages_ms"]["assemble"] >= 0
    assert 0.0 <= d["wait_fraction"] <= 1.0
    assert d["records_per_s"] > 0 and d["samples_per_s"] > 0 and d["payload_mb_per_s"] > 0 and d["first_batch_s"] > 0


def test_json_schema_causal_default_view(causal_cache):
    r = _bench(str(causal_cache), "--batches", "6", "--workers", "0", "--batch-size", "16", "--sample", "2", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    _check_schema(d)
    assert d["view"] == "graphs" and d["batch_size"] == 16 and d["workers"] == 0 and d["batches"] == 6
    assert d["compare"] is None
    assert d["records_per_s"] == pytest.approx(d["samples_per_s"])  # one graph per row
    import torch

    if not torch.cuda.is_available():
        assert d["stages_ms"]["pin"] is None and d["stages_ms"]["copy"] is None


def test_table_output_and_step_consumer(causal_cache):
    r = _bench(str(causal_cache), "--view", "twins", "--batches", "5", "--workers", "1", "--batch-size", "2048", "--step-ms", "5", "--sample", "2")
    assert r.exit_code == 0, r.output
    for word in ("records/s", "samples/s", "payload MB/s", "time to first batch", "wait fraction", "read", "decompress", "assemble", "pin", "copy"):
        assert word in r.output
    assert "sleep (5 ms/step)" in r.output


def test_compare_webdataset(causal_cache):
    pytest.importorskip("webdataset")
    r = _bench(str(causal_cache), "--batches", "4", "--workers", "0", "--batch-size", "16", "--sample", "1", "--compare", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    _check_schema(d)
    c = d["compare"]
    for key in COMPARE:
        assert key in c, key
    assert c["reader"] == "webdataset" and c["batches"] == 4 and c["records_per_s"] > 0 and c["payload_mb_per_s"] > 0


def test_compare_without_webdataset_is_clear(causal_cache, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_wds(name, *a, **kw):
        if name == "webdataset":
            raise ImportError("no webdataset")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_wds)
    r = _bench(str(causal_cache), "--batches", "3", "--workers", "0", "--batch-size", "16", "--sample", "1", "--compare")
    assert r.exit_code == 2
    assert "webdataset" in r.output and "pip install" in r.output


def test_mel_cache_default_view(mel_cache):
    r = _bench(str(mel_cache), "--batches", "4", "--workers", "0", "--batch-size", "1024", "--sample", "2", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    _check_schema(d)
    assert d["view"] == "mel"
    assert d["samples_per_s"] == pytest.approx(80 * d["records_per_s"])  # 40 x 2 segments per file


def test_mel_files_view_and_compare(mel_cache):
    pytest.importorskip("webdataset")
    r = _bench(str(mel_cache), "--view", "mel_files", "--batches", "3", "--workers", "0", "--batch-size", "8", "--sample", "1", "--compare", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["view"] == "mel_files" and d["compare"]["batch_records"] == 8


def test_missing_cache(tmp_path):
    r = _bench(str(tmp_path / "nope"), "--batches", "3")
    assert r.exit_code != 0
    assert r.output.startswith("error:") and "manifest" in r.output and "Traceback" not in r.output


def test_unknown_view(causal_cache):
    r = _bench(str(causal_cache), "--view", "nope", "--batches", "3")
    assert r.exit_code == 2
    assert "unknown view 'nope'" in r.output and "graphs" in r.output and "mel" in r.output


def test_view_that_does_not_fit_the_cache(mel_cache):
    r = _bench(str(mel_cache), "--view", "graphs", "--batches", "3")
    assert r.exit_code == 2 and "error:" in r.output and "adj" in r.output


def test_model_consumer_refused_without_cuda(causal_cache):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present: the model consumer runs")
    r = _bench(str(causal_cache), "--consumer", "model", "--batches", "3")
    assert r.exit_code == 2 and "GPU" in r.output and "--step-ms" in r.output


def test_bad_limits(causal_cache):
    r = _bench(str(causal_cache), "--batches", "1")
    assert r.exit_code == 2 and "--batches" in r.output


def test_drain_clock_starts_after_the_warm_up_batch() -> None:
    """A first step slower than ``seconds`` (a model's CUDA set-up) must not end the run before
    anything was measured: on an H100, ``bench --consumer model --seconds 6`` drained 1 batch."""
    import time as _time

    from loaders.bench.drain import drain

    calls: list[int] = []

    def consume(batch: int) -> None:
        calls.append(batch)
        if len(calls) == 1:
            _time.sleep(0.3)

    summary, done = drain(lambda epoch: range(50) if epoch == 0 else range(0), lambda b: 1, consume, 0.1, None)
    assert done > 2 and summary.steps >= 1
