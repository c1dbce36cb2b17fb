"""WAV decoding with NumPy: header parsing, PCM/float decoding, channel mixing, resampling.

Why our own RIFF parser rather than the stdlib ``wave`` module: ``wave`` (Python
3.11) refuses IEEE float files (format 3) and WAVE_FORMAT_EXTENSIBLE, and reads
truncated files silently. One small parser handles every format the same way,
reads only the header when sources scan a folder, and reports truncation.

Supported: ``RIFF``/``WAVE`` files whose ``fmt `` chunk is PCM (format 1; 8-bit
unsigned, 16/24/32-bit signed little-endian), IEEE float (format 3; 32/64-bit)
or WAVE_FORMAT_EXTENSIBLE (0xFFFE) with a PCM or float sub-format; any number
of channels (averaged to mono). Integer samples are scaled by ``2**-(bits-1)``
(8-bit: ``(x - 128) / 128``), so they lie in [-1, 1); float samples are kept as
stored (not clipped). Not supported (SourceError): RIFX (big-endian), RF64,
compressed formats (A-law, ADPCM, ...). Every error names the file.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cachebuild.errors import SourceError
from cachebuild.mel.config import MelConfig
from cachebuild.mel.other_audio import SoundFileInfo, read_soundfile, read_soundfile_info
from cachebuild.mel.segment import fit_length

__all__ = [
    "WavInfo",
    "read_wav_info",
    "read_wav",
    "decode_samples",
    "resample",
    "resampled_length",
    "check_wav",
    "check_audio",
    "load_clip",
]

WAVE_FORMAT_PCM = 1
WAVE_FORMAT_IEEE_FLOAT = 3
WAVE_FORMAT_EXTENSIBLE = 0xFFFE
_GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"


@dataclass(frozen=True)
class WavInfo:
    """What the header of a WAV file says (``format_tag`` resolved through EXTENSIBLE)."""

    path: str
    format_tag: int  # 1 = integer PCM, 3 = IEEE float
    channels: int
    sample_rate: int
    container_bytes: int  # bytes per sample of one channel
    data_offset: int  # byte offset of the first sample
    n_frames: int  # samples per channel

    @property
    def block_align(self) -> int:
        """Bytes per frame (one sample of every channel)."""
        return self.channels * self.container_bytes


def read_wav_info(path: str | os.PathLike[str]) -> WavInfo:
    """Parse the RIFF header of ``path`` (reads only headers, not samples).

    Raises SourceError naming the file if it is not a supported, complete WAV.
    """
    path = str(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(12)
            if len(head) < 12 or head[:4] not in (b"RIFF", b"RIFX", b"RF64") or head[8:12] != b"WAVE":
                raise SourceError(f"{path}: not a WAV file (no RIFF/WAVE header)")
            if head[:4] != b"RIFF":
                raise SourceError(f"{path}: {head[:4].decode()} WAV files are not supported")
            fmt, data_offset, data_size = _scan_chunks(f, path, size)
    except OSError as exc:
        raise SourceError(f"{path}: cannot read WAV file: {exc}") from exc
    info = _parse_fmt(fmt, path, data_offset, data_size)
    if data_offset + data_size > size:
        raise SourceError(f"{path}: truncated WAV: header declares {data_size} bytes of audio, file holds {size - data_offset}")
    if data_size % info.block_align:
        raise SourceError(f"{path}: truncated WAV: {data_size} bytes of audio is not a whole number of {info.block_align}-byte frames")
    return info


def _scan_chunks(f, path: str, size: int) -> tuple[bytes, int, int]:
    """Walk the chunks after the RIFF header; return (fmt payload, data offset, data size)."""
    fmt: bytes | None = None
    data: tuple[int, int] | None = None
    pos = 12
    while pos + 8 <= size and (fmt is None or data is None):
        f.seek(pos)
        chunk_id, chunk_size = struct.unpack("<4sI", f.read(8))
        if chunk_id == b"fmt ":
            fmt = f.read(min(chunk_size, 64))
        elif chunk_id == b"data":
            data = (pos + 8, chunk_size)
        pos += 8 + chunk_size + (chunk_size & 1)  # chunks are word-aligned
    if fmt is None:
        raise SourceError(f"{path}: not a valid WAV file (no 'fmt ' chunk)")
    if data is None:
        raise SourceError(f"{path}: truncated WAV (no 'data' chunk)")
    return fmt, data[0], data[1]


def _parse_fmt(fmt: bytes, path: str, data_offset: int, data_size: int) -> WavInfo:
    if len(fmt) < 16:
        raise SourceError(f"{path}: malformed 'fmt ' chunk ({len(fmt)} bytes)")
    tag, channels, rate, _, block_align, bits = struct.unpack("<HHIIHH", fmt[:16])
    if tag == WAVE_FORMAT_EXTENSIBLE:
        if len(fmt) < 40 or fmt[26:40] != _GUID_TAIL:
            raise SourceError(f"{path}: unsupported WAVE_FORMAT_EXTENSIBLE sub-format")
        tag = struct.unpack("<H", fmt[24:26])[0]
    if channels < 1 or rate < 1 or block_align < 1 or block_align % channels:
        raise SourceError(f"{path}: malformed WAV header (channels={channels}, rate={rate}, block_align={block_align})")
    container = block_align // channels
    if tag == WAVE_FORMAT_PCM:
        ok = container in (1, 2, 3, 4) and 0 < bits <= 8 * container
    elif tag == WAVE_FORMAT_IEEE_FLOAT:
        ok = container in (4, 8) and bits == 8 * container
    else:
        raise SourceError(f"{path}: unsupported WAV format tag {tag} (only PCM and IEEE float)")
    if not ok:
        raise SourceError(f"{path}: unsupported sample layout: format {tag}, {bits} bits in {container}-byte containers")
    return WavInfo(path, tag, channels, rate, container, data_offset, data_size // block_align)


def decode_samples(raw: np.ndarray, info: WavInfo) -> np.ndarray:
    """Raw data bytes (uint8) -> float32 ``[n_frames, channels]``."""
    c = info.container_bytes
    if info.format_tag == WAVE_FORMAT_IEEE_FLOAT:
        values = raw.view("<f4" if c == 4 else "<f8").astype(np.float32, copy=False)
    elif c == 1:  # 8-bit WAV is unsigned, centred on 128
        values = (raw.astype(np.float32) - np.float32(128.0)) * np.float32(1 / 128)
    elif c == 3:  # place the 3 bytes in the top of an int32: value * 256, sign kept
        wide = np.zeros((raw.size // 3, 4), dtype=np.uint8)
        wide[:, 1:] = raw.reshape(-1, 3)
        values = wide.view("<i4")[:, 0].astype(np.float32) * np.float32(2.0**-31)
    else:
        ints = raw.view("<i2" if c == 2 else "<i4")
        values = ints.astype(np.float32) * np.float32(2.0 ** (1 - 8 * c))
    return values.reshape(-1, info.channels)


def read_wav(path: str | os.PathLike[str], info: WavInfo | None = None) -> tuple[np.ndarray, int]:
    """Decode a WAV file to mono float32 ``[n]`` (channels averaged) and its sample rate."""
    info = info or read_wav_info(path)
    count = info.n_frames * info.block_align
    try:
        raw = np.fromfile(info.path, dtype=np.uint8, count=count, offset=info.data_offset)
    except OSError as exc:
        raise SourceError(f"{info.path}: cannot read WAV samples: {exc}") from exc
    if raw.size < count:
        raise SourceError(f"{info.path}: truncated WAV: expected {count} bytes, read {raw.size}")
    frames = decode_samples(raw, info)
    mono = frames[:, 0] if info.channels == 1 else frames.mean(axis=1, dtype=np.float32)
    return np.ascontiguousarray(mono), info.sample_rate


def resampled_length(n: int, sr_in: int, sr_out: int) -> int:
    """Samples after resampling ``n`` samples from ``sr_in`` to ``sr_out`` (rounded)."""
    return (n * sr_out + sr_in // 2) // sr_in


def resample(x: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Band-limited, zero-phase (linear-phase) FFT resampling along the last axis.

    The spectrum is truncated (down) or zero-extended (up) to the new length,
    the shared Nyquist bin split as in ``scipy.signal.resample``, to which this is
    equal (computed in float64, returned as float32). An ideal low-pass at the
    lower Nyquist frequency, no aliasing; like every FFT method it treats the
    clip as periodic, so the first and last few ms may ring if the clip's ends differ.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    if sr_in == sr_out or n == 0:
        return x.astype(np.float32)
    num = resampled_length(n, sr_in, sr_out)
    spec = np.fft.rfft(x, axis=-1)
    out = np.zeros(x.shape[:-1] + (num // 2 + 1,), dtype=spec.dtype)
    m = min(n, num)
    keep = m // 2 + 1
    out[..., :keep] = spec[..., :keep]
    if m % 2 == 0:  # the smaller length has a Nyquist bin
        if num < n:
            out[..., m // 2] *= 2.0
        elif num > n:
            out[..., m // 2] *= 0.5
    y = np.fft.irfft(out, num, axis=-1)
    y *= num / n
    return y.astype(np.float32)


def _check_fits(path: str, rate: int, n_frames: int, cfg: MelConfig) -> None:
    """Sample rate and length against ``cfg`` (resampling / padding allowed or not)."""
    if rate != cfg.sample_rate and cfg.resample != "resample":
        raise SourceError(f'{path}: sample rate {rate} Hz, config expects {cfg.sample_rate} Hz (set resample = "resample" to convert)')
    n = resampled_length(n_frames, rate, cfg.sample_rate)
    if n == 0:  # even with short_clip = "pad": a record of padding alone would be silence under the folder's label
        raise SourceError(f"{path}: no audio samples ({n_frames} frames at {rate} Hz)")
    if n < cfg.clip_samples and cfg.short_clip != "pad":
        raise SourceError(f'{path}: clip too short: {n} samples at {cfg.sample_rate} Hz, needs {cfg.clip_samples} (set short_clip = "pad" to zero-pad)')


def check_wav(path: str | os.PathLike[str], cfg: MelConfig) -> WavInfo:
    """Header-only validation against ``cfg``: format, completeness, rate, length.

    Raises SourceError naming the file; returns the header info otherwise.
    """
    info = read_wav_info(path)
    _check_fits(info.path, info.sample_rate, info.n_frames, cfg)
    return info


def check_audio(path: str | os.PathLike[str], cfg: MelConfig) -> WavInfo | SoundFileInfo:
    """:func:`check_wav` for ``.wav``; other formats through soundfile (SourceError if it is not installed)."""
    if str(path).lower().endswith(".wav"):
        return check_wav(path, cfg)
    info = read_soundfile_info(path)
    _check_fits(info.path, info.sample_rate, info.n_frames, cfg)
    return info


def load_clip(path: str | Path, cfg: MelConfig, info: WavInfo | SoundFileInfo | None = None) -> np.ndarray:
    """Decode, mix to mono, resample if allowed, and fit to ``cfg.clip_samples`` (float32)."""
    info = info or check_audio(path, cfg)
    wave, rate = read_soundfile(info) if isinstance(info, SoundFileInfo) else read_wav(path, info)
    if rate != cfg.sample_rate:
        if cfg.resample != "resample":
            raise SourceError(f"{info.path}: sample rate {rate} Hz, config expects {cfg.sample_rate} Hz")
        wave = resample(wave, rate, cfg.sample_rate)
    try:
        return fit_length(wave, cfg)
    except ValueError as exc:
        raise SourceError(f"{info.path}: {exc}") from exc
