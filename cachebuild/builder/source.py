"""What the builder needs from a record source (causal graphs, mel files, your own data).

A source is a small, picklable description of how to make records; the builder
owns planning, files, parallelism and resume. Our own sources
(:class:`~cachebuild.builder.causal_source.CausalSource`,
:class:`~cachebuild.builder.mel_source.MelBuildSource`) and the adapter
:class:`~cachebuild.function_source.FunctionSource` satisfy this protocol; so
does any frozen dataclass with the same members.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol, Sequence, runtime_checkable

__all__ = ["RecordSource"]


@runtime_checkable
class RecordSource(Protocol):
    """How to make records; every member must be a pure function of the source's config.

    * ``kind``: the source's name (manifest, error messages); read-only, so a
      frozen dataclass field satisfies it.
    * ``block_records``: records per generator call. Part of the determinism
      contract (block ``b`` of shard ``i`` is seeded from ``(seed, i, b)``), so it
      is recorded in the build fingerprint and the manifest.
    * ``fields()``: the ordered schema ``[(field, dtype), ...]``; dtype is a numpy
      dtype name (``"float32"``) or ``"json"`` for a JSON-able dict.
    * ``config_dict()``: JSON-able parameters the bytes depend on (fingerprint).
    * ``estimated_record_bytes()``: raw bytes per record, to size shards.
    * ``blocks(seed, shard, start, stop)``: yields lists of records (dicts of
      numpy arrays, plus dicts for JSON fields) for records ``[start, stop)`` of
      shard ``shard``; the output may depend only on (config, seed, shard,
      start, stop), never on the worker or the process.
    """

    @property
    def kind(self) -> str: ...

    @property
    def block_records(self) -> int: ...

    def fields(self) -> Sequence[tuple[str, str]]: ...

    def config_dict(self) -> dict[str, Any]: ...

    def estimated_record_bytes(self) -> int: ...

    def blocks(self, seed: int, shard: int, start: int, stop: int) -> Iterator[list[dict[str, Any]]]: ...
