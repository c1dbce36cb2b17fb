"""A shard index's ``.npy`` header as the writer writes it is read without ``ast`` (cachebuild/format/index.py):
``ast.literal_eval``, numpy's header parser, failed in a forked DataLoader worker in CI on CPython 3.11
("AST constructor recursion depth mismatch", python/cpython#106905). Any other header still goes to numpy."""

from __future__ import annotations

import ast
import io

import numpy as np
import pytest

from cachebuild.errors import ShardCorruptError
from cachebuild.format.index import INDEX_DTYPE, index_bytes, index_from_bytes


def _broken_ast(*args, **kwargs):
    raise SystemError("AST constructor recursion depth mismatch (before=219, after=239)")


@pytest.mark.parametrize("shape", [(0, 11), (1, 1), (313, 11), (70_000, 3)])
def test_the_writers_header_is_read_without_ast(monkeypatch, shape):
    index = np.zeros(shape, INDEX_DTYPE)
    index["offset"] = np.arange(index.size).reshape(shape)
    for data in (index_bytes(index), _plain(index)):
        monkeypatch.setattr(ast, "literal_eval", _broken_ast)
        got = index_from_bytes(data, "x.idx.npy", shape[1], shape[0])
        monkeypatch.undo()
        assert got.shape == shape and (got == index).all()


def _plain(index: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, index, allow_pickle=False)
    return buf.getvalue()


def test_another_header_still_goes_to_numpys_reader(monkeypatch):
    index = np.zeros((4, 2), INDEX_DTYPE)
    buf = io.BytesIO()
    np.lib.format.write_array(buf, index, version=(2, 0))  # valid, but not the writer's 1.0 layout
    data = buf.getvalue()
    assert index_from_bytes(data, "x").shape == (4, 2)
    monkeypatch.setattr(ast, "literal_eval", _broken_ast)
    with pytest.raises(SystemError):
        index_from_bytes(data, "x")


def test_a_header_that_lies_about_its_length_is_refused():
    data = bytearray(_plain(np.zeros((3, 2), INDEX_DTYPE)))
    data[9] += 1  # the header length field (+256) no longer matches the header
    with pytest.raises(ShardCorruptError, match="x.idx.npy"):
        index_from_bytes(bytes(data), "x.idx.npy")


def test_a_members_header_as_written_is_checked_without_ast(monkeypatch):
    from cachebuild.format.npy import check_npy_header, npy_header

    header = npy_header(np.zeros((3, 5), np.float32))
    monkeypatch.setattr(ast, "literal_eval", _broken_ast)
    check_npy_header(header, "float32", (3, 5), "m")  # no ast
    with pytest.raises(SystemError):  # another shape: numpy's reader is asked, and says what differs
        check_npy_header(header, "float32", (3, 6), "m")
    monkeypatch.undo()
    with pytest.raises(ShardCorruptError, match="shape"):
        check_npy_header(header, "float32", (3, 6), "m")
