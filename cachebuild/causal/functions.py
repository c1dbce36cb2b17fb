"""The edge-function registry: stable ids, names, formulas, in-place implementations.

The ``edge_fn`` field of a causal record stores an id from this registry. Ids
are assigned explicitly and never reused or renumbered: a new function gets the
next free id, so inserting one never changes what a stored id means (a test pins
every id). Recipes name functions (``mechanism.functions``); ids are only the
storage form. ``x`` below is the parent value after the optional
``mechanism.clip_parent`` clip.

====  ===================  ============================================  ==============================
 id   name                 f(x)                                          used by
====  ===================  ============================================  ==============================
 0    linear               ``x``                                         rich, linear; users-01-06 (the
                                                                         fallback of log, exp and sqrt)
 1    neg_linear           ``-x``                                        rich
 2    sin                  ``sin(x)``                                    all
 3    cos                  ``cos(x)``                                    all
 4    tanh                 ``tanh(x)``                                   all (the users' "tan")
 5    log                  ``sign(x) * log1p(|x|)``                      rich
 6    exp                  ``exp(clip(x, -5, 5))``                       rich, users-01-15
 7    sqrt                 ``sign(x) * sqrt(|x|)``                       rich
 8    quadratic            ``x**2``                                      rich
 9    cubic                ``x**3``                                      rich
10    sigmoid              ``1 / (1 + exp(-x))``                         all
11    step                 ``1 if x > 0 else 0``                         all
12    abs                  ``|x|``                                       all
13    poly                 ``0.5 x**2 + 0.5 x``                          rich, users-01-06
14    sawtooth             ``x - floor(x)``                              rich
15    rational             ``2x / (1 + |x|)``                            all
16    linear_2x            ``2x``                                        users (their "linear")
17    neg_linear_2x        ``-2x``                                       users ("negative linear")
18    quadratic_clip5      ``clip(x, -5, 5)**2``                         users
19    cubic_clip3          ``clip(x, -3, 3)**3``                         users-01-06
20    cubic_clip5          ``clip(x, -5, 5)**3``                         users-01-15
21    poly_clip5           ``poly(clip(x, -5, 5))``                      users-01-15
22    sawtooth_centered    ``2 (x - floor(x)) - 1``                      users
23    log_abs_clip5        ``log(|clip(x, -5, 5)| + 1e-6)``              users-01-15
24    sqrt_abs             ``sqrt(|x|)``                                 users-01-15
25    poly_clip10          ``poly(clip(x, -10, 10))``                    users-01-06-clipped, -01-14
====  ===================  ============================================  ==============================

Every function is finite for every finite float32 input (``exp`` and
``sigmoid`` saturate instead of overflowing to a non-finite value), so a record
can only become non-finite through unclipped growth, which the sampler refuses.
Implementations work in place on whole blocks (one numpy call per function id
and node, never one per graph or sample).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

__all__ = [
    "EdgeFunction",
    "EDGE_FUNCTION_REGISTRY",
    "EDGE_FUNCTIONS",
    "EDGE_FUNCTION_IDS",
    "EXP_CLIP",
    "apply_edge_function",
    "apply_edge_function_",
]

EXP_CLIP = 5.0
"""The ``exp`` edge function evaluates ``exp(clip(x, -EXP_CLIP, EXP_CLIP))``."""

_F = np.float32


class EdgeFunction(NamedTuple):
    """One registry entry: its permanent id, its name in recipes, its formula, its in-place code."""

    id: int
    name: str
    formula: str
    impl: Callable[[np.ndarray], None]


def _unary(ufunc: np.ufunc) -> Callable[[np.ndarray], None]:
    return lambda x: ufunc(x, out=x)


def _clipped(bound: float, then: Callable[[np.ndarray], None]) -> Callable[[np.ndarray], None]:
    def impl(x: np.ndarray) -> None:
        np.clip(x, -bound, bound, out=x)
        then(x)

    return impl


def _scaled(factor: float) -> Callable[[np.ndarray], None]:
    def impl(x: np.ndarray) -> None:
        x *= _F(factor)

    return impl


def _sign_log(x: np.ndarray) -> None:
    t = np.abs(x)
    np.log1p(t, out=t)
    np.copysign(t, x, out=x)


def _sign_sqrt(x: np.ndarray) -> None:
    t = np.abs(x)
    np.sqrt(t, out=t)
    np.copysign(t, x, out=x)


def _cubic(x: np.ndarray) -> None:
    x *= x * x


def _sigmoid(x: np.ndarray) -> None:
    np.negative(x, out=x)
    with np.errstate(over="ignore"):
        np.exp(x, out=x)  # exp(89+) = inf in float32, and 1 / (1 + inf) = 0: saturates, stays finite
    x += 1
    np.reciprocal(x, out=x)


def _poly(x: np.ndarray) -> None:
    t = x * _F(0.5)
    t += _F(0.5)
    x *= t


def _sawtooth(x: np.ndarray) -> None:
    x -= np.floor(x)


def _sawtooth_centered(x: np.ndarray) -> None:
    x -= np.floor(x)
    x *= _F(2.0)
    x -= _F(1.0)


def _rational(x: np.ndarray) -> None:
    t = np.abs(x)
    t += 1
    x *= 2
    x /= t


def _log_abs(x: np.ndarray) -> None:
    np.abs(x, out=x)
    x += _F(1e-6)
    np.log(x, out=x)


def _sqrt_abs(x: np.ndarray) -> None:
    np.abs(x, out=x)
    np.sqrt(x, out=x)


def _step(x: np.ndarray) -> None:
    np.heaviside(x, 0.0, out=x)  # 1 where x > 0, else 0


def _exp(x: np.ndarray) -> None:
    np.clip(x, -EXP_CLIP, EXP_CLIP, out=x)
    np.exp(x, out=x)


EDGE_FUNCTION_REGISTRY: tuple[EdgeFunction, ...] = (
    EdgeFunction(0, "linear", "x", lambda x: None),
    EdgeFunction(1, "neg_linear", "-x", _unary(np.negative)),
    EdgeFunction(2, "sin", "sin(x)", _unary(np.sin)),
    EdgeFunction(3, "cos", "cos(x)", _unary(np.cos)),
    EdgeFunction(4, "tanh", "tanh(x)", _unary(np.tanh)),
    EdgeFunction(5, "log", "sign(x) * log1p(|x|)", _sign_log),
    EdgeFunction(6, "exp", "exp(clip(x, -5, 5))", _exp),
    EdgeFunction(7, "sqrt", "sign(x) * sqrt(|x|)", _sign_sqrt),
    EdgeFunction(8, "quadratic", "x**2", _unary(np.square)),
    EdgeFunction(9, "cubic", "x**3", _cubic),
    EdgeFunction(10, "sigmoid", "1 / (1 + exp(-x))", _sigmoid),
    EdgeFunction(11, "step", "1 if x > 0 else 0", _step),
    EdgeFunction(12, "abs", "|x|", _unary(np.abs)),
    EdgeFunction(13, "poly", "0.5 x**2 + 0.5 x", _poly),
    EdgeFunction(14, "sawtooth", "x - floor(x)", _sawtooth),
    EdgeFunction(15, "rational", "2x / (1 + |x|)", _rational),
    EdgeFunction(16, "linear_2x", "2x", _scaled(2.0)),
    EdgeFunction(17, "neg_linear_2x", "-2x", _scaled(-2.0)),
    EdgeFunction(18, "quadratic_clip5", "clip(x, -5, 5)**2", _clipped(5.0, _unary(np.square))),
    EdgeFunction(19, "cubic_clip3", "clip(x, -3, 3)**3", _clipped(3.0, _cubic)),
    EdgeFunction(20, "cubic_clip5", "clip(x, -5, 5)**3", _clipped(5.0, _cubic)),
    EdgeFunction(21, "poly_clip5", "0.5 c**2 + 0.5 c, c = clip(x, -5, 5)", _clipped(5.0, _poly)),
    EdgeFunction(22, "sawtooth_centered", "2 (x - floor(x)) - 1", _sawtooth_centered),
    EdgeFunction(23, "log_abs_clip5", "log(|clip(x, -5, 5)| + 1e-6)", _clipped(5.0, _log_abs)),
    EdgeFunction(24, "sqrt_abs", "sqrt(|x|)", _sqrt_abs),
    EdgeFunction(25, "poly_clip10", "0.5 c**2 + 0.5 c, c = clip(x, -10, 10)", _clipped(10.0, _poly)),
)
"""All edge functions, entry ``i`` having id ``i``. Append only: never reorder, rename or remove."""

EDGE_FUNCTIONS: tuple[str, ...] = tuple(f.name for f in EDGE_FUNCTION_REGISTRY)
"""Edge-function names in id order (``EDGE_FUNCTIONS[id]`` is the name of a stored id)."""

EDGE_FUNCTION_IDS: dict[str, int] = {f.name: f.id for f in EDGE_FUNCTION_REGISTRY}
"""Name -> permanent id."""


def apply_edge_function_(fid: int, x: np.ndarray) -> None:
    """Overwrite ``x`` with ``f_fid(x)`` elementwise (in place, no large temporaries kept)."""
    EDGE_FUNCTION_REGISTRY[fid].impl(x)


def apply_edge_function(fid: int, x: np.ndarray) -> np.ndarray:
    """Return ``f_fid(x)`` as a new array of ``x``'s dtype (see the module table)."""
    out = np.array(x, copy=True)
    EDGE_FUNCTION_REGISTRY[fid].impl(out)
    return out
