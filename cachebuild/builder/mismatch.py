"""Say which build keys differ when an existing cache refuses a resume.

The builder refuses to mix shards of two builds whose fingerprints differ; the
refusal names every differing key with both values (``seed: cache 0, this build
1``; config keys dotted, ``config.graph.n_max: cache 10, this build 12``) so the
user sees what to change instead of guessing between config, seed and codec.
"""

from __future__ import annotations

import json
from typing import Any

from cachebuild.format.names import FORMAT_VERSION, SHARED_VERSION

__all__ = ["fingerprint_doc_of_manifest", "describe_differences"]

_MAX_SHOWN = 6


def fingerprint_doc_of_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint's document as an existing manifest stores it (the same keys the builder hashes)."""
    build = manifest.get("build") or {}
    version = manifest.get("version")
    if isinstance(version, int) and FORMAT_VERSION <= version <= SHARED_VERSION:
        version = FORMAT_VERSION  # a manifest says 2 once grown, 3 once packed, 4 with shared frames; its build hashed FORMAT_VERSION
    return {
        "version": version,
        "kind": manifest.get("kind"),
        "config": manifest.get("config"),
        "seed": manifest.get("seed"),
        "codec": manifest.get("codec"),
        "records": manifest.get("records"),
        "records_per_shard": build.get("records_per_shard"),
        "determinism": build.get("determinism"),
    }


def _flatten(doc: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(doc, dict) and doc:
        for key, value in doc.items():
            _flatten(value, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = doc


def describe_differences(cache: dict[str, Any], this: dict[str, Any]) -> str:
    """``key: cache A, this build B; ...`` for every leaf that differs ('' when none is known)."""
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    _flatten(cache, "", old)
    _flatten(json.loads(json.dumps(this, default=str)), "", new)  # as stored: tuples become lists
    for side in (old, new):  # a codec of one record per member leaves its pack out (format v1's manifest)
        if "codec.name" in side:
            side.setdefault("codec.pack", 1)
            side.setdefault("codec.share", 0)  # (and one whose entries have their own frames, its share)
    for side, other in ((old, new), (new, old)):  # an empty table whose keys the other side sets: name those keys only
        for key in [k for k, v in side.items() if v == {} and any(o.startswith(f"{k}.") for o in other)]:
            del side[key]
    missing = object()
    diffs = [
        f"{key}: cache {_show(old.get(key, missing), missing)}, this build {_show(new.get(key, missing), missing)}"
        for key in sorted(set(old) | set(new))
        if old.get(key, missing) != new.get(key, missing)
    ]
    if len(diffs) > _MAX_SHOWN:
        diffs = diffs[:_MAX_SHOWN] + [f"and {len(diffs) - _MAX_SHOWN} more"]
    return "; ".join(diffs)


def _show(value: Any, missing: object) -> str:
    return "(not set)" if value is missing else repr(value) if isinstance(value, str) else str(value)
