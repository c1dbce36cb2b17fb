"""``FunctionSource``: turn your own generator function into a record source.

Two shapes of function are common:

* per record: ``fn(rng, index, **params) -> {field: array or JSON-able}``;
* per block:  ``fn(rng, start, stop, **params) -> {field: array [stop - start, ...]}``
  (vectorised; a field may also be a list of ``stop - start`` per-record values,
  for ragged arrays or JSON).

Like our own generators, records are made in blocks of ``block_records``; block
``b`` of shard ``i`` gets ``rng = block_rng(seed, i, b)``, so the bytes depend
only on (function, params, seed, plan) and never on the worker count or backend.
``fn`` must be importable by worker processes (defined in a module, or in the
running script: loky ships it by value).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from cachebuild.builder.plan import BLOCK_RECORDS, block_rng
from cachebuild.errors import ConfigError, SourceError
from cachebuild.format.names import JSON_DTYPE

__all__ = ["FunctionSource", "function_name"]

_MODES = ("record", "block")


def function_name(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a function (the default ``kind`` of its source)."""
    fn = getattr(fn, "func", fn)  # functools.partial
    module = getattr(fn, "__module__", None) or "?"
    if module == "__main__":  # a script run directly: its file name, as when it is imported
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        module = spec.name if spec is not None else Path(getattr(main, "__file__", "__main__")).stem
    return f"{module}:{getattr(fn, '__qualname__', type(fn).__name__)}"


def _schema(fields: Mapping[str, str] | Any) -> tuple[tuple[str, str], ...]:
    items = list(fields.items()) if isinstance(fields, Mapping) else [tuple(f) for f in fields]
    if not items:
        raise ConfigError("a FunctionSource needs at least one field: fields={'x': 'float32', ...}")
    out = []
    for name, dtype in items:
        if dtype != JSON_DTYPE:
            try:
                dtype = np.dtype(dtype).name
            except TypeError:
                raise ConfigError.bad_value(f"fields.{name}", dtype, "a numpy dtype name (float32, int64, ...) or 'json'") from None
        out.append((str(name), str(dtype)))
    return tuple(out)


def _value_bytes(value: Any, dtype: str) -> int:
    """Raw bytes of one record's value of a field: an array's ``nbytes`` (a list of numbers as the
    field's dtype), a JSON value's compact text; 64 when it is neither (the writer refuses it later)."""
    nbytes = getattr(value, "nbytes", None)
    if nbytes is not None and dtype != JSON_DTYPE:
        return int(nbytes)
    try:
        if dtype == JSON_DTYPE:
            return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode())
        return int(np.asarray(value, dtype=dtype).nbytes)
    except (TypeError, ValueError, OverflowError):
        return 64


def _raw_bytes(record: Mapping[str, Any], dtypes: Mapping[str, str]) -> int:
    return sum(_value_bytes(v, dtypes.get(k, "")) for k, v in record.items())


def _column_bytes(column: Any, dtype: str) -> int:
    """Raw bytes of a per-block column: a stacked array's ``nbytes``, or the sum over a list of
    per-record values (ragged arrays, JSON); a list's length is not its size (a ragged field of
    200 KB records was taken for 64 bytes, so shards and members grew thousands of times past their bounds)."""
    if dtype != JSON_DTYPE and getattr(column, "nbytes", None) is not None:
        return int(column.nbytes)
    try:
        return sum(_value_bytes(v, dtype) for v in column)
    except TypeError:  # not a list either: the block's check names it when the build makes it
        return 64


