"""Every error cachebuild raises on purpose.

Each class derives from :class:`CacheBuildError` and from the builtin it
resembles, so callers can catch either. Messages name the file, field and value
at fault. The CLI maps each class to an exit code (``exit_code``) and prints the
message on one line instead of a traceback.
"""

from __future__ import annotations

__all__ = [
    "CacheBuildError",
    "ConfigError",
    "ShardCorruptError",
    "ManifestError",
    "CacheMismatchError",
    "WorkerStateError",
    "OutputError",
    "SourceError",
    "RemoteError",
    "SharedMemoryError",
    "PassSupersededError",
]


class CacheBuildError(Exception):
    """Base class of cachebuild's own errors."""

    exit_code = 1


class ConfigError(CacheBuildError, ValueError):
    """A configuration value (from TOML or a CLI flag) is missing or invalid."""

    exit_code = 2

    @classmethod
    def bad_value(cls, key: str, value: object, allowed: str) -> "ConfigError":
        """Build the standard message: which key, which value, what is allowed."""
        return cls(f"config key '{key}' has invalid value {value!r}: {allowed}")


class ShardCorruptError(CacheBuildError, ValueError):
    """A shard or its index does not match its checksum or cannot be decoded."""

    exit_code = 3


class ManifestError(CacheBuildError, FileNotFoundError):
    """The cache's manifest is missing, unreadable, or of an unknown version."""

    exit_code = 3


class CacheMismatchError(CacheBuildError, ValueError):
    """An existing cache was built from another config/seed than the one requested."""

    exit_code = 4


class WorkerStateError(CacheMismatchError):
    """A loader state saved by torchdata's ``StatefulDataLoader`` with another ``num_workers``.

    Its message stays one line when torch re-raises it in the main process from a
    DataLoader worker (torch builds that copy from the worker's whole traceback:
    the constructor keeps the traceback's last line, the worker's own message).
    """

    def __init__(self, message: str = "") -> None:
        if message.startswith("Caught ") and "Traceback" in message:
            mine = [ln for ln in message.splitlines() if ln.startswith(f"{type(self).__module__}.{type(self).__qualname__}: ")]
            message = mine[-1].split(": ", 1)[1] if mine else message
        super().__init__(message)


class OutputError(CacheBuildError, OSError):
    """The output location cannot be written (a file, read-only, disk full, ...)."""

    exit_code = 5


class SourceError(CacheBuildError, ValueError):
    """An input file (HDF5, WAV, ...) is missing, malformed or incompatible."""

    exit_code = 6


class RemoteError(CacheBuildError, OSError):
    """A remote cache location (http, s3, ...) cannot be reached or read."""

    exit_code = 7


class SharedMemoryError(CacheBuildError, OSError):
    """The loader's workers need more shared memory (``/dev/shm``) than is free for their batch slots."""

    exit_code = 2


class PassSupersededError(CacheBuildError, RuntimeError):
    """A pass over a loader or stream was still being iterated after ``load_state_dict``, ``set_epoch``
    (to another epoch) or a newer pass took over its position: its batches would be counted on top of
    the new one, so it stops instead (see :mod:`loaders.passes`)."""
