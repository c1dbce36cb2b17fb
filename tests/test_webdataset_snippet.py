"""The README's WebDataset snippet, executed as written, reads a zstd causal cache into our reader's arrays."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from loader_fixtures import Reference, causal_cache, causal_cache_raw  # noqa: F401

README = Path(__file__).resolve().parents[1] / "README.md"


def _snippet() -> str:
    text = README.read_text()
    block = re.search(r"<!-- webdataset-snippet -->\s*```python\n(.*?)```\s*<!-- /webdataset-snippet -->", text, re.S)
    assert block, "the README lost its WebDataset snippet"
    lines = block.group(1).splitlines()
    indent = min(len(x) - len(x.lstrip()) for x in lines if x.strip())
    return "\n".join(x[indent:] for x in lines)


@pytest.mark.parametrize("which", ["zstd", "raw"])
def test_readme_webdataset_snippet_equals_our_reader(causal_cache, causal_cache_raw, which):
    pytest.importorskip("webdataset")
    root = causal_cache if which == "zstd" else causal_cache_raw
    ref = Reference(root)
    urls = [str(root / s.name) for s in ref.manifest.shards]
    scope = {"urls": urls}
    exec(compile(_snippet(), str(README), "exec"), scope)
    fields = [f.name for f in ref.manifest.fields]
    seen = []
    for sample in scope["dataset"]:
        rid = int(sample["__key__"])
        ours = ref.record(rid)
        assert sorted(k for k in sample if k != "__key__") == sorted(fields) == sorted(ours)
        for name in fields:
            if isinstance(ours[name], np.ndarray):
                assert sample[name].dtype == ours[name].dtype and sample[name].shape == ours[name].shape, name
                np.testing.assert_array_equal(sample[name], ours[name], err_msg=name)
            else:
                assert sample[name] == ours[name], name
        seen.append(rid)
    assert seen == list(range(ref.manifest.records))
