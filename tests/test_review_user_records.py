"""Found in review, as a user of the open builder: a field named like a key the ``records`` view adds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cachebuild import FunctionSource, build
from cachebuild.errors import ConfigError
from loaders import ShardStream


def _clashing(rng: np.random.Generator, index: int) -> dict:
    return {"x": np.zeros(1 + index % 3, np.float32), "x_shape": np.zeros(2, np.int64), "record_id": np.int64(index)}


@pytest.fixture(scope="module")
def clashing_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clash") / "c"
    source = FunctionSource.per_record(_clashing, {"x": "float32", "x_shape": "int64", "record_id": "int64"})
    build(source, root, records=20, workers=1, progress=False)
    return root


def test_a_field_named_like_a_records_view_key_is_refused_naming_it(clashing_cache: Path) -> None:
    with pytest.raises(ConfigError) as err:  # was: IndexError deep in the batch assembly
        ShardStream(clashing_cache, view="records", batch_size=4)
    assert "'record_id'" in str(err.value) and "fields=" in str(err.value)
    with pytest.raises(ConfigError, match="'x_shape'"):
        ShardStream(clashing_cache, view="records", batch_size=4, fields=["x", "x_shape"])


def test_leaving_the_clashing_fields_out_streams_the_rest(clashing_cache: Path) -> None:
    stream = ShardStream(clashing_cache, view="records", batch_size=4, fields=["x"], shuffle=False)
    ids = np.concatenate([b["record_id"].numpy() for b in stream])
    assert sorted(ids.tolist()) == list(range(20))
