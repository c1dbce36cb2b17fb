"""Fill one shard from a source, turning a source's failure into one line that names it.

A user's source may raise, or return a record with a missing, extra or
mistyped field; the builder reports that as a :class:`SourceError` naming the
source, the shard, the record and the field, instead of a traceback from deep
inside the shard writer. The checks cost nothing on the good path: the writer
validates every field already, and the precise diagnosis runs only on failure.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from cachebuild.builder.plan import BLOCK_RECORDS, ShardSpec
from cachebuild.builder.source import RecordSource
from cachebuild.builder.stop import raise_if_stopped
from cachebuild.errors import CacheBuildError, ConfigError, ManifestError, SourceError
from cachebuild.format.limits import FIELD_NAME_RE, check_dtype
from cachebuild.format.names import JSON_DTYPE
from cachebuild.format.shard_writer import ShardWriter

__all__ = ["fill_shard", "probe_source", "record_problem", "source_error", "block_records_of", "check_schema"]


def block_records_of(source: RecordSource) -> int:
    """The source's block size for the fingerprint; sources written before it was
    part of the protocol fall back to the old recorded constant."""
    return int(getattr(source, "block_records", BLOCK_RECORDS))


def check_schema(source: RecordSource) -> None:
    """Refuse, before anything is made or written, a schema that every reader would refuse
    (a field name outside ``[A-Za-z0-9_-]``, a dtype outside the closed set): one line naming
    the source, the field and the value, instead of a writer's traceback from a build worker."""
    for name, dtype in source.fields():
        if not isinstance(name, str) or not FIELD_NAME_RE.fullmatch(name):
            raise ConfigError(f"source {source.kind!r}: field name {name!r} is not allowed (letters, digits, _ and -, at most 64)")
        try:
            check_dtype(dtype, f"field '{name}' dtype", "schema")
        except ManifestError as exc:
            raise ConfigError(f"source {source.kind!r}: {str(exc).removeprefix('schema: ')}") from None


def record_problem(record: Any, fields: Sequence[tuple[str, str]]) -> str:
    """What is wrong with ``record`` against the schema, as ``field 'x': ...`` (empty: nothing found)."""
    if not isinstance(record, Mapping):
        return f"record is a {type(record).__name__}, not a dict of fields"
    names = [f for f, _ in fields]
    undeclared = [k for k in record if k not in names]
    for name in names:
        if name not in record:
            made = f"; the record has {undeclared}, not declared" if undeclared else ""  # a misspelt name: show it
            return f"field {name!r}: missing (the source declares {names}{made})"
    for name in record:
        if name not in names:
            return f"field {name!r}: not declared by the source (declared: {names})"
    for name, dtype in fields:
        value = record[name]
        if dtype == JSON_DTYPE:
            if not isinstance(value, (dict, list, str, int, float, bool)) and value is not None:
                return f"field {name!r}: expected a JSON-able value, got {type(value).__name__}"
            continue
        got = getattr(value, "dtype", None)
        if got is None or not hasattr(value, "ndim"):
            return f"field {name!r}: expected a numpy {dtype} array, got {type(value).__name__}"
        if got != dtype:
            return f"field {name!r}: expected dtype {dtype}, got {got}"
    return ""


def source_error(source: RecordSource, shard: int, record: int, detail: str) -> SourceError:
    """The standard one-line message: ``source 'k' shard N record R field 'f': ...``."""
    return SourceError(f"source {source.kind!r} shard {shard} record {record} {detail}".replace("\n", " "))


def fill_shard(writer: ShardWriter, source: RecordSource, seed: int, spec: ShardSpec) -> None:
    """Write records [spec.start, spec.stop) of ``source`` into ``writer``, or raise a SourceError."""
    fields = list(source.fields())
    blocks = iter(source.blocks(seed, spec.index, spec.start, spec.stop))
    while True:
        try:
            block = next(blocks)
        except StopIteration:
            break
        except CacheBuildError:
            raise
        except Exception as exc:
            raise source_error(source, spec.index, spec.start + writer.records, f"raised {type(exc).__name__}: {exc}") from exc
        raise_if_stopped()  # a build stopped meanwhile (a cluster's task outliving it): drop the shard
        _add_block(writer, source, spec, fields, block)
    _write(writer, source, spec, fields, [], writer.flush_pending)
    if writer.records != spec.records:
        raise source_error(source, spec.index, spec.start + writer.records, f"missing: the source made {writer.records} records, the plan asked for {spec.records}")


def _add_block(writer: ShardWriter, source: RecordSource, spec: ShardSpec, fields: list[tuple[str, str]], block: Any) -> None:
    """Write one block of records, or raise a SourceError naming the first bad record."""
    start = spec.start + writer.records
    if not isinstance(block, list):
        block = list(block)
    if start + len(block) > spec.stop:
        rid = max(start, spec.stop)
        raise source_error(source, spec.index, rid, f"is beyond the shard: the plan asked for records [{spec.start}, {spec.stop})")
    _write(writer, source, spec, fields, block, lambda: writer.add_block(block))


def _write(writer: ShardWriter, source: RecordSource, spec: ShardSpec, fields: list[tuple[str, str]], block: list[Any], call: Callable[[], None]) -> None:
    """Run ``call`` (which writes ``block`` after the records the writer holds back), or raise a
    SourceError naming the first bad record among those."""
    held = writer.pending
    first = spec.start + writer.records - len(held)  # record id of held[0] (or of block[0])
    try:
        call()
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        tried = [*held, *block]
        bad = next((i for i, r in enumerate(tried) if record_problem(r, fields)), None)
        if bad is None:
            rid = spec.start + getattr(exc, "record", writer.records - spec.start)
            detail = f"cannot be written: {type(exc).__name__}: {exc}"
        else:
            rid, detail = first + bad, record_problem(tried[bad], fields)
        raise source_error(source, spec.index, rid, detail) from exc


def probe_source(source: RecordSource, seed: int, spec: ShardSpec) -> None:
    """Make and check the first block of ``spec`` in this process, writing nothing.

    Run before ``--overwrite`` starts its staged build (or, for a remote output,
    deletes the old cache), so a source that fails at once (bad field, wrong
    dtype, an exception) leaves the folder as it was.
    """
    fields = list(source.fields())
    try:
        block = next(iter(source.blocks(seed, spec.index, spec.start, spec.stop)), [])
    except CacheBuildError:
        raise
    except Exception as exc:
        raise source_error(source, spec.index, spec.start, f"raised {type(exc).__name__}: {exc}") from exc
    for i, record in enumerate(block):
        problem = record_problem(record, fields)
        if problem:
            raise source_error(source, spec.index, spec.start + i, problem)
