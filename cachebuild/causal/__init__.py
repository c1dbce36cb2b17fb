"""Causal-graph records: random DAGs, structural equations, twin-world interventions.

Public surface (see DESIGN.md, "Records"):

* :class:`CausalConfig` / :func:`parse_causal_config`: the validated, frozen config
  (defaults: the users' 2026-01-15 generator, ``configs/causal-users-2026-01-15.toml``).
* :func:`generate_graphs`: ``count`` records from a numpy ``Generator``, vectorised over blocks.
* :data:`CAUSAL_FIELDS`: array field name -> numpy dtype; :data:`CAUSAL_SHAPES`: symbolic shapes.
* :data:`EDGE_FUNCTIONS`: edge-function names in id order (the ``edge_fn`` field);
  :data:`EDGE_FUNCTION_IDS`: name -> permanent id; :data:`EDGE_FUNCTION_REGISTRY`: formulas.
* :data:`NOISE_KINDS`, :data:`NOISE_CONVENTIONS`: noise distributions and what ``scale`` means.
"""

from .config import CausalConfig, parse_causal_config
from .functions import EDGE_FUNCTION_IDS, EDGE_FUNCTION_REGISTRY, EDGE_FUNCTIONS
from .noise import NOISE_CONVENTIONS, NOISE_KINDS
from .sampler import CAUSAL_FIELDS, CAUSAL_SHAPES, generate_graphs

__all__ = [
    "CAUSAL_FIELDS",
    "CAUSAL_SHAPES",
    "EDGE_FUNCTIONS",
    "EDGE_FUNCTION_IDS",
    "EDGE_FUNCTION_REGISTRY",
    "NOISE_CONVENTIONS",
    "NOISE_KINDS",
    "CausalConfig",
    "generate_graphs",
    "parse_causal_config",
]
