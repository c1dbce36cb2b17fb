"""Causal-graph records: random DAGs, structural equations, twin-world interventions.

Public surface (see DESIGN.md, "Records"):

* :class:`CausalConfig` / :func:`parse_causal_config`: the validated, frozen config.
* :func:`generate_graphs`: ``count`` records from a numpy ``Generator``, vectorised over blocks.
* :data:`CAUSAL_FIELDS`: array field name -> numpy dtype; :data:`CAUSAL_SHAPES`: symbolic shapes.
* :data:`EDGE_FUNCTIONS`: edge-function names in id order (the ``edge_fn`` field).
"""

from .config import CausalConfig, parse_causal_config
from .mechanisms import EDGE_FUNCTIONS, NOISE_KINDS
from .sampler import CAUSAL_FIELDS, CAUSAL_SHAPES, generate_graphs

__all__ = [
    "CausalConfig",
    "parse_causal_config",
    "generate_graphs",
    "CAUSAL_FIELDS",
    "CAUSAL_SHAPES",
    "EDGE_FUNCTIONS",
    "NOISE_KINDS",
]
