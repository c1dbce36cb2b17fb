"""Edge functions and exogenous-noise samplers of the causal generator.

Both work on whole blocks of values at once (numpy arrays of any shape), so the
simulation in :mod:`cachebuild.causal.sampler` pays one numpy call per function
id and node, never one per graph or per sample.

Edge-function semantics (``id: name -> f(x)``; ``x`` is the parent value after
clipping to ``mechanism.clip_parent``):

====  ============  ====================================================
 0    linear        ``x`` (sampled with weight 2: the user's list has it twice)
 1    neg_linear    ``-x``
 2    sin           ``sin(x)``
 3    cos           ``cos(x)``
 4    tanh          ``tanh(x)``
 5    log           ``sign(x) * log1p(|x|)``
 6    exp           ``exp(clip(x, -5, 5))`` (:data:`EXP_CLIP`)
 7    sqrt          ``sign(x) * sqrt(|x|)``
 8    quadratic     ``x**2``
 9    cubic         ``x**3``
10    sigmoid       ``1 / (1 + exp(-x))``
11    step          ``1.0 if x > 0 else 0.0``
12    abs           ``|x|``
13    poly          ``0.5 x**2 + 0.5 x``
14    sawtooth      ``x - floor(x)`` (in ``[0, 1)``, period 1)
15    rational      ``2x / (1 + |x|)``
====  ============  ====================================================

Noise kinds are scaled to unit variance, so ``noise_scale`` is the standard
deviation of the noise of a node, except for ``cauchy`` (no variance): there it
is the Cauchy scale, applied after clipping the standard Cauchy variate to
``+-noise.cauchy_clip``.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

__all__ = [
    "EDGE_FUNCTIONS",
    "EDGE_FUNCTION_WEIGHTS",
    "EXP_CLIP",
    "NOISE_KINDS",
    "apply_edge_function",
    "apply_edge_function_",
    "sample_noise",
]

EDGE_FUNCTIONS: tuple[str, ...] = (
    "linear",
    "neg_linear",
    "sin",
    "cos",
    "tanh",
    "log",
    "exp",
    "sqrt",
    "quadratic",
    "cubic",
    "sigmoid",
    "step",
    "abs",
    "poly",
    "sawtooth",
    "rational",
)
"""Edge-function names; the position of a name is its id in the ``edge_fn`` field."""

EDGE_FUNCTION_WEIGHTS: dict[str, float] = {name: (2.0 if name == "linear" else 1.0) for name in EDGE_FUNCTIONS}
"""Relative sampling weight of each function (linear counts twice, as in the user's list)."""

EXP_CLIP = 5.0
"""The ``exp`` edge function evaluates ``exp(clip(x, -EXP_CLIP, EXP_CLIP))``."""

NOISE_KINDS: tuple[str, ...] = ("normal", "laplace", "gumbel", "cauchy", "uniform")
"""Noise distributions; ``noise.kind = "mixed"`` draws one of these per graph."""


def _sign_log(x: np.ndarray) -> None:
    t = np.abs(x)
    np.log1p(t, out=t)
    np.copysign(t, x, out=x)


def _exp(x: np.ndarray) -> None:
    np.clip(x, -EXP_CLIP, EXP_CLIP, out=x)
    np.exp(x, out=x)


def _sign_sqrt(x: np.ndarray) -> None:
    t = np.abs(x)
    np.sqrt(t, out=t)
    np.copysign(t, x, out=x)


def _cubic(x: np.ndarray) -> None:
    x *= x * x


def _sigmoid(x: np.ndarray) -> None:
    np.negative(x, out=x)
    np.exp(x, out=x)
    x += 1
    np.reciprocal(x, out=x)


def _poly(x: np.ndarray) -> None:
    t = x * 0.5
    t += 0.5
    x *= t


def _sawtooth(x: np.ndarray) -> None:
    x -= np.floor(x)


def _rational(x: np.ndarray) -> None:
    t = np.abs(x)
    t += 1
    x *= 2
    x /= t


def _unary(ufunc: np.ufunc) -> Callable[[np.ndarray], None]:
    return lambda x: ufunc(x, out=x)


_IMPLS: tuple[Callable[[np.ndarray], None], ...] = (
    lambda x: None,  # linear
    _unary(np.negative),
    _unary(np.sin),
    _unary(np.cos),
    _unary(np.tanh),
    _sign_log,
    _exp,
    _sign_sqrt,
    _unary(np.square),
    _cubic,
    _sigmoid,
    lambda x: np.heaviside(x, 0.0, out=x),  # step: 1 where x > 0, else 0
    _unary(np.abs),
    _poly,
    _sawtooth,
    _rational,
)


def apply_edge_function_(fid: int, x: np.ndarray) -> None:
    """Overwrite ``x`` with ``f_fid(x)`` elementwise (in place, no large temporaries kept)."""
    _IMPLS[fid](x)


def apply_edge_function(fid: int, x: np.ndarray) -> np.ndarray:
    """Return ``f_fid(x)`` as a new array of ``x``'s dtype (see the module table)."""
    out = np.array(x, copy=True)
    _IMPLS[fid](out)
    return out


def sample_noise(
    rng: np.random.Generator, kind: str, shape: tuple[int, ...], cauchy_clip: float, dtype: np.dtype
) -> np.ndarray:
    """Draw standardised noise of ``kind``: zero mean (median for cauchy), unit variance.

    ``cauchy`` is the standard Cauchy clipped to ``+-cauchy_clip``. Draws come
    only from ``rng`` so the result is a pure function of its state.
    """
    dtype = np.dtype(dtype)
    if kind == "normal":
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)
    if kind == "laplace":
        # The difference of two Exp(1) variates is Laplace(0, 1), variance 2.
        e = rng.standard_exponential(shape, dtype=np.float32)
        e -= rng.standard_exponential(shape, dtype=np.float32)
        e *= np.float32(1 / math.sqrt(2.0))
        return e.astype(dtype, copy=False)
    if kind == "gumbel":
        # -log(Exp(1)) is the standard Gumbel: mean Euler's gamma, variance pi^2/6.
        e = rng.standard_exponential(shape, dtype=np.float32)
        np.log(e, out=e)
        e += np.float32(np.euler_gamma)
        e *= np.float32(-math.sqrt(6.0) / math.pi)
        return e.astype(dtype, copy=False)
    if kind == "cauchy":
        # Ratio of two standard normals is standard Cauchy.
        z = rng.standard_normal(shape, dtype=np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            z /= rng.standard_normal(shape, dtype=np.float32)
        np.nan_to_num(z, copy=False, nan=0.0)
        np.clip(z, -cauchy_clip, cauchy_clip, out=z)
        return z.astype(dtype, copy=False)
    if kind == "uniform":
        u = rng.random(shape, dtype=np.float32)
        u -= np.float32(0.5)
        u *= np.float32(2.0 * math.sqrt(3.0))
        return u.astype(dtype, copy=False)
    raise ValueError(f"unknown noise kind {kind!r}; expected one of {NOISE_KINDS}")
