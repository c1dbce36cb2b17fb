"""TOML recipes: read once, with CLI overrides applied, errors naming file and key."""

from __future__ import annotations

import contextlib
import copy
import json
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from cachebuild.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["load_toml", "apply_overrides", "set_key", "naming_recipe", "KEY_ALIASES", "canonical_keys"]

KEY_ALIASES: dict[str, str] = {
    "hop_length": "hop",  # torchaudio's MelSpectrogram names, as the users' mel builder calls it
    "f_min": "fmin",
    "f_max": "fmax",
    "interventions.intervention_scale_range": "interventions.value_scale",  # the users' CausalDataset
}
"""The users' names of recipe keys (recipe file or ``--set``) -> ours; recipes and manifests
store ours. Each alias lives in the same table as its key."""


def load_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML config file; a missing or malformed file is a ConfigError naming it."""
    p = Path(path)
    try:
        text = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {p} is a folder, not a TOML file") from None
    except OSError as exc:
        raise ConfigError(f"config file {p} cannot be read: {exc.strerror}") from None
    try:
        return tomllib.loads(text.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None


def set_key(doc: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``doc['a']['b'] = value`` for ``dotted='a.b'``, creating tables as needed."""
    parts = dotted.split(".")
    node = doc
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"config key '{dotted}': '{part}' is a value, not a table")
        node = nxt
    node[parts[-1]] = value


def _parse_value(text: str) -> Any:
    """A CLI override value: TOML/JSON literal when it parses (numbers, booleans, lists), else a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        try:
            return json.loads(text)
        except ValueError:
            return text


def canonical_keys(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``doc`` with the keys of :data:`KEY_ALIASES` renamed to ours; a table that gives
    both spellings of one setting is a ConfigError naming both."""
    out = copy.deepcopy(dict(doc))
    for alias, key in KEY_ALIASES.items():
        *path, name = alias.split(".")
        node: Any = out
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or name not in node:
            continue
        ours = key.rsplit(".", 1)[-1]
        if ours in node:
            raise ConfigError(f"config keys '{alias}' and '{key}' are one setting ('{alias}' is the users' name for '{key}'): give one of them")
        node[ours] = node.pop(name)
    return out


def apply_overrides(doc: Mapping[str, Any], overrides: Iterable[str] = (), values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A copy of ``doc`` with ``KEY=VALUE`` strings and typed ``values`` (None = not given) applied;
    keys the users name otherwise (:data:`KEY_ALIASES`) are ours in the result."""
    out = canonical_keys(doc)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form KEY=VALUE (e.g. graph.edge_prob=0.4)")
        key, _, text = item.partition("=")
        set_key(out, KEY_ALIASES.get(key.strip(), key.strip()), _parse_value(text.strip()))
    for key, value in (values or {}).items():
        if value is not None:
            set_key(out, key, value)
    return out


@contextlib.contextmanager
def naming_recipe(path: str | Path | None, overrides: Iterable[str] = ()) -> Iterator[None]:
    """Prefix a ConfigError raised while a recipe file is read and checked with the file's name.

    The messages name the key and the value; with several recipes and ``--set``
    flags in play the user also needs to know which file (and which overrides)
    it came from: ``error: mine.toml with --set records=-5: config key 'records' ...``.
    """
    try:
        yield
    except ConfigError as exc:
        msg = str(exc)
        if path is None or msg.startswith(f"{path}") or f"config file {path}" in msg:
            raise
        sets = ", ".join(f"--set {o}" for o in overrides)
        raise ConfigError(f"{path}{' with ' + sets if sets else ''}: {msg}") from exc
