"""Deprecated: the mel leak voting moved to :mod:`cachebuild.mel.voting` (next to the mel recipe).

``from loaders.mel_eval import file_votes`` keeps working for now and warns
with a :class:`DeprecationWarning`; import from ``cachebuild.mel.voting``.
"""

from __future__ import annotations

import warnings

from cachebuild.mel.voting import *  # noqa: F401,F403
from cachebuild.mel.voting import __all__  # noqa: F401

warnings.warn("loaders.mel_eval moved to cachebuild.mel.voting; import from there (this alias goes away in a later release)", DeprecationWarning, stacklevel=2)
