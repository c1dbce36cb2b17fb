"""An ``--append`` onto a stranger's cache whose old index is corrupt (acceptance audit of issue 10,
leftovers): the append read the old indexes (for the new manifest's field schemas) only after building
its generation, so it was refused (exit 5) with the new shard and ``generations/`` left behind. It now
reads and checks them before it writes anything: refused, the cache folder is as it was."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pytest

from conftest import build_toy
from cachebuild.errors import OutputError
from hostile_fixtures import copy_cache, load_doc, rehash, save_doc


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("append") / "good"
    build_toy(root, records=120)
    return root


def _object_index(root: Path, doc: dict, i: int) -> None:
    """Shard ``i``'s index replaced by an object-dtype (pickled) ``.npy``, its size and sha256 recomputed."""
    buf = io.BytesIO()
    np.save(buf, np.array([[{"x": 1}]], dtype=object), allow_pickle=True)
    (root / doc["shards"][i]["index"]).write_bytes(buf.getvalue())
    rehash(root, doc, i)


def _state(root: Path) -> dict[str, str]:
    """Every file under ``root`` (but the build lock) and its sha256."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".cachebuild-build.lock"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shard", [0, -1])
def test_an_append_onto_a_corrupt_old_index_writes_nothing(tmp_path: Path, good: Path, shard: int) -> None:
    from cachebuild import build
    from cachebuild.testing import ToySource

    root = copy_cache(good, tmp_path / "cache")
    doc = load_doc(root)
    _object_index(root, doc, shard % len(doc["shards"]))
    save_doc(root, doc)
    before = _state(root)
    with pytest.raises(OutputError, match=r"index .*\.idx\.npy: (unreadable|unexpected layout)") as info:
        build(ToySource(), root, records=40, append=True, shard_mb=0.02, progress=False, workers=1)
    assert info.value.exit_code == 5 and "\n" not in str(info.value)
    assert _state(root) == before  # was: the new generation's shard, index and marker, and generations/ (a snapshot, append.json)
    assert not (root / "generations").exists()
