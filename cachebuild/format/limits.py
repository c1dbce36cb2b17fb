"""What a cache from a stranger may hold: names, numbers, dtypes and JSON, checked before use.

Every reader (the loader, ``verify``, ``inspect``, ``stage``, the remote
fetcher) parses a manifest through :meth:`Manifest.from_json`, which calls
:func:`check_manifest`; every shard index goes through
:func:`cachebuild.format.index_check.check_index`. So one place decides what is
allowed:

* names of shards and indexes are plain file names inside the cache (letters,
  digits, ``_ . + -``, not starting with a dot, so never ``..``, a separator or
  an absolute path);
* numbers are whole numbers in range, and consistent with each other and with
  the declared file sizes (a member takes at least a 512-byte tar header, so a
  shard of ``bytes`` holds at most ``bytes / 512`` members);
* dtypes come from a closed set of numeric types plus ``json`` (no objects, no
  structured or byte-swapped types: nothing that could unpickle or surprise);
* JSON (the manifest itself and JSON members) has a size and a nesting limit.

Violations raise :class:`ManifestError` naming the field and the value.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from cachebuild.errors import CacheBuildError, ManifestError
from cachebuild.format.json_text import refuse_constant
from cachebuild.format.names import JSON_DTYPE, MANIFEST_NAME, PACKED_VERSION, SHARED_VERSION
from cachebuild.format.packing import MAX_PACK

__all__ = [
    "MAX_MANIFEST_BYTES",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_JSON_VALUES",
    "MAX_NPY_HEADER",
    "MAX_MEMBER_BYTES",
    "MAX_SHARD_BYTES",
    "MEMBER_MIN_BYTES",
    "RESERVED_NAMES",
    "FIELD_NAME_RE",
    "check_file_name",
    "check_manifest",
    "check_tables",
    "check_dtype",
    "decoded_limit",
    "load_json_bounded",
]

MAX_MANIFEST_BYTES = 256 << 20  # ~40 MB per million shards; far above any real cache
MAX_JSON_BYTES = 16 << 20  # a JSON member is per-record metadata
MAX_JSON_DEPTH = 64
MAX_JSON_VALUES = 1 << 24  # containers + commas: 3x the ~5M values of a 500,000-shard manifest; ~1.2 GB parsed at worst
MAX_NPY_HEADER = 4096  # bytes before the array data in a decoded .npy member (numpy writes 128)
MAX_MEMBER_BYTES = 4 << 30  # decoded array data of one member
MAX_SHARD_BYTES = 1 << 44  # 16 TiB
MEMBER_MIN_BYTES = 512  # every member has a 512-byte tar header
END_BYTES = 1024  # the tar's end-of-archive blocks
RESERVED_NAMES = frozenset({MANIFEST_NAME, "build.json", ".cachebuild-stage.json"})

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}")
FIELD_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")
_DTYPE_KINDS = "biuf"  # bool, signed, unsigned, float
_STRING_RE = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def check_file_name(value: Any, field: str, where: str) -> str:
    """``value`` if it is a plain file name inside the cache, else :class:`ManifestError` naming ``field``."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or value in RESERVED_NAMES or value.endswith(".done.json"):
        raise ManifestError(f"{where}: {field} = {value!r} is not a plain file name inside the cache (no separators, no '..', no absolute path, no leading dot; letters, digits and _ . + - only)")
    return value


def check_dtype(value: Any, field: str, where: str) -> str:
    """``value`` if it is ``json`` or a plain numeric dtype (little-endian or single byte), else :class:`ManifestError`."""
    if value == JSON_DTYPE:
        return JSON_DTYPE
    ok = isinstance(value, str) and 0 < len(value) <= 16
    if ok:
        try:
            dt = np.dtype(value)
        except (TypeError, ValueError):
            ok = False
        else:
            ok = dt.kind in _DTYPE_KINDS and dt.fields is None and dt.subdtype is None and dt.byteorder in "=<|" and dt.itemsize <= 8
    if not ok:
        raise ManifestError(f"{where}: {field} = {value!r} is not an allowed dtype (bool, int8..int64, uint8..uint64, float16..float64 or json)")
    return str(value)


