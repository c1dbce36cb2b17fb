"""Cut whole clips into long and short windows, as the user's training code does.

A clip of ``clip_samples = num_long * long_window`` samples becomes
``[num_long, num_short, short_window]``: ``num_long`` consecutive,
non-overlapping long windows, each cut into ``num_short = long_window //
short_window`` consecutive, non-overlapping short windows (the config ensures
``short_window`` divides ``long_window``). With these rules the segmentation is
a pure reshape: a view, no copy, for a whole block of files at once.

Length policy (one place, so every source behaves the same):

* longer clips are truncated: samples after ``clip_samples`` are dropped;
* shorter clips are refused (``cfg.short_clip == "refuse"``, the default: a
  record padded with digital silence would teach the model that silence is a
  class) or zero-padded at the end (``"pad"``). Refusal raises ``ValueError``
  here; the sources turn it into their bad-file policy with the file's name.
"""

from __future__ import annotations

import numpy as np

from cachebuild.mel.config import MelConfig

__all__ = ["fit_length", "segment", "segment_clip"]


def fit_length(wave: np.ndarray, cfg: MelConfig) -> np.ndarray:
    """Truncate or (if ``cfg.short_clip == "pad"``) zero-pad the last axis to ``clip_samples``.

    Raises ``ValueError`` for a short clip when ``short_clip == "refuse"``.
    """
    n = wave.shape[-1]
    need = cfg.clip_samples
    if n >= need:
        return wave[..., :need]
    if cfg.short_clip != "pad":
        raise ValueError(f'clip has {n} samples, needs {need} ({cfg.num_long} x {cfg.long_window}); set short_clip = "pad" to zero-pad short clips')
    pad = [(0, 0)] * (wave.ndim - 1) + [(0, need - n)]
    return np.pad(wave, pad)


def segment(waves: np.ndarray, cfg: MelConfig) -> np.ndarray:
    """``[F, samples]`` -> ``[F, num_long, num_short, short_window]`` (a view when possible).

    ``samples`` must be at least ``clip_samples`` (use :func:`fit_length` first);
    extra samples at the end are dropped.
    """
    if waves.ndim != 2:
        raise ValueError(f"expected waveforms [F, samples], got shape {waves.shape}")
    if waves.shape[1] < cfg.clip_samples:
        raise ValueError(f"clips of {waves.shape[1]} samples are shorter than {cfg.clip_samples}")
    used = waves[:, : cfg.clip_samples]
    assert cfg.num_long is not None  # MelConfig derives it in __post_init__
    return used.reshape(waves.shape[0], cfg.num_long, cfg.num_short, cfg.short_window)


def segment_clip(wave: np.ndarray, cfg: MelConfig) -> np.ndarray:
    """One clip ``[samples]`` -> ``[num_long, num_short, short_window]`` after :func:`fit_length`."""
    return segment(fit_length(np.asarray(wave), cfg)[None, :], cfg)[0]
