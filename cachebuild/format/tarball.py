"""Minimal ustar writing: headers built from one template, a block of members at a time.

Members are regular files with mode 0644, uid/gid 0 and mtime 0, so the same
payloads always give the same tar bytes. :func:`tar_headers` builds the headers
of many members in a few numpy operations (only the name, size and checksum
fields change); :func:`tar_header` is the one-member form of the same template.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["BLOCK", "END_OF_ARCHIVE", "MAX_SIZE", "fill_headers", "padding", "pad_lengths", "tar_header", "tar_headers"]

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
MAX_SIZE = 8**11 - 1  # the largest size an 11-digit octal field holds

_TEMPLATE = bytearray(BLOCK)
_TEMPLATE[100:108] = b"0000644\0"
_TEMPLATE[108:116] = b"0000000\0"
_TEMPLATE[116:124] = b"0000000\0"
_TEMPLATE[136:148] = b"00000000000\0"
_TEMPLATE[148:156] = b"        "
_TEMPLATE[156:157] = b"0"
_TEMPLATE[257:263] = b"ustar\0"
_TEMPLATE[263:265] = b"00"
_TEMPLATE_ARRAY = np.frombuffer(bytes(_TEMPLATE), np.uint8)
# Checksum of the template with its name and size fields empty (the size field counts as zeros).
_BASE_SUM = sum(_TEMPLATE) - sum(_TEMPLATE[124:136])
_SIZE_SHIFTS = np.arange(30, -1, -3, dtype=np.int64)  # 11 octal digits, most significant first
_SUM_SHIFTS = np.arange(15, -1, -3, dtype=np.int64)  # 6 octal digits


def _check(name: str, raw: bytes, size: int) -> None:
    if len(raw) > 100:
        raise ValueError(f"tar member name longer than 100 bytes: {name!r}")
    if not 0 <= size <= MAX_SIZE:
        raise ValueError(f"tar member {name!r} too large for ustar: {size} bytes")


def tar_header(name: str, size: int) -> bytes:
    """A 512-byte ustar header for a regular file ``name`` of ``size`` bytes."""
    return tar_headers([name], np.array([size], np.int64)).tobytes()


def tar_headers(names: Sequence[str], sizes: np.ndarray) -> np.ndarray:
    """``[len(names), 512]`` uint8 ustar headers for regular files ``names[i]`` of ``sizes[i]`` bytes.

    Names are ASCII, at most 100 bytes; sizes fit 11 octal digits (< 8 GiB).
    """
    m = len(names)
    sizes = np.asarray(sizes, np.int64)
    try:
        name_field = np.array(names, dtype="S100") if m else np.zeros(0, "S100")
    except UnicodeEncodeError as exc:
        raise ValueError(f"tar member names must be ASCII: {exc}") from None
    if m and max(map(len, names)) > 100:
        i = next(i for i, n in enumerate(names) if len(n) > 100)
        _check(names[i], names[i].encode("ascii"), int(sizes[i]))
    out = np.empty((m, BLOCK), np.uint8)
    name_bytes = name_field.view(np.uint8).reshape(m, 100)
    fill_headers(out, name_bytes, name_bytes.sum(axis=1, dtype=np.int64), sizes)
    return out


def fill_headers(out: np.ndarray, name_bytes: np.ndarray, name_sums: np.ndarray, sizes: np.ndarray) -> None:
    """Write ustar headers into ``out`` (``[m, 512]`` uint8, a strided view of a larger array will do):
    member ``i`` is named by ``name_bytes[i]`` (``[m, 100]`` uint8, ASCII, NUL-padded; ``name_sums[i]``
    its byte sum, for the checksum) and holds ``sizes[i]`` bytes. :func:`tar_headers` from strings."""
    sizes = np.asarray(sizes, np.int64)
    if len(sizes) and (sizes.min() < 0 or sizes.max() > MAX_SIZE):
        i = int(np.argmax((sizes < 0) | (sizes > MAX_SIZE)))
        raw = name_bytes[i].tobytes().rstrip(b"\0")
        _check(raw.decode("ascii", "replace"), raw, int(sizes[i]))
    out[:] = _TEMPLATE_ARRAY
    out[:, :100] = name_bytes
    digits = ((sizes[:, None] >> _SIZE_SHIFTS) & 7).astype(np.uint8) + ord("0")
    out[:, 124:135] = digits
    out[:, 135] = 0
    chksum = _BASE_SUM + np.asarray(name_sums, np.int64) + digits.sum(axis=1, dtype=np.int64)
    out[:, 148:154] = ((chksum[:, None] >> _SUM_SHIFTS) & 7).astype(np.uint8) + ord("0")
    out[:, 154] = 0
    out[:, 155] = ord(" ")


def pad_lengths(sizes: np.ndarray) -> np.ndarray:
    """Zero bytes after each payload of ``sizes`` bytes, up to a whole tar block."""
    return (-np.asarray(sizes, np.int64)) % BLOCK


def padding(size: int) -> bytes:
    """Zero bytes that round a payload of ``size`` up to a whole tar block."""
    return b"\0" * ((-size) % BLOCK)