def decoded_limit(dtype: str, max_shape: tuple[int, ...]) -> int:
    """Bytes of array data of the largest member a field's schema allows (JSON: :data:`MAX_JSON_BYTES`)."""
    if dtype == JSON_DTYPE:
        return MAX_JSON_BYTES
    n = np.dtype(dtype).itemsize
    for d in max_shape:
        n *= int(d)
    return n


def _json_shape(data: bytes) -> tuple[int, int]:
    """Deepest nesting of ``[``/``{`` outside strings, and the number of containers and commas outside
    strings (about the number of values the parser makes), vectorised over the bytes."""
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH and data.count(b",") <= MAX_JSON_VALUES - MAX_JSON_DEPTH:
        return 0, 0  # cannot be deeper than the number of openers, nor hold more values than commas and openers
    text = _STRING_RE.sub(b'""', data)
    values = text.count(b"[") + text.count(b"{") + text.count(b",")
    if values > MAX_JSON_VALUES:
        return 0, values  # (refused for that; the depth pass below would cost 8 bytes a byte at once)
    stripped, depth, level = np.frombuffer(text, np.uint8), 0, 0
    for at in range(0, len(stripped), 1 << 22):  # in 4 MiB chunks: 32 MiB of int64 at a time, whatever the size
        chunk = stripped[at : at + (1 << 22)]
        step = np.isin(chunk, (ord("["), ord("{"))).astype(np.int64) - np.isin(chunk, (ord("]"), ord("}")))
        run = np.cumsum(step) + level
        depth, level = max(depth, int(run.max())), int(run[-1])
    return depth, values


