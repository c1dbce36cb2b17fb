"""Click parameter types shared by the commands."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

__all__ = ["LocalFolder", "LOCAL_FOLDER"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class LocalFolder(click.ParamType):
    """A cache folder on this machine: a path, or a ``file://`` URL (as the builders and the loader
    take). Any other URL is refused naming it: ``verify``, ``inspect``, ``stage``, ``bench`` and
    ``prune`` read local files (``click.Path`` would have turned ``http://h/c`` into ``http:/h/c``
    and reported a missing folder)."""

    name = "folder"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        if isinstance(value, Path):
            return value
        text = str(value)
        if text.startswith("file://"):
            return Path(text[len("file://") :])
        if _URL.match(text):
            command = f"`cachebuild {ctx.info_name}`" if ctx is not None and ctx.info_name else "this command"
            self.fail(f"{text} is a URL; {command} reads a local folder: copy the cache here first (ShardStream reads URLs directly)", param, ctx)
        return Path(text)


LOCAL_FOLDER = LocalFolder()
