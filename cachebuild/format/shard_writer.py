"""Write records into one shard: a plain tar of per-member-compressed ``.npy``/JSON
payloads plus its sidecar index, both under temporary names until complete.

Records are written a run at a time (about 8 MB of payload, whole groups of
``codec.pack`` records; see :mod:`cachebuild.format.packing`): the entries are
encoded column by column (:mod:`cachebuild.format.member_block`), the tar
headers built in one numpy pass, and the run's bytes joined once into one
buffer that is hashed (sha256) and written. Every byte is read by the hash once
and written once; nothing is re-read. Records of an unfinished group wait in
memory for the next block or :meth:`ShardWriter.close`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from cachebuild.format.atomic import fsync_dir, open_tmp, output_error, tmp_name
from cachebuild.format.codec import Codec
from cachebuild.format.index import INDEX_DTYPE, compress_index, index_bytes
from cachebuild.format.manifest import ShardEntry
from cachebuild.format.member_block import EncodedRun, FieldSpec, MemberError, encode_run
from cachebuild.format.names import index_name, member_name, member_name_bytes, record_key
from cachebuild.format.packing import is_first_entry
from cachebuild.format.tarball import BLOCK, END_OF_ARCHIVE, fill_headers, pad_lengths, tar_headers

__all__ = ["ShardWriter"]

_RUN_BYTES = 8 << 20  # payload bytes encoded, hashed and written together (bigger runs: fewer per-run numpy calls)
_JOIN_LIMIT = 64 << 20  # a run with more (one huge record) is hashed and written piece by piece


def _place_prefixes(gaps: np.ndarray, prefixes: list[bytes], plen: np.ndarray) -> None:
    """Copy each entry's prefix (``.npy`` header, JSON separator) after its tar header slot (a few distinct lengths: one copy per length)."""
    lengths = np.unique(plen).tolist()
    for n in lengths:
        if n == 0:
            continue
        if len(lengths) == 1:
            gaps[:, 2 * BLOCK :] = np.frombuffer(b"".join(prefixes), np.uint8).reshape(len(prefixes), n)
            continue
        pick = np.flatnonzero(plen == n)
        gaps[pick, 2 * BLOCK : 2 * BLOCK + n] = np.frombuffer(b"".join([prefixes[i] for i in pick.tolist()]), np.uint8).reshape(len(pick), n)


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
        self.pack = codec.pack
        self.first_record = first_record
        self._specs = [FieldSpec(f, d, member_name("", f, d, codec, packed=self.pack > 1)) for f, d in self.fields]
        self._pending: list[Mapping[str, Any]] = []  # records of a group not yet complete
        self._flushed = False
        self._cctx = codec.compressor()
        self._final = self.folder / name
        self._tmp = tmp_name(self._final)
        self._sha = hashlib.sha256()
        self._index_parts: list[np.ndarray] = []
        self._count = 0
        self._pos = 0  # end of the last member, padded to a block (the pad itself is written with the next run)
        self._pad = 0
        self._raw_bytes = 0
        self._ranks: np.ndarray | None = None  # each field's number of dims, set by the first record
        self.index: np.ndarray | None = None  # the index written, once closed (the builder's manifest needs its shapes)
        self._rank_key = ""
        try:
            self._fh = open_tmp(self._tmp, buffering=0)
        except OSError as exc:
            raise output_error(self._final, exc) from exc

    @property
    def records(self) -> int:
        """Records added so far (written, or waiting for their group to fill)."""
        return self._count + len(self._pending)

    def add(self, record: Mapping[str, Any]) -> None:
        """Append one record (a dict of numpy arrays, and a JSON-able dict for JSON fields)."""
        self.add_block([record])

    def add_block(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Append records in order, as :meth:`add` would one by one (same bytes), a run at a time.

        A record that does not fit the schema raises a ValueError
        (:class:`~cachebuild.format.member_block.MemberError`) naming it, here or
        (in a group still filling) from :meth:`close`; the records before its run
        are written, so :meth:`abort` the writer then.
        """
        if not records:
            return
        if self._flushed:
            raise ValueError(f"shard {self.name}: records added after flush_pending() would break its member groups")
        if self._pending:
            records = [*self._pending, *records]
        whole = len(records) - len(records) % self.pack
        self._pending = list(records[whole:])
        self._write_records(records[:whole])

    @property
    def pending(self) -> list[Mapping[str, Any]]:
        """Records added but not yet written: the start of a group still filling."""
        return list(self._pending)

    def flush_pending(self) -> None:
        """Write the last, shorter group now (once every record is added; :meth:`close` does it too),
        so a record that does not fit the schema is reported here rather than by ``close``."""
        pending, self._pending = self._pending, []
        self._flushed = True
        self._write_records(pending)

    def _write_records(self, records: Sequence[Mapping[str, Any]]) -> None:
        if not records:
            return
        step = self._run_records(records[0])
        for a in range(0, len(records), step):
            self._write_run(records[a : a + step])

    def _run_records(self, record: Mapping[str, Any]) -> int:
        """Records per run: about ``_RUN_BYTES`` of payload, judged by the first record."""
        try:
            size = sum(int(getattr(v, "nbytes", 256)) for v in record.values()) + BLOCK * len(self._specs)
        except (AttributeError, TypeError, ValueError):
            return self.pack
        return -(-max(1, _RUN_BYTES // max(1, size)) // self.pack) * self.pack

    def _write_run(self, records: Sequence[Mapping[str, Any]]) -> None:
        first = self.first_record + self._count
        try:
            run = encode_run(records, self._specs, self._cctx, lambda i: record_key(first + i), self.pack, self.codec.share or 0)
            self._check_ranks(run.rows, first)
        except MemberError as exc:
            exc.record += self._count  # (from the run's to the shard's position)
            raise
        chunks, end, pad = self._tar_chunks(run, first + np.arange(0, len(records), self.pack, dtype=np.int64))
        if run.raw_bytes <= _JOIN_LIMIT:
            chunks = [b"".join(chunks)]  # one hash call and one write per run
        for chunk in chunks:  # (a run of huge records: no joined copy)
            self._sha.update(chunk)
            self._write(chunk)
        self._index_parts.append(run.rows)
        self._pos, self._pad = end, pad
        self._count += len(records)
        self._raw_bytes += run.raw_bytes

    def _check_ranks(self, rows: np.ndarray, first: int) -> None:
        """Every record of a field has one number of dims, as the manifest's schema and every reader
        assume: refuse a record that changes it before anything of its run is written."""
        ndim = rows["ndim"]
        if self._ranks is None:
            self._ranks, self._rank_key = ndim[0].copy(), record_key(first)
        bad = ndim != self._ranks
        if bad.any():
            i, j = (int(v) for v in np.argwhere(bad)[0])
            raise MemberError(
                f"field '{self.fields[j][0]}' of record {record_key(first + i)}: {int(ndim[i, j])} dims, but record {self._rank_key} has "
                f"{int(self._ranks[j])} (a field keeps one number of dims in every record: pad or reshape it)",
                i,
            )

    def _tar_chunks(self, run: EncodedRun, group_ids: np.ndarray) -> tuple[list[Any], int, int]:
        """The run's tar bytes as buffers; fills the index offsets and sizes (``group_ids``: the record id
        each member of the run is named after, a group's first).

        Entry ``i`` (in tar order) is written as two buffers: a gap, built for
        all entries in one array, then the entry's body. A member's first
        entry's gap holds the previous member's padding, the tar header and (raw)
        the ``.npy`` header; a later entry's gap only its prefix (a JSON
        separator, or nothing). Returns (buffers, the padded end of the last
        member, that member's padding).
        """
        sizes = run.sizes if run.stored is None else run.stored  # bytes each entry writes (0 inside a shared frame)
        m, nf = len(sizes), len(self._specs)
        if m == 0:  # a schema without fields
            return [], self._pos, self._pad
        first = np.repeat(is_first_entry(m // nf, self.pack), nf)[run.order]
        member = np.cumsum(first) - 1
        opens = np.flatnonzero(first)
        msize = np.add.reduceat(sizes, opens)
        pads = pad_lengths(msize)
        steps = BLOCK + msize + pads
        data_at = self._pos + np.cumsum(steps) - steps + BLOCK
        before = np.cumsum(sizes) - sizes
        offsets = data_at[member] + before - before[opens][member]
        if run.stored is not None:  # an entry inside a shared frame points at its frame
            frame_at = np.flatnonzero(sizes > 0)
            offsets = offsets[frame_at][np.cumsum(sizes > 0) - 1]
        flat = run.rows.reshape(-1)
        flat["offset"][run.order] = offsets
        flat["size"][run.order] = run.sizes
        prefixes = run.prefixes or []
        plen = np.fromiter(map(len, prefixes), np.int64, len(prefixes)) if prefixes else np.zeros(m, np.int64)
        width = 2 * BLOCK + int(plen.max())
        gaps = np.empty((m, width), np.uint8)  # row i: [zeros][tar header, for a member's first entry][prefix i]
        gaps[:, :BLOCK] = 0  # (of a row only what its slice below takes is read: not a later entry's header, nor past its prefix)
        self._place_headers(gaps, opens, group_ids, msize)
        _place_prefixes(gaps, prefixes, plen)
        row_at = np.arange(m, dtype=np.int64) * width
        prev_pad = np.zeros(m, np.int64)
        prev_pad[opens] = np.concatenate(([self._pad], pads[:-1]))
        starts = row_at + np.where(first, BLOCK - prev_pad, 2 * BLOCK)
        stops = row_at + 2 * BLOCK + plen
        view = gaps.reshape(-1).data
        chunks: list[Any] = [None] * (2 * m)
        chunks[::2] = [view[a:b] for a, b in zip(starts.tolist(), stops.tolist())]
        chunks[1::2] = run.bodies
        return chunks, int(data_at[-1] + msize[-1] + pads[-1]), int(pads[-1])

    def _place_headers(self, gaps: np.ndarray, opens: np.ndarray, group_ids: np.ndarray, msize: np.ndarray) -> None:
        """The tar header of each member (``opens``: the rows of ``gaps`` a member's first entry has), written in place
        when every entry opens a member (``pack`` 1); names made by numpy (:func:`~cachebuild.format.names.member_name_bytes`)."""
        made = member_name_bytes(group_ids, [s.suffix for s in self._specs])
        if made is None:  # (keys past KEY_DIGITS digits, a name over 100 bytes: one by one, checked)
            gaps[opens, BLOCK : 2 * BLOCK] = tar_headers([record_key(int(k)) + s.suffix for k in group_ids.tolist() for s in self._specs], msize)
        elif len(opens) == len(gaps):
            fill_headers(gaps[:, BLOCK : 2 * BLOCK], made[0], made[1], msize)
        else:
            heads = np.empty((len(opens), BLOCK), np.uint8)
            fill_headers(heads, made[0], made[1], msize)
            gaps[opens, BLOCK : 2 * BLOCK] = heads

    def _write(self, data: Any) -> None:
        view = memoryview(data)
        fd = self._fh.fileno()
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            raise output_error(self._final, exc) from exc

    def close(self, sync: bool = True) -> ShardEntry:
        """Finish the tar, write the index, sync both and rename them into place."""
        self.flush_pending()
        tail = bytes(self._pad) + END_OF_ARCHIVE
        self._sha.update(tail)
        self._write(tail)
        self._pos += len(END_OF_ARCHIVE)
        parts = self._index_parts or [np.zeros((0, len(self.fields)), INDEX_DTYPE)]
        index = np.concatenate(parts)
        idx_data = index_bytes(index)
        self.index = index
        if self.pack > 1:  # (a packed shard's index compresses ~15x: offsets, sizes and shapes repeat)
            idx_data = compress_index(idx_data)
        idx_final = self.folder / index_name(self.name, packed=self.pack > 1)
        idx_tmp = tmp_name(idx_final)
        try:
            if sync:
                os.fsync(self._fh.fileno())
            self._fh.close()
            with open_tmp(idx_tmp) as fh:
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
            pack=self.pack,
        )

    def abort(self) -> None:
        """Drop the partial shard (idempotent)."""
        try:
            self._fh.close()
        except OSError:
            pass
        self._tmp.unlink(missing_ok=True)
