"""Checked by mypy in tests/test_open_builder.py: every source we ship is a RecordSource."""

from cachebuild import FunctionSource, RecordSource
from cachebuild.builder.causal_source import CausalSource
from cachebuild.builder.mel_source import MelBuildSource
from cachebuild.causal import CausalConfig
from cachebuild.mel.config import MelConfig
from cachebuild.testing import ToySource


def _one(rng: object, index: int) -> dict[str, object]:
    return {}


shipped: list[RecordSource] = [
    CausalSource(CausalConfig()),
    MelBuildSource(MelConfig(), None),
    ToySource(),
    FunctionSource.per_record(_one, {"x": "float32"}),
]
