"""The house (issue 13): what moved keeps working, declared fields are the fields read, one exit-code table."""

from __future__ import annotations

import importlib
import sys
import warnings

import click
import numpy as np
import pytest
import zstandard
from click.testing import CliRunner

from cachebuild import errors
from cachebuild.cli.errors import EXIT_INTERRUPTED, friendly
from loader_fixtures import build_mel_from_arrays, causal_cache  # noqa: F401
from loaders import ShardStream
from loaders.bench.stages import payload_fields, read_and_decompress, stored_payloads
from cachebuild.format.reader import ShardSet


@pytest.mark.parametrize("name, module", [("EpochPlan", "loaders.plan"), ("BatchItems", "loaders.plan"), ("epoch_order", "loaders.plan"), ("Layout", "loaders.batch"), ("Field", "loaders.batch")])
def test_internals_still_import_from_loaders_with_a_warning(name, module):
    import loaders

    assert name not in loaders.__all__
    with pytest.warns(DeprecationWarning, match=f"loaders.{name} is internal.*{module}"):
        got = getattr(loaders, name)
    assert got is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        loaders.nope  # noqa: B018


def test_public_names_import_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from loaders import ShardStream, make_loader, to_device  # noqa: F401


def test_mel_eval_alias_warns_and_is_the_voting_module():
    from cachebuild.mel import voting

    sys.modules.pop("loaders.mel_eval", None)
    with pytest.warns(DeprecationWarning, match="cachebuild.mel.voting"):
        old = importlib.import_module("loaders.mel_eval")
    assert old.file_votes is voting.file_votes and set(old.__all__) == set(voting.__all__)


@pytest.fixture(scope="module")
def mel_cache(tmp_path_factory):
    return build_mel_from_arrays(tmp_path_factory.mktemp("house") / "mel", files=12, codec="zstd")


def _spy_reads(monkeypatch, stream: ShardStream) -> set[str]:
    """The fields the view really hands to read_block for one batch (a spy on the view's module)."""
    module = sys.modules[type(stream.view).__module__]
    real = module.read_block
    seen: set[str] = set()

    def spy(shards, ids, fields, threads=1):
        seen.update(fields)
        return real(shards, ids, fields, threads)

    monkeypatch.setattr(module, "read_block", spy)
    shards = ShardSet(stream.manifest, stream.root)
    try:
        _, arrays = stream.layout.allocate(False)
        stream.view.assemble(shards, stream.plan(0).batch(0), arrays)
    finally:
        shards.close()
    return seen


@pytest.mark.parametrize("view, options", [("graphs", {}), ("graphs", {"delta": "stored"}), ("twins", {"compact": True}), ("twins", {}), ("records", {}), ("mel", {}), ("mel_files", {})])
def test_views_declare_the_fields_they_read(view, options, causal_cache, mel_cache, monkeypatch):  # noqa: F811
    cache = mel_cache if view.startswith("mel") else causal_cache
    stream = ShardStream(cache, view=view, batch_size=64, shuffle=True, seed=1, **options)
    assert set(stream.view.decoded_fields()) == _spy_reads(monkeypatch, stream)


def test_stored_payloads_are_the_index_sizes_and_decode_to_the_array_bytes(causal_cache):  # noqa: F811
    stream = ShardStream(causal_cache, view="graphs", batch_size=16)
    fields = payload_fields(stream)
    shards = ShardSet(stream.manifest, stream.root)
    try:
        ids = np.array([0, 5, len(shards.index(0)) + 1, stream.manifest.records - 1])
        stored = stored_payloads(shards, ids, fields)
        s, local = shards.locate(ids)
        want = sum(int(shards.index(int(a))[b, shards.field_pos[n]]["size"]) for a, b in zip(s, local) for n in fields)
        assert len(stored) == len(ids) * len(fields) and sum(len(p) for p in stored) == want
        nbytes = sum(int(shards.index(int(a))[b, shards.field_pos[n]]["nbytes"]) for a, b in zip(s, local) for n in fields)
        decoded = sum(len(zstandard.ZstdDecompressor().decompress(p)) for p in stored)
        assert nbytes <= decoded < nbytes + 256 * len(stored)  # array data + a .npy header each
        read, dec = read_and_decompress(shards, ids, fields)
        assert read >= 0 and dec > 0
    finally:
        shards.close()


@pytest.mark.parametrize(
    "exc, code",
    [
        (errors.CacheBuildError, 1),
        (errors.ConfigError, 2),
        (errors.ShardCorruptError, 3),
        (errors.ManifestError, 3),
        (errors.CacheMismatchError, 4),
        (errors.OutputError, 5),
        (errors.SourceError, 6),
        (errors.RemoteError, 7),
        (errors.SharedMemoryError, 2),
        (KeyboardInterrupt, EXIT_INTERRUPTED),
    ],
)
def test_one_place_maps_errors_to_exit_codes(exc, code):
    @click.command()
    @friendly
    def boom() -> None:
        raise exc("it broke") if exc is not KeyboardInterrupt else exc()

    r = CliRunner().invoke(boom, [])
    assert r.exit_code == code
    assert r.output.startswith("error: it broke") if exc is not KeyboardInterrupt else r.output.startswith("interrupted")
