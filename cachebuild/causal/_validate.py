"""Value checks shared by the causal config parser: each names the key, the value and the range."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from ..errors import ConfigError

__all__: list[str] = []  # private helpers of cachebuild.causal.config


def _fmt(x: float) -> str:
    return f"{x:g}"


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def number(key: str, v: Any, lo: float, hi: float, open_lo: bool = False) -> float:
    """A finite number in ``[lo, hi]`` (``(lo, hi]`` with ``open_lo``)."""
    ok = is_number(v) and (v > lo if open_lo else v >= lo) and v <= hi
    if not ok:
        bracket = "(" if open_lo else "["
        raise ConfigError.bad_value(key, v, f"must be a number in {bracket}{_fmt(lo)}, {_fmt(hi)}]")
    return float(v)


def prob(key: str, v: Any) -> float:
    return number(key, v, 0.0, 1.0)


def optional_bound(key: str, v: Any, hi: float) -> float | None:
    """A clip bound in ``(0, hi]``, or ``"none"`` (JSON ``null``) for no clipping."""
    if v is None or v == "none":
        return None
    if not (is_number(v) and 0 < v <= hi):
        raise ConfigError.bad_value(key, v, f'must be "none" or a number in (0, {_fmt(hi)}]')
    return float(v)


def integer(key: str, v: Any, lo: int, hi: int | None = None) -> int:
    if not (isinstance(v, int) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ConfigError.bad_value(key, v, f"must be an integer {bound}")
    return v


def boolean(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ConfigError.bad_value(key, v, "must be true or false")
    return v


def choice(key: str, v: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(v, str) or v not in allowed:
        raise ConfigError.bad_value(key, v, "must be one of " + ", ".join(repr(a) for a in allowed))
    return v


def names(key: str, v: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    if not isinstance(v, (list, tuple)) or not v:
        raise ConfigError.bad_value(key, v, "must be a non-empty list of names from " + ", ".join(allowed))
    for name in v:
        if not isinstance(name, str) or name not in allowed:
            raise ConfigError.bad_value(key, name, "unknown name; allowed: " + ", ".join(allowed))
    if len(set(v)) != len(v):
        raise ConfigError.bad_value(key, list(v), "must not repeat a name")
    return tuple(v)


def numbers(key: str, v: Any, lo: float, hi: float) -> tuple[float, ...]:
    """A non-empty list of numbers, each in ``[lo, hi]``."""
    if not isinstance(v, (list, tuple)) or not v or not all(is_number(x) and lo <= x <= hi for x in v):
        raise ConfigError.bad_value(key, v, f"must be a non-empty list of numbers in [{_fmt(lo)}, {_fmt(hi)}]")
    return tuple(float(x) for x in v)


def number_range(key: str, v: Any, lo: float, hi: float) -> tuple[float, float]:
    """A number ``x`` (meaning ``[x, x]``) or a list ``[a, b]`` with ``lo <= a <= b <= hi``."""
    pair = [v, v] if is_number(v) else v
    ok = isinstance(pair, (list, tuple)) and len(pair) == 2 and all(is_number(x) for x in pair)
    if not (ok and lo <= pair[0] <= pair[1] <= hi):
        raise ConfigError.bad_value(key, v, f"must be a number or a range [lo, hi] with {_fmt(lo)} <= lo <= hi <= {_fmt(hi)}")
    return float(pair[0]), float(pair[1])


def table(data: Mapping[str, Any], section: str, cls: type) -> dict[str, Any]:
    """The keys of ``[section]`` with the dataclass defaults filled in; unknown keys are errors."""
    raw = data.get(section, {})
    if not isinstance(raw, Mapping):
        raise ConfigError.bad_value(section, raw, "must be a table")
    known = {f.name for f in dataclasses.fields(cls)}
    for k in raw:
        if k not in known:
            raise ConfigError(f"unknown config key '{section}.{k}' (known: {', '.join(sorted(known))})")
    defaults = cls()
    out = {name: raw.get(name, getattr(defaults, name)) for name in known}
    out["_given"] = set(raw)
    return out
