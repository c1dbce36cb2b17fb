"""The README's WebDataset snippets, executed as written, read causal caches into our reader's arrays:
the three-line decoder on default (one member per record and field) caches, the index-aware one on
packed and unpacked caches."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from loader_fixtures import Reference, causal_cache, causal_cache_packed, causal_cache_raw  # noqa: F401

README = Path(__file__).resolve().parents[1] / "README.md"


def _snippet(tag: str = "webdataset-snippet") -> str:
    text = README.read_text()
    block = re.search(rf"<!-- {tag} -->\s*```python\n(.*?)```\s*<!-- /{tag} -->", text, re.S)
    assert block, "the README lost its WebDataset snippet"
    lines = block.group(1).splitlines()
    indent = min(len(x) - len(x.lstrip()) for x in lines if x.strip())
    return "\n".join(x[indent:] for x in lines)


def _assert_same_record(sample: dict, ours: dict) -> None:
    """A WebDataset sample (keys ``field[.ext...]``) holds exactly our reader's fields, dtypes, shapes and values."""
    got = {k.split(".")[0]: v for k, v in sample.items() if not k.startswith("__")}
    assert sorted(got) == sorted(ours)
    for name, value in ours.items():
        if isinstance(value, np.ndarray):
            assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
            np.testing.assert_array_equal(got[name], value, err_msg=name)
        else:
            assert got[name] == value, name


@pytest.mark.parametrize("which", ["zstd", "raw", "packed"])
def test_readme_webdataset_snippet_equals_our_reader(causal_cache, causal_cache_raw, causal_cache_packed, which):
    pytest.importorskip("webdataset")
    root = {"zstd": causal_cache, "raw": causal_cache_raw, "packed": causal_cache_packed}[which]
    ref = Reference(root)
    if which == "packed":  # (format v4: small entries of a member share zstd frames; the snippet reads them unchanged)
        from cachebuild.format.reader import open_cache

        assert ref.manifest.codec.share > 0 and open_cache(root).layout(0).shared.any()
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


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_three_line_decoder_reads_a_default_generate_cache(tmp_path, codec):
    """DESIGN.md's promise for the headline cache: ``cachebuild generate`` with its defaults writes
    one member per record and field, and plain WebDataset with the README's three-line ``.zst``
    decoder yields every record, in order, with our reader's arrays."""
    pytest.importorskip("webdataset")
    from click.testing import CliRunner

    from cachebuild.cli import main

    root = tmp_path / "c"
    r = CliRunner().invoke(main, ["generate", "--graphs", "40", "--out", str(root), "--shard-mb", "0.5", "--codec", codec, "--workers", "1", "-q"])
    assert r.exit_code == 0, r.output
    ref = Reference(root)
    assert ref.manifest.codec.pack == 1 and len(ref.manifest.shards) > 1
    scope = {"urls": [str(root / s.name) for s in ref.manifest.shards]}
    exec(compile(_snippet("webdataset-three-lines"), str(README), "exec"), scope)
    seen = []
    for sample in scope["dataset"]:
        rid = int(sample["__key__"])
        _assert_same_record(sample, ref.record(rid))
        seen.append(rid)
    assert seen == list(range(ref.manifest.records))


@pytest.mark.parametrize("args", [["--synthetic", "12"], ["--synthetic", "12", "--codec", "zstd"], ["--synthetic", "12", "--set", "n_mels=32"]])
def test_default_mel_caches_take_the_decoder_their_layout_needs(tmp_path, args):
    """``cachebuild mel`` with its defaults (a ~10 KB record) writes one member per record and field,
    which the three-line decoder reads into our reader's arrays; with records under 8 KiB
    (``n_mels=32``) it packs them, and the index-aware snippet reads those (review of the default pack)."""
    pytest.importorskip("webdataset")
    from click.testing import CliRunner

    from cachebuild.cli import main
    from cachebuild.format.reader import ShardSet
    from cachebuild.format.records import read_record

    root = tmp_path / "m"
    r = CliRunner().invoke(main, ["mel", *args, "--out", str(root), "--workers", "1", "-q"])
    assert r.exit_code == 0, r.output
    m = Reference(root).manifest
    small = "n_mels=32" in args
    assert m.codec.pack == (512 if small else 1)  # (a 32-mel record: 4-8 KiB, 512 per 4 MB member)
    scope = {"urls": [str(root / s.name) for s in m.shards]}
    exec(compile(_snippet("webdataset-snippet" if small else "webdataset-three-lines"), str(README), "exec"), scope)
    seen = []
    with ShardSet(m, root) as shards:
        for sample in scope["dataset"]:
            rid = int(sample["__key__"])
            _assert_same_record(sample, read_record(shards, rid))
            seen.append(rid)
    assert seen == list(range(m.records))
