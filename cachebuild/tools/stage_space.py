"""Whether a ``cachebuild stage`` fits its destination, checked before anything is written there.

Staging writes, in this order: its stamp (listing what is already staged), the
copies (each under a temporary name, then renamed), the stamp again (listing
everything; an atomic rewrite holds the old and the new one at once), then the
manifest. The peak is the copies + the stamp + the larger of the stamp and the
manifest, less the stamp already there (the first rewrite replaces it). Sizes
count whole filesystem blocks. (Until 2026-11-24 one block each stood for the
manifest and the stamp: a cache of a few dozen shards passed the check, then
filled a tmpfs sized to it after every shard was copied.)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from cachebuild.errors import OutputError
from cachebuild.tools.stage_dst import human

__all__ = ["check_space"]

_MOUNT_ADVICE = "sudo mount -t tmpfs -o size={size}G tmpfs /mnt/cache"


def _blocks(size: int, block: int) -> int:
    return -(-size // block) * block


def check_space(dst: Path, copies: list[int], freed: int, manifest_bytes: int, stamp_bytes: int, old_stamp: Path) -> None:
    """Refuse, naming both numbers, when DST's filesystem cannot hold ``copies`` (bytes of each file to
    copy), the manifest and the stamp (its largest size) beside what stays; ``freed``: bytes of files
    staging deletes or replaces; ``old_stamp``: the stamp already in DST, if any."""
    probe = dst
    while not probe.exists():
        probe = probe.parent
    block = os.statvfs(probe).f_frsize or 4096
    try:
        held = _blocks(old_stamp.stat().st_size, block)
    except OSError:
        held = 0
    stamp, manifest = _blocks(stamp_bytes, block), _blocks(manifest_bytes, block)
    need = sum(_blocks(n, block) for n in copies) + max(stamp, stamp + max(stamp, manifest) - held)
    free = shutil.disk_usage(probe).free + freed
    if need > free:
        size = max(1, -(-int(need * 1.1) // (1 << 30)))
        raise OutputError(
            f"not enough space to stage into {dst}: need {need} bytes ({human(need)}), "
            f"{free} bytes ({human(free)}) available on its filesystem. Free space, choose another DST, "
            f"or mount a dedicated tmpfs: `{_MOUNT_ADVICE.format(size=size)}` and stage into /mnt/cache/{dst.name}"
        )
