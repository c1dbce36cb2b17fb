"""An SSM teacher-student source after the users' sweep: random input sequences and a teacher's outputs.

Each record is one random teacher, a diagonal linear state-space model of rank
``rank`` (``x[t+1] = A x[t] + B u[t]``, ``y[t] = C x[t]``), observed on
``measurements`` random input sequences of ``length`` steps, plus its impulse
response (what the users' sweep fits students to). One vectorised call makes a
whole block of teachers; ``cachebuild build --config ssm.toml`` runs it.

A worked example of a user's own source, not a copy of their distributions: their
``generator.py`` makes one teacher per (rank, student_dim, seed) with ``A`` on its
``rank`` diagonal entries ~ N(0.5, 0.1) (zero-padded to dimension 2 at rank 1), ``B``
and ``C`` fixed (first entry 1, the others ``sqrt((student_dim - 1) / (teacher_dim - 1))``),
inputs ``[measurements, length, 1]`` ~ N(0, 1) with an impulse ``e1`` appended as the
last measurement; here ``A`` ~ U(0.5, 0.98) and ``B * C`` ~ N(0, 1 / rank) per mode, many
teachers per cache, no appended impulse (the impulse response is its own field).
"""

from __future__ import annotations

import numpy as np

from cachebuild import FunctionSource

FIELDS = {"u": "float32", "y": "float32", "impulse": "float32", "a": "float32"}


def teachers(rng: np.random.Generator, start: int, stop: int, rank: int = 4, length: int = 64, measurements: int = 8) -> dict:
    """Teachers [start, stop): u, y ``[n, measurements, length]``, impulse ``[n, length]``, a ``[n, rank]``."""
    n = stop - start
    a = rng.uniform(0.5, 0.98, size=(n, rank))  # the diagonal of A: stable, slowly decaying modes
    bc = rng.standard_normal((n, rank)) / np.sqrt(rank)  # B_i * C_i per mode
    impulse = np.einsum("nr,nrk->nk", bc, a[:, :, None] ** np.arange(length))
    u = rng.standard_normal((n, measurements, length))
    size = 2 * length  # causal convolution y = h * u through the FFT, no wrap-around
    y = np.fft.irfft(np.fft.rfft(u, size) * np.fft.rfft(impulse, size)[:, None, :], size)[..., :length]
    return {"u": u.astype(np.float32), "y": y.astype(np.float32), "impulse": impulse.astype(np.float32), "a": a.astype(np.float32)}


def make(rank: int = 4, length: int = 64, measurements: int = 8) -> FunctionSource:
    """The recipe's factory: ``[params]`` of ssm.toml arrive here."""
    params = {"rank": rank, "length": length, "measurements": measurements}
    return FunctionSource.per_block(teachers, FIELDS, params=params, kind="ssm-teacher", version="1")