def _same(a: Any, b: Any) -> bool:
    """Equal values, arrays by their bytes (a NaN equals itself); values the writer refuses anyway
    (object arrays, unknown types) count as equal, so the writer names them instead."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (np.ndarray, np.generic)):
        return a.dtype == b.dtype and a.shape == b.shape and (a.dtype.hasobject or a.tobytes() == b.tobytes())
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    try:
        return bool(a == b)
    except Exception:
        return True


def _first_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """The first field whose value differs between two makes of the same record; None if none does."""
    for name in list(a) + [k for k in b if k not in a]:
        if name not in a or name not in b or not _same(a[name], b[name]):
            return str(name)
    return None


@dataclass(frozen=True)
class FunctionSource:
    """A :class:`~cachebuild.RecordSource` around a per-record or per-block function.

    Build one with :meth:`per_record` or :meth:`per_block`. ``params`` are passed
    to ``fn`` as keyword arguments and are part of the fingerprint, with the
    function's name, the schema and the block size; change the function's code
    and you must change ``version`` (or a param) to make resume rebuild.
    """

    fn: Callable[..., Any]
    schema: tuple[tuple[str, str], ...]
    mode: str = "record"
    kind: str = ""
    block_records: int = BLOCK_RECORDS
    params: Mapping[str, Any] = field(default_factory=dict)
    record_bytes: int | None = None
    version: str = ""

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ConfigError.bad_value("mode", self.mode, f"must be one of {', '.join(_MODES)}")
        if not callable(self.fn):
            raise ConfigError(f"FunctionSource needs a function, got {type(self.fn).__name__}")
        if not isinstance(self.block_records, int) or self.block_records < 1:
            raise ConfigError.bad_value("block_records", self.block_records, "must be a whole number >= 1")
        if not self.kind:
            object.__setattr__(self, "kind", function_name(self.fn))

    @classmethod
    def per_record(cls, fn: Callable[..., Mapping[str, Any]], fields: Mapping[str, str], **kw: Any) -> "FunctionSource":
        """Source of ``fn(rng, index, **params) -> dict``, one call per record."""
        return cls(fn, _schema(fields), "record", **kw)

    @classmethod
    def per_block(cls, fn: Callable[..., Mapping[str, Any]], fields: Mapping[str, str], **kw: Any) -> "FunctionSource":
        """Source of ``fn(rng, start, stop, **params) -> dict of [stop - start, ...] arrays``."""
        return cls(fn, _schema(fields), "block", **kw)

    def fields(self) -> list[tuple[str, str]]:
        return list(self.schema)

    def config_dict(self) -> dict[str, Any]:
        return {
            "function": function_name(self.fn),
            "mode": self.mode,
            "fields": [list(f) for f in self.schema],
            "params": dict(self.params),
            "version": self.version,
        }

    def estimated_record_bytes(self) -> int:
        """``record_bytes`` if given, else the size of record 0 of shard 0 with seed 0 (made here, then
        dropped): arrays by their bytes (each record's own, for ragged fields), JSON by its compact text."""
        if self.record_bytes is not None:
            return int(self.record_bytes)
        dtypes = dict(self.schema)
        made = self._probe()
        differs = _first_difference(made, self._probe())  # the same rng must make the same record
        if differs is not None:
            raise SourceError(
                f"source {self.kind!r} shard 0 record 0 field {differs!r}: not deterministic: two calls with the same rng made different values"
                " (draw only from the rng argument, never np.random, random or the clock: a resumed build would mix two draws)"
            )
        if self.mode == "record":
            return max(1, _raw_bytes(made, dtypes))
        return max(1, sum(_column_bytes(v, dtypes.get(k, "")) for k, v in made.items()))

    def _probe(self) -> Mapping[str, Any]:
        """Record 0 of shard 0 with seed 0 (a block of one record for a block function)."""
        rng = block_rng(0, 0, 0)
        try:
            made = self.fn(rng, 0, **self.params) if self.mode == "record" else self.fn(rng, 0, 1, **self.params)
        except Exception as exc:
            raise SourceError(f"source {self.kind!r} shard 0 record 0 raised {type(exc).__name__}: {exc} (sizing a probe record, seed 0)") from exc
        if not isinstance(made, Mapping):
            what = "record" if self.mode == "record" else "block"
            raise SourceError(f"source {self.kind!r} shard 0 record 0: the function returned a {type(made).__name__}, not a dict of fields (sizing a probe {what}, seed 0)")
        return made

    def blocks(self, seed: int, shard: int, start: int, stop: int) -> Iterator[list[dict[str, Any]]]:
        for b, a in enumerate(range(start, stop, self.block_records)):
            z = min(a + self.block_records, stop)
            rng = block_rng(seed, shard, b)
            yield self._records(rng, shard, a, z) if self.mode == "record" else self._split(rng, shard, a, z)

    def _records(self, rng: np.random.Generator, shard: int, a: int, z: int) -> list[dict[str, Any]]:
        out, fn, params = [], self.fn, self.params
        i = a
        try:
            for i in range(a, z):
                out.append(fn(rng, i, **params))
        except Exception as exc:
            raise SourceError(f"source {self.kind!r} shard {shard} record {i} raised {type(exc).__name__}: {exc}") from exc
        return out

    def _split(self, rng: np.random.Generator, shard: int, a: int, z: int) -> list[dict[str, Any]]:
        """One call for records [a, z), cut into per-record dicts (views, no copies)."""
        cols = self.fn(rng, a, z, **self.params)
        n = z - a
        if not isinstance(cols, Mapping):
            raise SourceError(f"source {self.kind!r} shard {shard} record {a} block returned a {type(cols).__name__}, not a dict of arrays")
        for name, value in cols.items():
            if not hasattr(value, "__len__") or getattr(value, "ndim", 1) == 0 or len(value) != n:
                got = len(value) if hasattr(value, "__len__") and getattr(value, "ndim", True) else "no"
                raise SourceError(f"source {self.kind!r} shard {shard} record {a} field {name!r}: a block of records [{a}, {z}) needs {n} rows, got {got}")
        names = list(cols)
        return [{k: cols[k][j] for k in names} for j in range(n)]
