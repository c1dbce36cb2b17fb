"""The cache manifest: one JSON at the cache root, written last and atomically.

It holds the format version, the generator config and seed, the codec, the
field schemas (dtype, rank, max shape, which axes vary) and, per shard, its
name, first record id, record count, bytes and checksums.
"""

from __future__ import annotations

import errno
import json
import stat
from dataclasses import MISSING, dataclass, field, fields as dataclass_fields
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from cachebuild.errors import CacheBuildError, ManifestError, ShardCorruptError, SourceError
from cachebuild.format.codec import Codec, parse_codec
from cachebuild.format.limits import MAX_MANIFEST_BYTES, check_manifest, check_tables, load_json_bounded
from cachebuild.format.names import FORMAT_NAME, FORMAT_VERSION, JSON_DTYPE, MANIFEST_NAME, PACKED_VERSION, SHARED_VERSION

__all__ = ["FORMAT_VERSION", "MANIFEST_NAME", "FieldSchema", "ShardEntry", "Manifest", "manifest_version", "read_manifest", "schemas_from_indexes", "shape_bounds"]

READ_VERSIONS = (1, 2, 3, 4)  # 2: a grown cache (generation >= 1, see cachebuild.format.generations); 3: packed members (cachebuild.format.packing); 4: shared frames (cachebuild.format.shared_frames)


@dataclass(frozen=True)
class FieldSchema:
    """One field of every record: dtype (or ``"json"``), rank, max shape over the cache, varying axes."""

    name: str
    dtype: str
    ndim: int = 0
    max_shape: tuple[int, ...] = ()
    min_shape: tuple[int, ...] = ()

    @property
    def varying_axes(self) -> tuple[int, ...]:
        """Axes whose length differs between records (padding needed to batch them)."""
        return tuple(i for i, (lo, hi) in enumerate(zip(self.min_shape, self.max_shape)) if lo != hi)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "ndim": self.ndim,
            "max_shape": list(self.max_shape),
            "min_shape": list(self.min_shape),
            "varying_axes": list(self.varying_axes),
        }


@dataclass(frozen=True)
class ShardEntry:
    """A complete shard: what :meth:`ShardWriter.close <cachebuild.format.shard_writer.ShardWriter.close>`
    returns and the manifest lists (name, index file, records, sizes and sha256 checksums)."""

    name: str
    index: str
    first_record: int
    records: int
    bytes: int
    sha256: str
    index_sha256: str
    raw_bytes: int = 0
    index_bytes: int = 0
    pack: int = 1
    """Records per tar member (:mod:`cachebuild.format.packing`); absent from the manifest when 1."""

    def to_dict(self) -> dict[str, Any]:
        doc = dict(self.__dict__)
        if self.pack == 1:
            del doc["pack"]
        return doc


@dataclass(frozen=True)
class Manifest:
    """The parsed ``manifest.json`` of a cache (``root`` is where it was read from)."""

    kind: str
    config: dict[str, Any]
    seed: int
    codec: Codec
    fields: tuple[FieldSchema, ...]
    shards: tuple[ShardEntry, ...]
    version: int = FORMAT_VERSION
    build: dict[str, Any] = field(default_factory=dict)
    created_by: str = ""
    root: str = ""

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    def schema(self, name: str) -> FieldSchema:
        """The schema of field ``name``; a clear error for an unknown one."""
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"field {name!r} not in cache {self.root or '?'} (has: {', '.join(self.field_names)})")

    def shard_starts(self) -> np.ndarray:
        """First global record id of every shard, plus the total at the end ([shards+1])."""
        counts = np.array([s.records for s in self.shards], dtype=np.int64)
        return np.concatenate([[0], np.cumsum(counts)])

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT_NAME,
            "version": manifest_version(self.version, self.shards, self.codec.share or 0),
            "kind": self.kind,
            "created_by": self.created_by,
            "seed": self.seed,
            "codec": self.codec.to_dict(),
            "records": self.records,
            "fields": {f.name: f.to_dict() for f in self.fields},
            "config": self.config,
            "build": self.build,
            "shards": [s.to_dict() for s in self.shards],
        }
        return (json.dumps(doc, indent=1, sort_keys=False, allow_nan=False) + "\n").encode()  # standard JSON (format.json_text)

    @classmethod
    def from_json(cls, data: bytes | str, root: str = "") -> "Manifest":
        """Parse manifest text; errors name the location and the bad key."""
        where = f"{root}/{MANIFEST_NAME}" if root else MANIFEST_NAME
        raw = data.encode() if isinstance(data, str) else data
        doc = load_json_bounded(raw, where, ManifestError, MAX_MANIFEST_BYTES)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
            raise ManifestError(f"{where}: not a cachebuild manifest (format={doc.get('format') if isinstance(doc, dict) else None!r})")
        if doc.get("version") not in READ_VERSIONS:
            raise ManifestError(f"{where}: format version {doc.get('version')!r} is not supported (this cachebuild reads {', '.join(map(str, READ_VERSIONS))})")
        check_tables(doc, _SHARD_KEYS, _SHARD_REQUIRED, where)
        try:
            fields = tuple(FieldSchema(name, f["dtype"], f["ndim"], tuple(f["max_shape"]), tuple(f["min_shape"])) for name, f in doc["fields"].items())
            shards = tuple(ShardEntry(**s) for s in doc["shards"])
            manifest = cls(
                kind=doc["kind"],
                config=doc["config"],
                seed=doc["seed"],
                codec=parse_codec(doc["codec"]),
                fields=fields,
                shards=shards,
                version=doc["version"],
                build=doc.get("build", {}),
                created_by=doc.get("created_by", ""),
                root=root,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(f"{where}: malformed ({type(exc).__name__}: {exc})") from exc
        check_manifest(manifest, doc.get("records"), where)
        return manifest


_SHARD_KEYS = tuple(f.name for f in dataclass_fields(ShardEntry))
_SHARD_REQUIRED = sum(f.default is MISSING for f in dataclass_fields(ShardEntry))  # the keys without a default come first


def manifest_version(version: int, shards: Sequence[ShardEntry], share: int = 0) -> int:
    """The version a manifest is written with: ``version`` (1, or 2 for a grown cache), raised to
    :data:`~cachebuild.format.names.PACKED_VERSION` once a shard packs records, and to
    :data:`~cachebuild.format.names.SHARED_VERSION` when entries may share frames (``codec.share``),
    so readers older than packing (or sharing) refuse the cache with their version message instead of misreading it."""
    if share:
        return max(version, SHARED_VERSION)
    return max(version, PACKED_VERSION) if any(s.pack != 1 for s in shards) else version


def _missing_manifest_hint(root: Path) -> str:
    """Why a folder has no manifest: it does not exist, a build stopped before publishing it, or it is no cache."""
    if not root.exists():
        return " (the folder does not exist)"
    if (root / ".overwrite" / "swap.json").is_file():  # an --overwrite swap a crash interrupted (cachebuild.builder.overwrite)
        return " (an --overwrite build was being swapped in: rerun that build command to finish it)"
    if (root / "build.json").is_file():  # the builder's record of an unfinished build (cachebuild.builder.markers)
        return " (incomplete build? rerun the same command to finish it)"
    return " (not a cachebuild cache: build one with `cachebuild generate`, `mel` or `build`)"


def confined_file(root: Path, name: str, error: type[CacheBuildError] = ShardCorruptError) -> Path:
    """``root / name`` for reading, refused with ``error`` when it is a symbolic link that leads
    outside ``root`` (or loops), or anything but a regular file (a FIFO, a device, a folder): the
    manifest's names are plain names (:mod:`cachebuild.format.limits`), and a stranger's folder
    must not make a reader open a file elsewhere through a link, or block on a FIFO. A missing
    file, or a ``root`` that is a file, is left to the caller's own message."""
    path = root / name
    try:
        st = path.lstat()
        target = path.resolve() if stat.S_ISLNK(st.st_mode) else path
        if target is not path:
            st = target.stat()
    except (FileNotFoundError, NotADirectoryError):  # (a file given for its folder: the caller names that)
        return path
    except (OSError, RuntimeError) as exc:  # a link loop (RuntimeError from resolve() before Python 3.13), no permission
        reason = "a symbolic link loop" if isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP else exc.strerror
        raise error(f"{path} cannot be read ({reason}): refused") from None
    if target is not path and not target.is_relative_to(root.resolve()):
        raise error(f"{path} is a symbolic link to {target}, outside the cache {root}: a cache is read only inside its folder")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path} is not a regular file (a FIFO, device or folder): refused")
    return path


