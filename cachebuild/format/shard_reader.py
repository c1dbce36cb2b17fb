"""Random access to one shard: memory-mapped tar plus its sidecar index.

No tar parsing and no ``.npy`` header parsing: the index gives each payload's
slice and decoded dtype/shape, so a record is one slice and one decompression
away. Faults raise :class:`ShardCorruptError` naming the shard, record and field.
"""

from __future__ import annotations

import mmap
import zlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import zstandard

from cachebuild.errors import ShardCorruptError
from cachebuild.format.codec import Codec
from cachebuild.format.index import load_index
from cachebuild.format.index_check import check_index, check_member_keys
from cachebuild.format.limits import MAX_NPY_HEADER, load_json_bounded
from cachebuild.format.npy import check_npy_header
from cachebuild.format.shard_writer import JSON_DTYPE, record_key

__all__ = ["ShardReader"]


class ShardReader:
    """Reads fields of records of one shard by local record number.

    ``fields`` is the manifest's ordered ``[(name, dtype), ...]``. When
    ``expected_bytes`` is given, a tar of another size is reported as truncated
    or corrupt at open. ``check_crc`` verifies raw (uncompressed) payloads;
    zstd payloads always carry and verify their own content checksum.
    """

    def __init__(
        self,
        tar_path: str | Path,
        index_path: str | Path,
        fields: Sequence[tuple[str, str]],
        codec: Codec,
        first_record: int = 0,
        expected_bytes: int | None = None,
        check_crc: bool = False,
        schemas: Sequence[Any] | None = None,
        records: int | None = None,
        strict: bool = False,
    ):
        self.path = Path(tar_path)
        self.fields = list(fields)
        self.codec = codec
        self.first_record = first_record
        self.check_crc = check_crc
        self.strict = strict
        self._field_pos = {name: j for j, (name, _) in enumerate(self.fields)}
        self.index = load_index(index_path, len(self.fields))
        try:
            with open(self.path, "rb") as fh:
                size = fh.seek(0, 2)
                if expected_bytes is not None and size != expected_bytes:
                    raise ShardCorruptError(f"shard {self.path}: {size} bytes on disk, manifest says {expected_bytes} (truncated or replaced)")
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except FileNotFoundError as exc:
            raise ShardCorruptError(f"shard {self.path} is missing") from exc
        self._view = memoryview(self._mm) if self._mm is not None else memoryview(b"")
        self._dctx = zstandard.ZstdDecompressor() if codec.name == "zstd" else None
        if schemas is not None:
            n = len(self.index) if records is None else records
            check_index(self.index, schemas, codec.name, n, self.path.name, first_record, size)
            if n:
                check_member_keys(self._view, self.index, schemas, codec.name, self.path.name, first_record, sorted({0, n - 1}))
        else:
            off, sz = self.index["offset"], self.index["size"]
            if len(self.index) and ((off < 512) | (sz < 0) | (off > size) | (sz > size - np.minimum(off, size))).any():
                raise ShardCorruptError(f"shard {self.path}: index points outside the tar ({size} bytes): truncated or corrupt")
        self._schemas = list(schemas) if schemas is not None else None

    @classmethod
    def open(cls, manifest: Any, root: str | Path, s: int, check_crc: bool = False, strict: bool = False) -> "ShardReader":
        """Shard ``s`` of ``manifest`` under ``root``, with its index checked against the manifest and the tar
        (and the member keys of its first and last records). The manifest's names were checked when it was read."""
        e = manifest.shards[s]
        root = Path(root)
        fields = [(f.name, f.dtype) for f in manifest.fields]
        return cls(root / e.name, root / e.index, fields, manifest.codec, e.first_record, e.bytes, check_crc,
                   schemas=manifest.fields, records=e.records, strict=strict)

    def __len__(self) -> int:
        return len(self.index)

    def close(self) -> None:
        """Release the mapping (arrays still viewing it keep it alive until they go)."""
        try:
            self._view.release()
            if self._mm is not None:
                self._mm.close()
        except BufferError:
            pass
        self._mm = None

    def __enter__(self) -> "ShardReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _where(self, record: int, field: str) -> str:
        return f"shard {self.path.name}, record {record_key(self.first_record + record)}, field '{field}'"

    def payload(self, record: int, field: str) -> memoryview:
        """The stored bytes of one member (compressed or raw), zero-copy."""
        e = self.index[record, self._field_pos[field]]
        return self._view[int(e["offset"]) : int(e["offset"]) + int(e["size"])]

    def _decompress(self, data: memoryview | bytes, nbytes: int, is_json: bool, where: str) -> memoryview | bytes:
        """Decode a zstd member, refusing before allocating when its frame declares a size the index does not allow."""
        declared = zstandard.frame_content_size(data) if len(data) >= 6 else -2
        bound = nbytes if is_json else nbytes + MAX_NPY_HEADER
        if declared < nbytes or declared > bound:
            what = "does not declare its size" if declared < 0 else f"declares {declared} bytes"
            raise ShardCorruptError(f"{where}: zstd frame {what}, the index allows {nbytes}..{bound} (corrupt or a decompression bomb)")
        assert self._dctx is not None  # a zstd shard
        return self._dctx.decompress(data, max_output_size=bound)

    def read(self, record: int, field: str) -> Any:
        """Decode one field of one record: a numpy array, or a dict for JSON fields."""
        if not 0 <= record < len(self.index):
            raise IndexError(f"shard {self.path.name} has {len(self.index)} records, asked for {record}")
        j = self._field_pos[field]
        e = self.index[record, j]
        data: memoryview | bytes = self.payload(record, field)
        nbytes = int(e["nbytes"])
        dtype = self.fields[j][1]
        where = self._where(record, field)
        try:
            if self._dctx is not None:
                data = self._decompress(data, nbytes, dtype == JSON_DTYPE, where)
            elif self.check_crc and zlib.crc32(data) != int(e["crc32"]):
                raise ShardCorruptError(f"{where}: crc32 mismatch (corrupt payload)")
        except zstandard.ZstdError as exc:
            raise ShardCorruptError(f"{where}: {exc}") from exc
        if len(data) < nbytes:
            raise ShardCorruptError(f"{where}: payload {len(data)} bytes < expected {nbytes}")
        tail = memoryview(data)[len(data) - nbytes :]
        if dtype == JSON_DTYPE:
            if self.strict and len(data) != nbytes:
                raise ShardCorruptError(f"{where}: {len(data) - nbytes} stray bytes before the JSON text")
            return load_json_bounded(tail, where, ShardCorruptError)
        shape = tuple(int(s) for s in e["shape"][: int(e["ndim"])])
        if self.strict:
            check_npy_header(memoryview(data)[: len(data) - nbytes], dtype, shape, where)
        arr = np.frombuffer(tail, dtype=np.dtype(dtype))
        if arr.size != int(np.prod(shape)):
            raise ShardCorruptError(f"{where}: {arr.size} values do not fill shape {shape}")
        return arr.reshape(shape)

    def read_record(self, record: int) -> dict[str, Any]:
        """All fields of one record."""
        return {name: self.read(record, name) for name, _ in self.fields}
