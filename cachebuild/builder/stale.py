"""A note when a complete cache's input files changed after it was built.

A rerun that finds its cache complete does nothing; its fingerprint covers the
source's description (file count, labels, parameters), not the input's bytes,
so an HDF5 file or WAV folder rewritten with the same shape would keep serving
the old records without a word. Sources that read files list them
(``input_files()``); one modified after the manifest was written is named.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["changed_inputs_note"]

_SHOWN = 3


def changed_inputs_note(source: Any, folder: str | os.PathLike[str], manifest_name: str) -> str | None:
    """One sentence naming the inputs of ``source`` modified after ``folder``'s manifest, or None."""
    files = getattr(source, "input_files", None)
    if files is None:
        return None
    try:
        built = os.stat(Path(folder) / manifest_name).st_mtime_ns
    except OSError:
        return None
    newer = []
    for path in files():
        try:
            if os.stat(path).st_mtime_ns > built:
                newer.append(str(path))
        except OSError:
            continue
    if not newer:
        return None
    shown = ", ".join(newer[:_SHOWN]) + (f" and {len(newer) - _SHOWN} more" if len(newer) > _SHOWN else "")
    return f"{shown} modified after this cache was built (its shape still matches the recipe, so nothing was rebuilt); pass --overwrite to rebuild from it"
