"""Minimal ustar writing: headers built from a template, no per-member TarInfo objects.

Members are regular files with mode 0644, uid/gid 0 and mtime 0, so the same
payloads always give the same tar bytes.
"""

from __future__ import annotations

__all__ = ["BLOCK", "tar_header", "padding", "END_OF_ARCHIVE"]

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)

_TEMPLATE = bytearray(BLOCK)
_TEMPLATE[100:108] = b"0000644\0"
_TEMPLATE[108:116] = b"0000000\0"
_TEMPLATE[116:124] = b"0000000\0"
_TEMPLATE[136:148] = b"00000000000\0"
_TEMPLATE[148:156] = b"        "
_TEMPLATE[156:157] = b"0"
_TEMPLATE[257:263] = b"ustar\0"
_TEMPLATE[263:265] = b"00"
_TEMPLATE_SUM = sum(_TEMPLATE)


def tar_header(name: str, size: int) -> bytes:
    """A 512-byte ustar header for a regular file ``name`` of ``size`` bytes."""
    raw = name.encode("ascii")
    if len(raw) > 100:
        raise ValueError(f"tar member name longer than 100 bytes: {name!r}")
    if size >= 8**11:
        raise ValueError(f"tar member {name!r} too large for ustar: {size} bytes")
    h = bytearray(_TEMPLATE)
    h[0 : len(raw)] = raw
    size_field = b"%011o\0" % size
    h[124:136] = size_field
    chksum = _TEMPLATE_SUM + sum(raw) + sum(size_field) - sum(_TEMPLATE[124:136])
    h[148:156] = b"%06o\0 " % chksum
    return bytes(h)


def padding(size: int) -> bytes:
    """Zero bytes that round a payload of ``size`` up to a whole tar block."""
    return b"\0" * ((-size) % BLOCK)
