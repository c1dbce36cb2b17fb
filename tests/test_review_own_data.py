"""Review of "bring your own data" as a new user: what a source that misbehaves is told."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cachebuild import FunctionSource, build
from cachebuild.errors import SourceError


def _returns_none(rng: np.random.Generator, index: int) -> Any:
    return None


def _block_returns_list(rng: np.random.Generator, start: int, stop: int) -> Any:
    return [np.zeros(2, np.float32)] * (stop - start)


def _block_scalar_column(rng: np.random.Generator, start: int, stop: int) -> Any:
    return {"x": 3}


@pytest.mark.parametrize(
    "source, words",
    [
        (FunctionSource.per_record(_returns_none, {"x": "float32"}), "returned a NoneType, not a dict of fields (sizing a probe record"),
        (FunctionSource.per_block(_block_returns_list, {"x": "float32"}), "returned a list, not a dict of fields (sizing a probe block"),
        (FunctionSource.per_block(_block_scalar_column, {"x": "float32"}), "field 'x': a block of records [0, 10) needs 10 rows, got no"),
    ],
)
def test_a_function_that_returns_no_dict_is_told_so(tmp_path: Path, source: FunctionSource, words: str) -> None:
    """It used to read "raised AttributeError: 'NoneType' object has no attribute 'values'" (the builder's own call)."""
    with pytest.raises(SourceError) as info:
        build(source, tmp_path / "c", records=10, workers=1, progress=False)
    msg = str(info.value)
    assert words in msg and "\n" not in msg and "AttributeError" not in msg and "TypeError" not in msg, msg
    assert msg.startswith(f"source {source.kind!r} shard 0 record 0")