def load_json_bounded(data: bytes | memoryview, where: str, error: type[CacheBuildError] = ManifestError, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Parse JSON of at most ``max_bytes`` bytes, :data:`MAX_JSON_DEPTH` levels and :data:`MAX_JSON_VALUES` values; faults raise ``error`` naming ``where``."""
    if len(data) > max_bytes:
        raise error(f"{where}: JSON of {len(data)} bytes exceeds the limit of {max_bytes} bytes")
    data = bytes(data)
    depth, values = _json_shape(data)
    if depth > MAX_JSON_DEPTH:
        raise error(f"{where}: JSON nested {depth} levels deep exceeds the limit of {MAX_JSON_DEPTH}")
    if values > MAX_JSON_VALUES:  # ~72 bytes of Python objects each: 200 MB of "[]," parsed to 5 GB
        raise error(f"{where}: JSON of about {values} values exceeds the limit of {MAX_JSON_VALUES} (a manifest holds about 10 a shard)")
    try:
        return json.loads(data, parse_constant=refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise error(f"{where}: not valid JSON ({type(exc).__name__}: {exc})") from exc


_TOP_TYPES = (("kind", str, "a string"), ("seed", int, "a whole number"), ("config", dict, "a table"), ("codec", dict, "a table"), ("fields", dict, "a table"), ("shards", list, "a list"))
_SCHEMA_KEYS = ("dtype", "ndim", "max_shape", "min_shape")


def _typed(value: Any, kind: type, what: str, field: str, where: str) -> None:
    if not isinstance(value, kind):
        raise ManifestError(f"{where}: {field} = {value!r:.80} is not {what}")


def check_tables(doc: dict[str, Any], shard_keys: tuple[str, ...], required: int, where: str) -> None:
    """The manifest's keys, tables and lists are there and of their type, before anything is built from them.

    ``shard_keys`` are a shard entry's keys (the first ``required`` must be given). A
    fault names the key (``fields.adj``, ``shards[3].sha256``) and its value, so a
    hand-edited or truncated manifest reads as one line rather than a Python error.
    """
    for key, kind, what in _TOP_TYPES:
        if key not in doc:
            raise ManifestError(f"{where}: no {key!r} key (a cachebuild manifest has {', '.join(k for k, _, _ in _TOP_TYPES)})")
        _typed(doc[key], kind, what, key, where)
    for name, schema in doc["fields"].items():
        _typed(schema, dict, "a table (dtype, ndim, max_shape, min_shape)", f"fields.{name}", where)
        missing = next((k for k in _SCHEMA_KEYS if k not in schema), None)
        if missing is not None:
            raise ManifestError(f"{where}: fields.{name} has no {missing!r} (a field schema has {', '.join(_SCHEMA_KEYS)})")
        for key in ("max_shape", "min_shape"):
            _typed(schema[key], list, "a list of whole numbers", f"fields.{name}.{key}", where)
    for i, entry in enumerate(doc["shards"]):
        _typed(entry, dict, "a table (name, index, first_record, records, bytes, sha256, ...)", f"shards[{i}]", where)
        missing = next((k for k in shard_keys[:required] if k not in entry), None)
        if missing is not None:
            raise ManifestError(f"{where}: shards[{i}] has no {missing!r} (a shard entry has {', '.join(shard_keys[:required])})")
        unknown = next((k for k in entry if k not in shard_keys), None)
        if unknown is not None:
            raise ManifestError(f"{where}: shards[{i}] has an unknown key {unknown!r} (known: {', '.join(shard_keys)})")
    if "records" in doc:
        _whole(doc["records"], "records", where)  # its range and sum: check_manifest, against the shards


def _whole(value: Any, field: str, where: str, lo: int = 0, hi: int = 1 << 62) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ManifestError(f"{where}: {field} = {value!r} is not a whole number in [{lo}, {hi}]")
    return value


def _check_field(f: Any, codec: str, biggest_shard: int, where: str) -> None:
    """A field schema: allowed name and dtype, rank, shapes in range, largest member bounded."""
    label = f"fields.{f.name}" if isinstance(f.name, str) else "fields"
    if not isinstance(f.name, str) or not FIELD_NAME_RE.fullmatch(f.name):
        raise ManifestError(f"{where}: field name {f.name!r} is not allowed (letters, digits, _ and -, at most 64)")
    check_dtype(f.dtype, f"{label}.dtype", where)
    from cachebuild.format.index import MAX_NDIM

    _whole(f.ndim, f"{label}.ndim", where, 0, 0 if f.dtype == JSON_DTYPE else MAX_NDIM)
    for key in ("max_shape", "min_shape"):
        shape = getattr(f, key)
        if len(shape) != f.ndim:
            raise ManifestError(f"{where}: {label}.{key} = {list(shape)} does not have ndim = {f.ndim} axes")
        for d in shape:
            _whole(d, f"{label}.{key}", where, 0, 1 << 40)
    if any(lo > hi for lo, hi in zip(f.min_shape, f.max_shape)):
        raise ManifestError(f"{where}: {label}.min_shape {list(f.min_shape)} exceeds max_shape {list(f.max_shape)}")
    limit = MAX_MEMBER_BYTES if codec != "none" or not biggest_shard else min(MAX_MEMBER_BYTES, biggest_shard)
    if f.dtype != JSON_DTYPE and decoded_limit(f.dtype, f.max_shape) > limit:
        raise ManifestError(f"{where}: {label}.max_shape = {list(f.max_shape)} ({f.dtype}) means members of {decoded_limit(f.dtype, f.max_shape)} bytes, more than the limit of {limit} bytes")


def _check_shard(i: int, s: Any, n_fields: int, first: int, where: str) -> None:
    """One shard entry: plain names, counts consistent with its declared size and position."""
    check_file_name(s.name, f"shards[{i}].name", where)
    check_file_name(s.index, f"shards[{i}].index", where)
    if s.name == s.index:
        raise ManifestError(f"{where}: shards[{i}] names {s.name!r} as both its tar and its index")
    nbytes = _whole(s.bytes, f"shards[{i}].bytes", where, END_BYTES, MAX_SHARD_BYTES)
    records = _whole(s.records, f"shards[{i}].records", where, 0, 1 << 40)
    pack = _whole(s.pack, f"shards[{i}].pack", where, 1, MAX_PACK)
    groups = -(-records // pack)
    if groups * n_fields * MEMBER_MIN_BYTES + END_BYTES > nbytes:
        raise ManifestError(
            f"{where}: shards[{i}].records = {records}{f' (in members of {pack})' if pack > 1 else ''} x {n_fields} fields cannot fit in shards[{i}].bytes = {nbytes} (each member takes at least {MEMBER_MIN_BYTES} bytes)"
        )
    if _whole(s.first_record, f"shards[{i}].first_record", where) != first:
        raise ManifestError(f"{where}: shards[{i}].first_record = {s.first_record} but the shards before it hold {first} records")
    _whole(s.raw_bytes, f"shards[{i}].raw_bytes", where, 0, 1 << 62)
    _whole(s.index_bytes, f"shards[{i}].index_bytes", where, 0, 1 << 62)
    for key, optional in (("sha256", False), ("index_sha256", True)):
        v = getattr(s, key)
        if not isinstance(v, str) or not (re.fullmatch(r"[0-9a-f]{64}", v) or (optional and v == "")):
            raise ManifestError(f"{where}: shards[{i}].{key} = {v!r} is not a sha256 hex digest")
    # a packed shard's index is compressed, so its size does not follow from its records (the remote
    # fetcher needs it); the writer always gives size and hash, only older unpacked caches lack them
    for key, v in (("index_bytes", s.index_bytes), ("index_sha256", s.index_sha256)):
        if pack > 1 and not v:
            raise ManifestError(f"{where}: shards[{i}].{key} = {v!r}, but a packed shard (pack {pack}) must give its index's size and sha256")


def _first_record(build: Any, where: str) -> int:
    """Global id of the first listed record: 0, or past the generations a grown cache pruned."""
    if not isinstance(build, dict):
        raise ManifestError(f"{where}: build = {type(build).__name__} is not a table")
    if "generation" in build:
        _whole(build["generation"], "build.generation", where, 0, 1 << 40)
    return _whole(build.get("first_record", 0), "build.first_record", where)


def check_manifest(m: Any, declared_records: Any, where: str) -> None:
    """Check a parsed manifest (names, numbers, dtypes; see the module docstring); :class:`ManifestError` on a fault."""
    _whole(m.seed, "seed", where, 0, 1 << 64)
    if not m.fields:
        raise ManifestError(f"{where}: lists no fields")
    names = [f.name for f in m.fields]
    biggest = max((s.bytes for s in m.shards if isinstance(s.bytes, int)), default=0)
    for f in m.fields:
        _check_field(f, m.codec.name, biggest, where)
    if len(set(names)) != len(names):
        raise ManifestError(f"{where}: a field is listed twice ({names})")
    base = _first_record(m.build, where)
    first, seen = base, set()
    for i, s in enumerate(m.shards):
        _check_shard(i, s, len(m.fields), first, where)
        first += s.records
        for key in ("name", "index"):
            if getattr(s, key) in seen:
                raise ManifestError(f"{where}: shards[{i}].{key} = {getattr(s, key)!r} is listed twice")
            seen.add(getattr(s, key))
    if declared_records is not None and declared_records != first - base:
        raise ManifestError(f"{where}: records = {declared_records!r} but its shards hold {first - base} records")
    other = next((i for i, s in enumerate(m.shards) if s.pack != m.codec.pack), None)
    if other is not None:  # an append packs with the cache's own pack, so every shard has it
        raise ManifestError(f"{where}: shards[{other}].pack = {m.shards[other].pack!r} but codec.pack = {m.codec.pack!r}: every shard of a cache packs its records alike")
    packed = next((i for i, s in enumerate(m.shards) if s.pack != 1), None)
    if packed is not None and m.version < PACKED_VERSION:
        raise ManifestError(f"{where}: shards[{packed}].pack = {m.shards[packed].pack} needs format version {PACKED_VERSION}, the manifest says {m.version}")
    if m.codec.share and m.version < SHARED_VERSION:
        raise ManifestError(f"{where}: codec.share = {m.codec.share} needs format version {SHARED_VERSION}, the manifest says {m.version}")
