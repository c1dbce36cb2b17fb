"""Every registered source, small, for the source contract tests (also imported by their subprocesses).

``make(name, user_dir)`` returns a source: our own (causal, mel, toy), the two
FunctionSource shapes, and a user's module written outside the package
(``USER_MODULE``, loaded through the recipe registry as ``module:attribute``).
``Slow`` wraps any source with a delay per block that leaves its bytes and
fingerprint unchanged, so a test can SIGKILL a build in the middle.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from cachebuild import FunctionSource, RecordSource

SOURCES = ("causal", "mel", "toy", "fn_record", "fn_block", "user", "ssm", "sequences")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXAMPLE_KINDS = {"ssm": ("ssm_teacher:make", {"length": 16, "measurements": 2}), "sequences": ("sequences:make", {"max_length": 40})}
RECORDS = 48
PER_SHARD = 6

USER_MODULE = '''
"""A user's own generator, outside the cachebuild package (an SSM-like teacher)."""
import numpy as np
from cachebuild import FunctionSource


def impulse(rng, index, length=12, state=3):
    a = rng.uniform(0.2, 0.9, size=state)
    u = rng.standard_normal(length).astype(np.float32)
    h = (a[None, :] ** np.arange(length)[:, None]).sum(axis=1).astype(np.float32)
    return {"u": u, "h": h, "steps": np.array(length + index % 3, dtype=np.int64)}


def make(length=12, state=3):
    return FunctionSource.per_record(impulse, {"u": "float32", "h": "float32", "steps": "int64"},
                                     params={"length": length, "state": state})
'''


def _record(rng: np.random.Generator, index: int, width: int = 4) -> dict[str, Any]:
    n = int(rng.integers(1, 6))
    return {"seq": rng.standard_normal((n, width)).astype(np.float32), "label": np.array(index % 7, dtype=np.int16), "meta": {"n": n}}


def _block(rng: np.random.Generator, start: int, stop: int, width: int = 4) -> dict[str, Any]:
    count = stop - start
    return {"x": rng.standard_normal((count, width)), "idx": np.arange(start, stop, dtype=np.int64)}


def make(name: str, user_dir: Path | None = None) -> RecordSource:
    """The contract test's instance of source ``name``."""
    if name == "causal":
        from cachebuild.builder.causal_source import CausalSource
        from cachebuild.causal import parse_causal_config

        return CausalSource(parse_causal_config({"graph": {"n_min": 3, "n_max": 5}, "samples": {"base": 8, "per_intervention": 8}}))
    if name == "mel":
        from cachebuild.api import read_recipe
        from cachebuild.recipes import parse_recipe

        kind, doc = read_recipe({"kind": "mel", "num_long": 4, "source": {"synthetic": RECORDS}})
        return kind.make(parse_recipe(doc, kind.count_key, kind.default_codec))[0]
    if name == "toy":
        from cachebuild.testing import ToySource

        return ToySource()
    if name == "fn_record":
        return FunctionSource.per_record(_record, {"seq": "float32", "label": "int16", "meta": "json"}, block_records=4)
    if name == "fn_block":
        return FunctionSource.per_block(_block, {"x": "float64", "idx": "int64"}, params={"width": 3}, block_records=5)
    if name == "user":
        from cachebuild.sources import resolve_kind
        from cachebuild.recipes import parse_recipe

        assert user_dir is not None and (user_dir / "ssm_user.py").exists()
        return resolve_kind("ssm_user:make").make(parse_recipe({"kind": "ssm_user:make", "params": {"length": 10}}, "records"))[0]
    if name in EXAMPLE_KINDS:  # the worked examples' sources, through the recipe registry
        import sys

        from cachebuild.recipes import parse_recipe
        from cachebuild.sources import resolve_kind

        folder = str(EXAMPLES / name)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        kind, params = EXAMPLE_KINDS[name]
        return resolve_kind(kind).make(parse_recipe({"kind": kind, "params": params}, "records"))[0]
    raise KeyError(name)


def shard_mb(source: RecordSource) -> float:
    """A shard size giving PER_SHARD records per shard (many shards from few records)."""
    return PER_SHARD * source.estimated_record_bytes() / float(1 << 20)


@dataclass(frozen=True)
class Wrapped:
    """``inner`` as it is: same kind, config, fingerprint and bytes (subclasses change how blocks come)."""

    inner: Any

    @property
    def kind(self) -> str:
        return str(self.inner.kind)

    @property
    def block_records(self) -> int:
        return int(self.inner.block_records)

    def fields(self) -> list[tuple[str, str]]:
        return list(self.inner.fields())

    def config_dict(self) -> dict[str, Any]:
        return dict(self.inner.config_dict())

    def estimated_record_bytes(self) -> int:
        return int(self.inner.estimated_record_bytes())

    def determinism(self) -> dict[str, Any]:
        """The inner source's (optional) account of what its bytes depend on: same fingerprint."""
        own = getattr(self.inner, "determinism", None)
        return dict(own()) if callable(own) else {"block_records": self.block_records}

    def blocks(self, seed: int, shard: int, start: int, stop: int) -> Iterator[list[dict[str, Any]]]:
        yield from self.inner.blocks(seed, shard, start, stop)


@dataclass(frozen=True)
class Slow(Wrapped):
    """``inner`` with a pause before each block: same kind, config and bytes, slower."""

    pause: float = 0.2

    def blocks(self, seed: int, shard: int, start: int, stop: int) -> Iterator[list[dict[str, Any]]]:
        for block in self.inner.blocks(seed, shard, start, stop):
            time.sleep(self.pause)
            yield block


@dataclass(frozen=True)
class FailFrom(Wrapped):
    """``inner`` that raises from shard ``shard`` on: a bad input found late."""

    shard: int = 0

    def blocks(self, seed: int, shard: int, start: int, stop: int) -> Iterator[list[dict[str, Any]]]:
        if shard >= self.shard:
            raise ValueError(f"bad input file at shard {shard}")
        yield from self.inner.blocks(seed, shard, start, stop)


def main(name: str, out: str, user_dir: str) -> None:
    """Subprocess entry: build ``name`` slowly with one worker (the test kills it)."""
    from cachebuild import build

    source = make(name, Path(user_dir))
    build(Slow(source), out, records=RECORDS, seed=3, workers=1, shard_mb=shard_mb(source), progress=False)


if __name__ == "__main__":
    import sys

    main(*sys.argv[1:4])
