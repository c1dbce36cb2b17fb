"""Numbers entering at the edge (CLI flags, recipe keys, library arguments), checked once.

NaN, infinities, zero where a count is needed and absurdly large values are
refused with a :class:`ConfigError` naming the option and the value, before any
work or allocation. ``--graphs 1e20`` or ``--seconds nan`` is a typo, never a plan.
"""

from __future__ import annotations

import math
from typing import Any

from cachebuild.errors import ConfigError

__all__ = ["MAX_RECORDS", "MAX_SHARDS", "whole", "finite"]

MAX_RECORDS = 1 << 40  # ~1.1e12 records: far beyond any cache a disk holds
MAX_SHARDS = 500_000  # the manifest lists every shard (~330 bytes each); keeps it under its read limit


def whole(key: str, value: Any, lo: int, hi: int) -> int:
    """``value`` if it is a whole number in ``[lo, hi]`` (not a bool, not a float), else :class:`ConfigError`."""
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ConfigError(f"{key} = {value!r} is invalid: must be a whole number from {lo} to {hi}")
    return value


def finite(key: str, value: Any, lo: float, hi: float, lo_open: bool = False) -> float:
    """``value`` if it is a finite number in ``[lo, hi]`` (``(lo, hi]`` when ``lo_open``), else :class:`ConfigError`."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (lo < value if lo_open else lo <= value) and value <= hi
    if not ok:
        bracket = "(" if lo_open else "["
        raise ConfigError(f"{key} = {value!r} is invalid: must be a finite number in {bracket}{lo:g}, {hi:g}]")
    return float(value)
