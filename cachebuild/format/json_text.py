"""Standard JSON only: no ``NaN``, ``Infinity`` or ``-Infinity`` in anything a cache holds.

Python's ``json`` writes a float NaN as the bare word ``NaN`` and reads it back,
but that text is not JSON (RFC 8259): ``jq``, JavaScript, Go, Rust's serde and
most other readers refuse the whole member or manifest. So the writer refuses a
non-finite number in a record's JSON field or in a recipe value it would store,
with one line naming the field, the record (or the key) and the value, and every
reader refuses such text as not valid JSON, the same rule on both sides. A
missing number is the user's to say: ``None`` (``null``) or a string.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

__all__ = ["nonfinite_at", "refuse_constant"]


def nonfinite_at(value: Any, path: str = "") -> tuple[str, float] | None:
    """The first place (``a.b[2]``) in ``value`` holding a NaN or an infinite float, and that float; None when all are finite."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    if isinstance(value, dict):
        for k, v in value.items():
            found = nonfinite_at(v, f"{path}.{k}" if path else str(k))
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = nonfinite_at(v, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def refuse_constant(name: str) -> NoReturn:
    """``json.loads(..., parse_constant=refuse_constant)``: ``NaN``/``Infinity`` text is not JSON."""
    raise ValueError(f"{name} is not a JSON number (standard JSON has no NaN or Infinity)")
