"""Audio files other than WAV (``.flac``, ``.ogg``, ``.mp3``, ...), read through ``soundfile`` when installed.

WAV files go through our own RIFF reader (:mod:`cachebuild.mel.wav`). Other
formats need a codec: when the optional ``soundfile`` package (libsndfile) is
importable, the formats it can open are read through it and then handled like
a WAV (channels averaged to mono in float32, resampled if allowed, fitted to
the clip length); otherwise, or when libsndfile cannot open the file, the file
is a bad file, so a WAV folder source lists it as skipped with the reason
instead of ignoring it. FLAC is lossless, so its records are the same on any
machine; lossy formats (MP3, Ogg Vorbis/Opus) decode through libsndfile's
decoders, whose version the source's description records.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from cachebuild.errors import SourceError

__all__ = ["AUDIO_SUFFIXES", "SoundFileInfo", "soundfile_version", "read_soundfile_info", "read_soundfile"]

AUDIO_SUFFIXES: frozenset[str] = frozenset({
    ".wav", ".flac", ".mp3", ".ogg", ".oga", ".opus", ".m4a", ".aac", ".wma",
    ".aif", ".aiff", ".aifc", ".au", ".snd", ".caf", ".w64", ".webm", ".amr",
})  # fmt: skip
"""Suffixes a WAV folder source considers audio (any case): read, or listed as skipped."""


@dataclass(frozen=True)
class SoundFileInfo:
    """What libsndfile says of a non-WAV audio file (header only)."""

    path: str
    channels: int
    sample_rate: int
    n_frames: int
    format: str  # libsndfile's format name, e.g. "FLAC"


def _soundfile() -> Any:
    try:
        import soundfile
    except (ImportError, OSError):  # not installed, or libsndfile missing
        return None
    return soundfile


def soundfile_version() -> str | None:
    """libsndfile's version string when ``soundfile`` is importable, else None."""
    sf = _soundfile()
    return None if sf is None else str(sf.__libsndfile_version__)


def _unsupported(path: str, why: str) -> SourceError:
    suffix = os.path.splitext(path)[1].lower()
    return SourceError(f"{path}: unsupported format ({suffix}); convert it to WAV{why}")


def read_soundfile_info(path: str | os.PathLike[str]) -> SoundFileInfo:
    """Header of a non-WAV audio file through soundfile; SourceError naming the file if it cannot be read."""
    path = str(path)
    sf = _soundfile()
    if sf is None:
        raise _unsupported(path, " or install soundfile")
    try:
        info = sf.info(path)
    except Exception as exc:  # libsndfile's error types vary by soundfile version
        raise _unsupported(path, f" (soundfile: {' '.join(str(exc).split())})") from exc
    if info.frames <= 0 or info.channels <= 0 or info.samplerate <= 0:
        raise SourceError(f"{path}: empty or invalid audio ({info.frames} frames, {info.channels} channels, {info.samplerate} Hz)")
    return SoundFileInfo(path, int(info.channels), int(info.samplerate), int(info.frames), str(info.format))


def read_soundfile(info: SoundFileInfo) -> tuple[np.ndarray, int]:
    """Decode to mono float32 ``[n]`` (channels averaged, as for WAV) and the sample rate."""
    sf = _soundfile()
    if sf is None:
        raise _unsupported(info.path, " or install soundfile")
    try:
        frames, rate = sf.read(info.path, dtype="float32", always_2d=True)
    except Exception as exc:
        raise SourceError(f"{info.path}: cannot decode: {' '.join(str(exc).split())}") from exc
    if frames.shape[0] != info.n_frames or rate != info.sample_rate:
        raise SourceError(f"{info.path}: changed since the folder scan ({frames.shape[0]} frames at {rate} Hz, scanned {info.n_frames} at {info.sample_rate} Hz)")
    mono = frames[:, 0] if frames.shape[1] == 1 else frames.mean(axis=1, dtype=np.float32)
    return np.ascontiguousarray(mono, dtype=np.float32), int(rate)