def read_manifest(root: str | Path) -> Manifest:
    """Read ``root/manifest.json``; a missing cache gives a message naming the path."""
    path = confined_file(Path(root), MANIFEST_NAME, ManifestError)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError as exc:
        hint = _missing_manifest_hint(Path(root))
        raise ManifestError(f"no cache manifest at {path}{hint}") from exc
    except NotADirectoryError as exc:  # the manifest or a shard given for its cache
        parent = Path(root).parent
        hint = f": pass its folder, {parent}" if (parent / MANIFEST_NAME).is_file() else f" (a cache is a folder holding {MANIFEST_NAME})"
        raise ManifestError(f"{root} is a file, not a cache folder{hint}") from exc
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror}") from exc
    return Manifest.from_json(data, str(root))


def shape_bounds(index: np.ndarray) -> np.ndarray:
    """Two rows standing for a shard's whole index in :func:`schemas_from_indexes`: each field's
    smallest and largest shape per axis, and the rank of its first record (empty for an empty shard)."""
    if not len(index):
        return index[:0]
    out = np.zeros((2, index.shape[1]), index.dtype)
    out["ndim"] = index["ndim"][0]
    out["shape"][0], out["shape"][1] = index["shape"].min(axis=0), index["shape"].max(axis=0)
    return out


def schemas_from_indexes(fields: Sequence[tuple[str, str]], indexes: Sequence[np.ndarray], names: Sequence[str] = ()) -> tuple[FieldSchema, ...]:
    """Field schemas (max/min shape per axis) computed from the shards' indexes (of the shards ``names``).

    A field whose number of dims differs between shards (each shard's writer keeps it within the
    shard) raises :class:`~cachebuild.errors.SourceError`: no reader accepts such a cache."""
    out = []
    for j, (name, dtype) in enumerate(fields):
        if dtype == JSON_DTYPE or not indexes or sum(len(ix) for ix in indexes) == 0:
            out.append(FieldSchema(name, dtype))
            continue
        cols = [ix[:, j] for ix in indexes if len(ix)]
        ndim = int(cols[0]["ndim"][0])
        ranks = [int(c["ndim"][0]) for c in cols]
        if any(r != ndim for r in ranks):
            shard = [names[k] if k < len(names) else f"shard {k}" for k, ix in enumerate(indexes) if len(ix)]
            k = next(k for k, r in enumerate(ranks) if r != ndim)
            raise SourceError(f"field {name!r}: {shard[k]} has records of {ranks[k]} dims, {shard[0]} of {ndim} (a field keeps one number of dims in every record)")
        shapes = np.concatenate([c["shape"][:, :ndim] for c in cols])
        out.append(FieldSchema(name, dtype, ndim, tuple(int(v) for v in shapes.max(0)), tuple(int(v) for v in shapes.min(0))))
    return tuple(out)
