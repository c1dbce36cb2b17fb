"""Exogenous-noise samplers of the causal generator, in two conventions.

``noise.convention`` picks what ``scale`` means (``s`` below; ``E`` is a
standard exponential, ``Z`` a standard normal, ``C = Z1 / Z2`` a standard
Cauchy, ``U`` uniform on ``[0, 1)``):

=========  ==========================================  ==============================================
kind       ``unit_variance`` (ours, the rich recipe)   ``numpy`` (the users' ``SCMGenerator``)
=========  ==========================================  ==============================================
normal     ``s Z``                                     ``s Z`` (``np.random.normal(scale=s)``)
laplace    ``s (E1 - E2) / sqrt(2)`` (variance s**2)   ``s (E1 - E2)`` (``laplace(scale=s)``, var 2s**2)
gumbel     ``-s (log E + gamma) sqrt(6) / pi``         ``-s log E`` (``gumbel(scale=s)``, mean 0.577s)
cauchy     ``s clip(C, +-cauchy_clip)``                ``clip(s C, +-cauchy_clip)``
uniform    ``s (U - 1/2) 2 sqrt(3)`` (variance s**2)   ``s 1.73 (2U - 1)`` (``uniform(-1.73s, 1.73s)``)
=========  ==========================================  ==============================================

No sampler can return inf or NaN: ``E`` is floored at the smallest normal
float32 before its log (numpy's float32 exponential returns exact zeros about
once in 2.5 million draws, which made ``-log E`` infinite), and the Cauchy ratio
is clipped (``x / 0`` is clipped to the bound, ``0 / 0`` becomes 0).
The ``numpy`` cauchy is clipped after scaling, so its ``scale`` must be finite.
Draws are float32 and come only from the ``Generator`` passed in, in a fixed
order, so the result is a pure function of its state.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["NOISE_KINDS", "NOISE_CONVENTIONS", "USERS_UNIFORM_HALF_WIDTH", "sample_noise"]

NOISE_KINDS: tuple[str, ...] = ("normal", "laplace", "gumbel", "cauchy", "uniform")
"""Noise distributions; ``noise.kind = "mixed"`` draws one of ``noise.kinds`` per graph."""

NOISE_CONVENTIONS: tuple[str, ...] = ("unit_variance", "numpy")
"""What ``noise.scale`` means: the standard deviation, or numpy's own scale parameter."""

USERS_UNIFORM_HALF_WIDTH = 1.73
"""The users' uniform noise is ``uniform(-1.73 s, 1.73 s)`` (about unit variance)."""

_F = np.float32
_TINY = np.finfo(np.float32).tiny


def _exponential(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_exponential(shape, dtype=_F)


def _gumbel(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """``-log E`` with ``E`` floored at float32's smallest normal: at most 87.3, never inf."""
    e = _exponential(rng, shape)
    np.maximum(e, _TINY, out=e)
    np.log(e, out=e)
    np.negative(e, out=e)
    return e


def _cauchy(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Standard Cauchy as the ratio of two standard normals (may hold +-inf or NaN: clip next)."""
    z = rng.standard_normal(shape, dtype=_F)
    with np.errstate(divide="ignore", invalid="ignore"):
        z /= rng.standard_normal(shape, dtype=_F)
    np.nan_to_num(z, copy=False, nan=0.0)
    return z


def _unit_variance(rng: np.random.Generator, kind: str, shape: tuple[int, ...], cauchy_clip: float) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal(shape, dtype=_F)
    if kind == "laplace":
        e = _exponential(rng, shape)
        e -= _exponential(rng, shape)
        e *= _F(1 / math.sqrt(2.0))
        return e
    if kind == "gumbel":
        e = _gumbel(rng, shape)
        e -= _F(np.euler_gamma)
        e *= _F(math.sqrt(6.0) / math.pi)
        return e
    if kind == "cauchy":
        z = _cauchy(rng, shape)
        np.clip(z, -cauchy_clip, cauchy_clip, out=z)
        return z
    if kind == "uniform":
        u = rng.random(shape, dtype=_F)
        u -= _F(0.5)
        u *= _F(2.0 * math.sqrt(3.0))
        return u
    raise ValueError(f"unknown noise kind {kind!r}; expected one of {NOISE_KINDS}")


def _numpy_convention(rng: np.random.Generator, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """Unscaled draws of the users' distributions (the scale is applied by the caller)."""
    if kind == "laplace":
        e = _exponential(rng, shape)
        e -= _exponential(rng, shape)
        return e
    if kind == "gumbel":
        return _gumbel(rng, shape)
    if kind == "cauchy":
        return _cauchy(rng, shape)  # clipped after scaling, by the caller
    if kind == "uniform":
        u = rng.random(shape, dtype=_F)
        u *= _F(2.0 * USERS_UNIFORM_HALF_WIDTH)
        u -= _F(USERS_UNIFORM_HALF_WIDTH)
        return u
    return _unit_variance(rng, kind, shape, 0.0)


def sample_noise(
    rng: np.random.Generator,
    kind: str,
    shape: tuple[int, ...],
    cauchy_clip: float,
    dtype: "np.dtype | type[np.floating]" = np.float32,
    convention: str = "unit_variance",
    scale: np.ndarray | float | None = None,
) -> np.ndarray:
    """Draw noise of ``kind`` in ``convention`` (module table), times ``scale`` if given.

    ``scale`` broadcasts against ``shape`` (per-node scales). ``unit_variance``:
    zero mean (median for cauchy) and unit variance before scaling, cauchy
    clipped to ``+-cauchy_clip`` before scaling. ``numpy``: numpy's own
    distributions, cauchy clipped to ``+-cauchy_clip`` after scaling, as the
    users do. The result is always finite.
    """
    if convention == "unit_variance":
        out = _unit_variance(rng, kind, shape, cauchy_clip)
    elif convention == "numpy":
        out = _numpy_convention(rng, kind, shape)
    else:
        raise ValueError(f"unknown noise convention {convention!r}; expected one of {NOISE_CONVENTIONS}")
    if scale is not None:
        out *= np.asarray(scale, dtype=_F)
    if convention == "numpy" and kind == "cauchy":
        np.clip(out, -cauchy_clip, cauchy_clip, out=out)
    return out.astype(dtype, copy=False)
