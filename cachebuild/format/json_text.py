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

import json
import json.encoder
import math
from typing import Any, Callable, NoReturn

__all__ = ["compact_encoder", "nonfinite_at", "refuse_constant"]


def compact_encoder() -> Callable[[Any], str]:
    """A function equal to ``json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)``
    (the text a JSON member stores), for encoding many values: ``json.dumps`` builds a
    ``JSONEncoder`` and a C encoder for every call, about 3 us of a causal graph's 15-20.
    It is the same C encoder ``json.dumps`` uses, so the text and the errors are the same; use one
    per batch of values (after an error its circular-reference markers may hold stale entries).
    Where the C encoder is missing or its signature differs, it is ``json.dumps`` itself."""
    encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
    make: Any = getattr(json.encoder, "c_make_encoder", None)
    try:  # (the arguments JSONEncoder.iterencode passes it, Python 3.8-3.14)
        c_encode = make({}, encoder.default, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, False)
    except TypeError:  # (None, or another signature)
        return encoder.encode
    probe = {"b": [1.5, -0.0, 1e-07, 2**70, None, True], "a": "\u00e9\n"}
    if "".join(c_encode(probe, 0)) != json.dumps(probe, sort_keys=True, separators=(",", ":"), allow_nan=False):  # pragma: no cover
        return encoder.encode
    return lambda value: "".join(c_encode(value, 0))


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
