"""What the builder needs from a record source (causal graphs, mel files, ...)."""

from __future__ import annotations

from typing import Any, Iterator, Protocol, Sequence

__all__ = ["RecordSource"]


class RecordSource(Protocol):
    """A picklable description of how to make records; the builder owns files.

    ``blocks`` yields lists of records (dicts of numpy arrays plus JSON-able
    dicts for JSON fields) for records [start, stop) of shard ``shard``; its
    output may depend only on (the source's config, seed, shard, start, stop).
    """

    kind: str

    def fields(self) -> Sequence[tuple[str, str]]: ...

    def config_dict(self) -> dict[str, Any]: ...

    def estimated_record_bytes(self) -> int: ...

    def blocks(self, seed: int, shard: int, start: int, stop: int) -> Iterator[list[dict[str, Any]]]: ...
