"""Write records into one shard: a plain tar of per-member-compressed ``.npy``/JSON
payloads plus its sidecar index, both under temporary names until complete."""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from cachebuild.format.atomic import fsync_dir, output_error, tmp_name
from cachebuild.format.codec import Codec
from cachebuild.format.index import INDEX_DTYPE, MAX_NDIM, index_bytes
from cachebuild.format.manifest import ShardEntry
from cachebuild.format.names import JSON_DTYPE, index_name, member_name, record_key
from cachebuild.format.npy import npy_header
from cachebuild.format.tarball import END_OF_ARCHIVE, tar_header

__all__ = ["ShardWriter"]

_FLUSH_BYTES = 8 << 20
_ONES = (1,) * MAX_NDIM
_ZEROS = bytes(512)
_IOV_MAX = 1024


def _check_schema(fields: Sequence[tuple[str, str]]) -> None:
    """Refuse at write time the field names and dtypes every reader would refuse (see :mod:`cachebuild.format.limits`)."""
    from cachebuild.errors import ManifestError
    from cachebuild.format.limits import FIELD_NAME_RE, check_dtype

    for name, dtype in fields:
        if not isinstance(name, str) or not FIELD_NAME_RE.fullmatch(name):
            raise ValueError(f"field name {name!r} is not allowed (letters, digits, _ and -, at most 64)")
        try:
            check_dtype(dtype, f"field '{name}' dtype", "schema")
        except ManifestError as exc:
            raise ValueError(str(exc)) from None


class ShardWriter:
    """Streams records into ``folder/name``; call :meth:`close` to publish it.

    ``fields`` is the ordered schema ``[(field, dtype), ...]`` (dtype ``"json"``
    for a JSON member). Records are dicts holding exactly those fields.
    Nothing is visible under the final name until ``close()`` succeeds; on any
    error, call :meth:`abort` to remove the partial files.
    """

    def __init__(self, folder: Path, name: str, fields: Sequence[tuple[str, str]], codec: Codec, first_record: int):
        self.folder = Path(folder)
        self.name = name
        self.fields = list(fields)
        _check_schema(self.fields)
        self.codec = codec
        self.first_record = first_record
        self._specs = [(f, d, member_name("", f, d, codec)) for f, d in self.fields]
        self._cctx = codec.compressor()
        self._final = self.folder / name
        self._tmp = tmp_name(self._final)
        self._sha = hashlib.sha256()
        self._rows: list[tuple[int, int, int, int, int, tuple[int, ...]]] = []
        self._count = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._pos = 0
        self._raw_bytes = 0
        try:
            self._fh = open(self._tmp, "wb", buffering=0)
        except OSError as exc:
            raise output_error(self._final, exc) from exc

    @property
    def records(self) -> int:
        return self._count

    def add(self, record: Mapping[str, Any]) -> None:
        """Append one record (a dict of numpy arrays, and a JSON-able dict for JSON fields)."""
        if len(record) != len(self.fields):
            extra = sorted(set(record) - {f for f, _ in self.fields})
            missing = sorted({f for f, _ in self.fields} - set(record))
            raise ValueError(f"record fields do not match the schema: missing {missing}, unexpected {extra}")
        key = record_key(self.first_record + self._count)
        rows, pending, cctx = self._rows, self._pending, self._cctx
        pos, added, raw_total = self._pos, 0, 0
        for field, dtype, suffix in self._specs:
            value = record[field]
            if dtype == JSON_DTYPE:
                raw = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
                nbytes, shape = len(raw), ()
            else:
                arr = value
                if getattr(arr, "dtype", None) != dtype:
                    got = getattr(arr, "dtype", type(arr).__name__)
                    raise ValueError(f"field '{field}' of record {key}: expected {dtype} array, got {got}")
                if arr.ndim > MAX_NDIM:
                    raise ValueError(f"field '{field}' of record {key}: {arr.ndim} dims > {MAX_NDIM}")
                if not arr.flags.c_contiguous:
                    arr = arr.copy(order="C")  # (ascontiguousarray would turn 0-d into 1-d)
                shape = arr.shape
                nbytes = arr.nbytes
                raw = b"".join((npy_header(arr), arr.data))
            payload = raw if cctx is None else cctx.compress(raw)
            size = len(payload)
            pad = (-size) % 512
            pending.append(tar_header(key + suffix, size))
            pending.append(payload)
            if pad:
                pending.append(_ZEROS[:pad])
            rows.append((pos + 512, size, nbytes, zlib.crc32(payload) if cctx is None else 0, len(shape), shape + _ONES[len(shape) :]))
            step = 512 + size + pad
            pos += step
            added += step
            raw_total += len(raw)
        self._pos = pos
        self._raw_bytes += raw_total
        self._pending_bytes += added
        self._count += 1
        if self._pending_bytes >= _FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        """Hash and write the pending chunks (vectored writes, no joining copy)."""
        chunks, self._pending = self._pending, []
        self._pending_bytes = 0
        update = self._sha.update
        for c in chunks:
            update(c)
        fd = self._fh.fileno()
        try:
            for i in range(0, len(chunks), _IOV_MAX):
                group = chunks[i : i + _IOV_MAX]
                want = sum(map(len, group))
                done = os.writev(fd, group)
                if done != want:  # short write: finish the rest plainly
                    self._fh.write(b"".join(group)[done:])
        except OSError as exc:
            raise output_error(self._final, exc) from exc

    def close(self, sync: bool = True) -> ShardEntry:
        """Finish the tar, write the index, sync both and rename them into place."""
        self._pending.append(END_OF_ARCHIVE)
        self._pos += len(END_OF_ARCHIVE)
        self._flush()
        index = np.array(self._rows, dtype=INDEX_DTYPE).reshape(self._count, len(self.fields))
        idx_data = index_bytes(index)
        idx_final = self.folder / index_name(self.name)
        idx_tmp = tmp_name(idx_final)
        try:
            if sync:
                os.fsync(self._fh.fileno())
            self._fh.close()
            with open(idx_tmp, "wb") as fh:
                fh.write(idx_data)
                if sync:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(idx_tmp, idx_final)
            os.replace(self._tmp, self._final)
        except OSError as exc:
            self.abort()
            idx_tmp.unlink(missing_ok=True)
            raise output_error(self._final, exc) from exc
        if sync:
            fsync_dir(self.folder)
        return ShardEntry(
            name=self.name,
            index=idx_final.name,
            first_record=self.first_record,
            records=self._count,
            bytes=self._pos,
            sha256=self._sha.hexdigest(),
            index_sha256=hashlib.sha256(idx_data).hexdigest(),
            raw_bytes=self._raw_bytes,
            index_bytes=len(idx_data),
        )

    def abort(self) -> None:
        """Drop the partial shard (idempotent)."""
        try:
            self._fh.close()
        except OSError:
            pass
        self._tmp.unlink(missing_ok=True)
