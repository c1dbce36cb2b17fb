"""The block decoder's per-shard entry tables: built once per open shard, the bomb check still per block.

``read_block`` keeps, per open shard and list of fields, one integer table of
the index entries with each zstd frame's declared size parsed from its header
(``cachebuild.format.entries``). These tests check that the
headers are parsed once per open shard (again after a release), that blocks in
any order decode the same records, and that a bad frame is still reported for
the block that reads it, naming its record, while the rest of its shard reads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cachebuild.errors import ShardCorruptError
from cachebuild.format import entries
from cachebuild.format.decode import read_block
from cachebuild.format.reader import ShardSet, open_cache
from conftest import build_toy
from hostile_fixtures import field_pos, load_doc, rewrite_shard, save_doc, zstd_bomb


@pytest.fixture()
def toy(tmp_path: Path) -> Path:
    build_toy(tmp_path / "toy", records=240)
    return tmp_path / "toy"


def _array_fields(shards: ShardSet) -> list[str]:
    return [f.name for f in shards.manifest.fields if f.dtype != "json"]


def _padded(shards: ShardSet, ids: np.ndarray, name: str) -> np.ndarray:
    schema = shards.manifest.schema(name)
    out = np.zeros((len(ids),) + tuple(schema.max_shape), schema.dtype)
    read_block(shards, ids, [name])[name].scatter(out)
    return out


@pytest.fixture(params=["whole", "per_shard"])
def table_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """One table for the whole cache, or (a cache over WHOLE_TABLE_BYTES) one per shard."""
    if request.param == "per_shard":
        monkeypatch.setattr(entries, "WHOLE_TABLE_BYTES", 0)
    return str(request.param)


def test_frame_headers_are_parsed_once_per_open_shard(toy: Path, monkeypatch: pytest.MonkeyPatch, table_kind: str) -> None:
    calls: list[int] = []
    real = entries.frame_headers

    def counting(tar: np.ndarray, offset: np.ndarray) -> np.ndarray:
        calls.append(len(offset))
        return real(tar, offset)

    monkeypatch.setattr(entries, "frame_headers", counting)
    with open_cache(toy) as shards:
        fields = _array_fields(shards)
        shard_count = len(shards.manifest.shards)
        assert shard_count > 2
        ids = np.arange(shards.manifest.records)
        read_block(shards, ids, fields)
        assert len(calls) == shard_count  # one parse per shard, covering all its frames of these fields
        assert sum(calls) == shards.manifest.records * len(fields)
        for _ in range(3):
            read_block(shards, np.random.default_rng(0).permutation(ids)[:50], fields)
        assert len(calls) == shard_count  # later blocks reuse the tables
        shards.release([0])
        read_block(shards, ids[:3], fields)
        assert len(calls) == shard_count + 1  # a reopened shard builds its table again
        (table,) = shards.__dict__["_entry_tables"].values()
        assert (table.rows is None) == (table_kind == "per_shard")


def test_blocks_in_any_order_decode_the_same_records(toy: Path, table_kind: str) -> None:
    with open_cache(toy) as shards:
        ids = np.arange(shards.manifest.records)
        perm = np.random.default_rng(1).permutation(ids)
        for name in _array_fields(shards):
            whole = _padded(shards, ids, name)
            np.testing.assert_array_equal(_padded(shards, perm, name), whole[perm])
            np.testing.assert_array_equal(_padded(shards, np.repeat(ids[:7], 3), name), np.repeat(whole[:7], 3, axis=0))


def test_a_bad_frame_fails_its_block_only(toy: Path) -> None:
    doc = load_doc(toy)
    rewrite_shard(toy, doc, 0, {(1, field_pos(doc, "mat")): zstd_bomb(1 << 30)})
    save_doc(toy, doc)
    with open_cache(toy) as shards:
        fields = _array_fields(shards)
        first = int(shards.manifest.shards[0].records)
        ok = np.array([0] + list(range(2, first)))
        read_block(shards, ok, fields)  # the shard's table was built with the bad frame in it
        with pytest.raises(ShardCorruptError, match=r"record 0000000001, field 'mat': zstd frame declares 1073741824 bytes.*decompression bomb"):
            read_block(shards, np.array([2, 1, 0]), fields)
