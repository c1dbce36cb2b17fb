"""Packed members: several consecutive records of one field in one tar member.

A shard's records are cut into *groups* of ``pack`` consecutive records (the
last group may be shorter; groups never cross a shard). For each group the tar
holds one member per field, named after the group's first record key, fields
in manifest order, then the next group:

* an array field's member is one ``.npy`` file: the group's arrays stacked
  (header shape ``[G, *shape]``) when they share a shape, else concatenated
  flat (``[total elements]``; each record's shape is in the sidecar index);
* a JSON field's member is JSON Lines (``{key}.{field}.jsonl``): one compact
  JSON text per record, separated by ``\\n``.

Inside a member each record keeps its own *entry*: its own zstd frame (or its
own raw byte range), which the index points at, so any record is still one
slice and one decompression away. An entry is the record's data, preceded in
the group's first entry by the ``.npy`` header, and in a JSON member's later
entries by the ``\\n`` separator: the data is always the entry's last
``nbytes`` decoded bytes, exactly as in unpacked shards. ``zstd -d`` of a
member (its frames concatenated) gives the plain ``.npy`` or ``.jsonl`` file.
With ``codec.share`` (format v4), small consecutive entries of a member share one
frame instead, and a record's data ends where the later entries of its frame
begin (:mod:`cachebuild.format.shared_frames`).

``pack == 1`` is the original layout (one member per record and field, the
``.npy`` header holding the record's own shape), byte for byte; a shard's
``pack`` is in its manifest entry.

Why: a tar member costs a 512-byte header plus padding to 512 bytes. For
records of a few KB that doubled the bytes on disk, and for a 2-byte label
member it was 500x its payload. A group of 256 records pays it once.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "DEFAULT_PACK",
    "MAX_PACK",
    "PACK_MEMBER_BYTES",
    "MAX_SHARE",
    "SHARE_BYTES",
    "MEMBER_BYTES",
    "PACK_BELOW_BYTES",
    "default_pack",
    "effective_pack",
    "group_starts",
    "tar_order",
    "is_first_entry",
]

DEFAULT_PACK = 256
"""The recipes' ``build.pack`` when not given (then :func:`default_pack` decides by record size),
and the smallest pack that function gives a small record: the ~770 bytes per member of tar
framing are then at most 3 bytes per record and field."""
MEMBER_BYTES = 16 << 20
"""A member holds at most about this many raw bytes of records (:func:`effective_pack`), so the
writer, which holds back a group until it is complete, never holds more than that per field."""
MAX_PACK = 4096
"""The largest ``pack`` a recipe or manifest may give."""
SHARE_BYTES = 1024
"""``codec.share`` of a new packed zstd build: the most decoded bytes one shared frame holds
(:mod:`cachebuild.format.shared_frames`)."""
MAX_SHARE = 1 << 16
"""The largest ``codec.share`` a manifest may give (a random read decodes at most this plus a ``.npy`` header)."""
PACK_BELOW_BYTES = 8 << 10
"""A build that is not given ``pack`` packs only records smaller than this (raw bytes, the
source's estimate): :func:`default_pack`."""
PACK_MEMBER_BYTES = 4 << 20
"""A build that is not given ``pack`` packs small records so a member holds about this many raw
bytes (:func:`default_pack`): 1,024 records of 2-4 KB."""


def default_pack(record_bytes: int) -> int:
    """``pack`` of a build that does not set it: 1 (one member per record and field, the layout
    plain WebDataset reads with a three-line ``.zst`` decoder, DESIGN.md's invariant) for records
    of :data:`PACK_BELOW_BYTES` and more (a default causal graph, a mel file), where tar framing is
    a modest share; below it (small records, issue 15), where it would double the bytes on disk,
    the largest power of two of records that holds at most :data:`PACK_MEMBER_BYTES` raw, from
    :data:`DEFAULT_PACK` to :data:`MAX_PACK` (2 KB records: 1,024, so the ~770 bytes of tar
    framing per member are 1.5 bytes per record and field)."""
    if record_bytes >= PACK_BELOW_BYTES:
        return 1
    fit = max(1, PACK_MEMBER_BYTES // max(1, record_bytes))
    return min(MAX_PACK, max(DEFAULT_PACK, 1 << (fit.bit_length() - 1)))


def effective_pack(pack: int, record_bytes: int) -> int:
    """``pack``, lowered so a group of records of about ``record_bytes`` raw bytes (the source's
    estimate, so the same recipe always gives the same value) stays within :data:`MEMBER_BYTES`;
    records that large gain nothing from sharing a member."""
    return max(1, min(pack, MEMBER_BYTES // max(1, record_bytes)))


def group_starts(records: int, pack: int) -> np.ndarray:
    """Shard-local record position of each group's first record."""
    return np.arange(0, records, max(1, pack), dtype=np.int64)


def is_first_entry(records: int, pack: int) -> np.ndarray:
    """``[records]`` bool: the record opens its group (its entries follow a tar header)."""
    first: np.ndarray = np.arange(records, dtype=np.int64) % max(1, pack) == 0
    return first


def tar_order(records: int, n_fields: int, pack: int) -> np.ndarray:
    """Positions in the record-major flattened index ``[records * n_fields]``, in the order the
    entries lie in the tar: group by group, field by field, record by record."""
    r = np.repeat(np.arange(records, dtype=np.int64), n_fields)
    f = np.tile(np.arange(n_fields, dtype=np.int64), records)
    if pack <= 1:
        return r * n_fields + f
    order: np.ndarray = np.lexsort((r, f, r // pack))
    return order
