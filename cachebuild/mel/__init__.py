"""Mel-spectrogram records for the acoustic leak detector.

Config (:mod:`.config`) -> audio (:mod:`.wav`, or the user's HDF5, or synthetic
clips) -> windows (:mod:`.segment`) -> log-mel (:mod:`.spectrogram`, with our own
:mod:`.filterbank`) -> record dicts (:mod:`.records`, :mod:`.sources`; the users' HDF5 in :mod:`.h5`,
its config_json rules in :mod:`.h5_config`), one per audio file, for
the shard writer. Nothing here writes files.
"""

from cachebuild.mel.config import MelConfig, parse_mel_config
from cachebuild.mel.filterbank import mel_filterbank
from cachebuild.mel.segment import segment
from cachebuild.mel.sources import (
    MEL_FIELDS,
    BadFileWarning,
    H5Source,
    MelSource,
    StoredMelWarning,
    SyntheticSource,
    WavFolderSource,
)
from cachebuild.mel.spectrogram import LogMel, log_mel

__all__ = [
    "MelConfig",
    "parse_mel_config",
    "mel_filterbank",
    "segment",
    "LogMel",
    "log_mel",
    "MEL_FIELDS",
    "BadFileWarning",
    "MelSource",
    "StoredMelWarning",
    "H5Source",
    "WavFolderSource",
    "SyntheticSource",
]
