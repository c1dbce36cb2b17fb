"""The causal generator's configuration: frozen dataclasses and their parser.

Config enters once: :func:`parse_causal_config` takes the TOML table (as
``tomllib`` returns it), validates every key and value, and returns a frozen
:class:`CausalConfig` that is passed down whole. ``CausalConfig.to_dict()``
gives back a JSON-able dict that parses to an equal config, which is what the
manifest stores. Errors are :class:`~cachebuild.errors.ConfigError` naming the
dotted key (``graph.edge_prob``), the value and the allowed range.

The defaults are the users' newest generator (``configs/causal-users-2026-01-15.toml``,
``MultiModelDeltaPredictor``'s ``SCMGenerator`` of 2026-01-15 as its
``CausalDataset`` calls it), with interaction nodes drawn once per graph.

Top-level keys owned by other parts of cachebuild are skipped (see
:data:`IGNORED_TOP_LEVEL_KEYS`); any other unknown key is an error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import ConfigError
from . import _validate as v
from .functions import EDGE_FUNCTIONS
from .noise import NOISE_CONVENTIONS, NOISE_KINDS

__all__ = [
    "CausalConfig",
    "GraphConfig",
    "MechanismConfig",
    "NoiseConfig",
    "InterventionConfig",
    "SampleConfig",
    "FAMILIES",
    "FAMILY_OF_KEY",
    "MECHANISMS",
    "WEIGHT_KINDS",
    "NOISE_CHOICES",
    "VALUE_MODES",
    "STANDARDIZE_MODES",
    "USERS_2026_01_15_FUNCTIONS",
    "IGNORED_TOP_LEVEL_KEYS",
    "STORED_WHEN_SET",
    "parse_causal_config",
]

FAMILIES: tuple[str, ...] = ("topo", "er", "scale_free")
FAMILY_OF_KEY: dict[str, str] = {"graph.edge_prob": "topo", "graph.expected_degree": "er", "graph.m": "scale_free"}
"""The graph family each size key applies to (the others ignore it; ``--set`` refuses it for them)."""
MECHANISMS: tuple[str, ...] = ("linear", "nonlinear")
WEIGHT_KINDS: tuple[str, ...] = ("one", "signed_uniform")
NOISE_CHOICES: tuple[str, ...] = NOISE_KINDS + ("mixed",)
VALUE_MODES: tuple[str, ...] = ("adaptive", "fixed", "sampled")
STANDARDIZE_MODES: tuple[str, ...] = ("none", "base", "pooled")
IGNORED_TOP_LEVEL_KEYS: frozenset[str] = frozenset({"seed", "graphs", "out", "build", "kind", "shard", "codec"})
"""Top-level keys that belong to the builder / writer / CLI and are skipped here."""

USERS_2026_01_15_FUNCTIONS: tuple[str, ...] = (
    "linear_2x", "neg_linear_2x", "sin", "cos", "tanh", "log_abs_clip5", "exp", "sqrt_abs",
    "quadratic_clip5", "cubic_clip5", "sigmoid", "step", "abs", "poly_clip5", "sawtooth_centered", "rational",
)  # fmt: skip
"""The users' 16 edge types of 2026-01-15, in their ``randint(1, 17)`` order, as registry names."""

STORED_WHEN_SET: dict[str, tuple[str, ...]] = {
    "mechanism": ("clip_interaction", "clip_rest"),
    "noise": ("clip",),
    "interventions": ("value_clip",),
}
"""Keys added after caches were built (for the users' 2026-01-06 clipped generator):
``to_dict()`` stores them only when set, so a cache built before keeps its manifest and
build fingerprint (its resume and append still match) and the pinned bytes stay the same."""

_MAX_NODES = 32767  # targets are stored as int16
_MAX_WEIGHT = 100.0
_MAX_CLIP = 1e6
_MAX_SCALE = 1e3


@dataclass(frozen=True)
class GraphConfig:
    """Random DAG family and size. ``n`` is uniform on ``[n_min, n_max]``."""

    family: str = "topo"  # topo | er | scale_free
    n_min: int = 5
    n_max: int = 10
    edge_prob: float = 0.3  # topo: P(edge) for each forward pair of the causal order
    expected_degree: float = 2.0  # er: p = expected_degree / (n - 1)
    m: int = 2  # scale_free: edges attached per new node (Barabasi-Albert)


@dataclass(frozen=True)
class MechanismConfig:
    """Structural equations. Clipping bounds apply to the nonlinear kind only; None = no clip."""

    kind: str = "nonlinear"  # linear | nonlinear
    weights: str = "one"  # one: every edge weight 1 | signed_uniform: +-U(w_lo, w_hi)
    w_lo: float = 0.5
    w_hi: float = 2.0
    functions: tuple[str, ...] = USERS_2026_01_15_FUNCTIONS  # nonlinear: edge functions drawn per edge
    function_weights: tuple[float, ...] = (1.0,) * 16  # relative draw probability of each function
    interaction_prob: float = 0.3  # P(node with >= 2 parents multiplies its first two terms), once per graph
    clip_parent: float | None = None  # parent value clipped to +-clip_parent before f
    clip_term: float | None = 10.0  # each term w * f(x) clipped
    clip_value: float = 20.0  # value of every node with parents clipped
    clip_interaction: float | None = None  # an interaction node's product of its first two terms clipped
    clip_rest: float | None = None  # an interaction node's sum of its other terms clipped (0 if none)


@dataclass(frozen=True)
class NoiseConfig:
    """Exogenous noise: kind, convention (what ``scale`` means) and the scale of each node."""

    kind: str = "mixed"  # normal | laplace | gumbel | cauchy | uniform | mixed
    convention: str = "numpy"  # unit_variance (scale = std) | numpy (numpy's scale parameter)
    scale: float = 1.0  # used when per_node is false
    per_node: bool = False  # draw each node's scale from U(scale_lo, scale_hi)
    scale_lo: float = 0.5
    scale_hi: float = 1.5
    cauchy_clip: float = 20.0  # cauchy clip (unit_variance: of the standard variate; numpy: after scaling)
    kinds: tuple[str, ...] = NOISE_KINDS  # mixed: kinds drawn from (uniformly, per graph)
    clip: float | None = None  # every noise draw clipped to +-clip after scaling (after cauchy_clip)


@dataclass(frozen=True)
class InterventionConfig:
    """Perfect interventions do(X_k = c) on ``max(1, int(n * intervention_prob))`` distinct nodes."""

    intervention_prob: float = 0.5
    mode: str = "adaptive"  # adaptive | fixed | sampled
    coeffs: tuple[float, ...] = (-2.0, 2.0)  # adaptive: c = coeff * sigma(base X_k) * scale
    value_scale: tuple[float, float] = (1.0, 1.0)  # adaptive: scale ~ U(lo, hi) per graph
    sigma_ddof: int = 1  # adaptive: sigma = std with this ddof (1: pandas' .std())
    sigma_min: float = 1e-4  # adaptive: sigma < sigma_min is replaced by 1.0
    values: tuple[float, ...] = (-2.0, -1.0, 1.0, 2.0)  # fixed: one intervention per value per target
    value_lo: float = -2.0  # sampled: c ~ U(value_lo, value_hi), per_target per target
    value_hi: float = 2.0
    per_target: int = 4
    value_clip: float | None = None  # every intervention value c clipped to +-value_clip (any mode)

    def per_target_count(self) -> int:
        """Interventions per target node (``len(coeffs)``, ``len(values)`` or ``per_target``)."""
        if self.mode == "adaptive":
            return len(self.coeffs)
        if self.mode == "fixed":
            return len(self.values)
        return self.per_target

    def num_targets(self, n: int) -> int:
        """Number of distinct intervened nodes in a graph of ``n`` nodes."""
        return min(n, max(1, int(n * self.intervention_prob)))


@dataclass(frozen=True)
class SampleConfig:
    """Rows per world. ``per_intervention`` must equal ``base`` (delta pairs rows).

    ``per_intervention`` left unset (None) follows ``base``, so changing
    ``samples.base`` alone is enough; it stays a key of its own because the
    users' recipes spell both.
    """

    base: int = 64
    per_intervention: int = None  # type: ignore[assignment]  # None -> same as base (set in __post_init__)
    twin: bool = True  # intervened worlds reuse the base rows' exogenous noise
    standardize: str = "pooled"  # none | base (base-world mean/std) | pooled (base + intervened rows)

    def __post_init__(self) -> None:
        if self.per_intervention is None:
            object.__setattr__(self, "per_intervention", self.base)


@dataclass(frozen=True)
class CausalConfig:
    """Everything that determines the causal records, besides the seed."""

    graph: GraphConfig = field(default_factory=GraphConfig)
    mechanism: MechanismConfig = field(default_factory=MechanismConfig)
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    interventions: InterventionConfig = field(default_factory=InterventionConfig)
    samples: SampleConfig = field(default_factory=SampleConfig)

    def to_dict(self) -> dict:
        """JSON-able nested dict (tuples as lists, no clip as None) that :func:`parse_causal_config` accepts."""
        out: dict[str, dict[str, Any]] = {}
        for f in dataclasses.fields(self):
            sub = getattr(self, f.name)
            table = {k.name: list(x) if isinstance(x := getattr(sub, k.name), tuple) else x for k in dataclasses.fields(sub)}
            out[f.name] = {k: x for k, x in table.items() if x is not None or k not in STORED_WHEN_SET.get(f.name, ())}
        return out

    def max_nodes(self) -> int:
        """Largest n of any record (to pad batches to)."""
        return self.graph.n_max

    def num_interventions(self, n: int) -> int:
        """K, the number of intervened worlds of a graph of ``n`` nodes."""
        return self.interventions.num_targets(n) * self.interventions.per_target_count()

    def max_interventions(self) -> int:
        """Largest K of any record."""
        return max(self.num_interventions(n) for n in range(self.graph.n_min, self.graph.n_max + 1))

    def estimated_record_bytes(self) -> int:
        """Mean raw (uncompressed) bytes of one record, over the uniform n range; JSON estimated."""
        s = self.samples.base
        total = 0.0
        sizes = range(self.graph.n_min, self.graph.n_max + 1)
        for n in sizes:
            k = self.num_interventions(n)
            arrays = n * n * (1 + 4 + 1) + n * (1 + 4) + 4 * s * n + 2 * 4 * k * s * n + k * (2 + 4)
            json_bytes = 180 + 4 * n + (48 * n if self.samples.standardize != "none" else 0)
            total += arrays + json_bytes
        return int(round(total / len(sizes)))


# ---------------------------------------------------------------- parsing


def _size_order_error(n_min: int, n_max: int, given: set[str]) -> ConfigError:
    """n_max < n_min: blame the key the recipe or flags set, naming both values."""
    if "n_min" in given and "n_max" not in given:
        return ConfigError.bad_value("graph.n_min", n_min, f"must be <= graph.n_max ({n_max}, the default): lower it or set graph.n_max too")
    if "n_max" in given and "n_min" not in given:
        return ConfigError.bad_value("graph.n_max", n_max, f"must be >= graph.n_min ({n_min}, the default): raise it or set graph.n_min too")
    return ConfigError(f"config keys 'graph.n_min' ({n_min}) and 'graph.n_max' ({n_max}): n_min must be <= n_max")


def _parse_graph(data: Mapping[str, Any]) -> GraphConfig:
    r = v.table(data, "graph", GraphConfig)
    family = v.choice("graph.family", r["family"], FAMILIES)
    n_min = v.integer("graph.n_min", r["n_min"], 2, _MAX_NODES)
    n_max = v.integer("graph.n_max", r["n_max"], 2, _MAX_NODES)
    if n_max < n_min:
        raise _size_order_error(n_min, n_max, r["_given"])
    edge_prob = v.prob("graph.edge_prob", r["edge_prob"])
    deg = v.number("graph.expected_degree", r["expected_degree"], 0.0, float(_MAX_NODES))
    if family == "er" and deg > n_min - 1:
        raise ConfigError.bad_value("graph.expected_degree", deg, f"must be <= graph.n_min - 1 ({n_min - 1})")
    m = v.integer("graph.m", r["m"], 1)
    if family == "scale_free" and m >= n_min:
        raise ConfigError.bad_value("graph.m", m, f"must be < graph.n_min ({n_min}) for family 'scale_free'")
    return GraphConfig(family, n_min, n_max, edge_prob, deg, m)


def _function_weights(r: dict[str, Any], functions: tuple[str, ...]) -> tuple[float, ...]:
    if "function_weights" not in r["_given"] and "functions" in r["_given"]:
        return (1.0,) * len(functions)  # a new list of functions without weights: equal weights
    weights = r["function_weights"]
    if not isinstance(weights, (list, tuple)) or len(weights) != len(functions):
        raise ConfigError.bad_value(
            "mechanism.function_weights",
            weights,
            f"must be a list of {len(functions)} numbers, one per mechanism.functions entry",
        )
    return v.numbers("mechanism.function_weights", weights, 1e-9, 1e9)


def _parse_mechanism(data: Mapping[str, Any]) -> MechanismConfig:
    r = v.table(data, "mechanism", MechanismConfig)
    w_lo = v.number("mechanism.w_lo", r["w_lo"], 0.0, _MAX_WEIGHT)
    functions = v.names("mechanism.functions", r["functions"], EDGE_FUNCTIONS)
    return MechanismConfig(
        kind=v.choice("mechanism.kind", r["kind"], MECHANISMS),
        weights=v.choice("mechanism.weights", r["weights"], WEIGHT_KINDS),
        w_lo=w_lo,
        w_hi=v.number("mechanism.w_hi", r["w_hi"], w_lo, _MAX_WEIGHT),
        functions=functions,
        function_weights=_function_weights(r, functions),
        interaction_prob=v.prob("mechanism.interaction_prob", r["interaction_prob"]),
        clip_parent=v.optional_bound("mechanism.clip_parent", r["clip_parent"], _MAX_CLIP),
        clip_term=v.optional_bound("mechanism.clip_term", r["clip_term"], _MAX_CLIP),
        clip_value=v.number("mechanism.clip_value", r["clip_value"], 0.0, _MAX_CLIP, open_lo=True),
        clip_interaction=v.optional_bound("mechanism.clip_interaction", r["clip_interaction"], _MAX_CLIP),
        clip_rest=v.optional_bound("mechanism.clip_rest", r["clip_rest"], _MAX_CLIP),
    )


def _parse_noise(data: Mapping[str, Any]) -> NoiseConfig:
    r = v.table(data, "noise", NoiseConfig)
    scale_lo = v.number("noise.scale_lo", r["scale_lo"], 0.0, _MAX_SCALE, open_lo=True)
    return NoiseConfig(
        kind=v.choice("noise.kind", r["kind"], NOISE_CHOICES),
        convention=v.choice("noise.convention", r["convention"], NOISE_CONVENTIONS),
        scale=v.number("noise.scale", r["scale"], 0.0, _MAX_SCALE, open_lo=True),
        per_node=v.boolean("noise.per_node", r["per_node"]),
        scale_lo=scale_lo,
        scale_hi=v.number("noise.scale_hi", r["scale_hi"], scale_lo, _MAX_SCALE),
        cauchy_clip=v.number("noise.cauchy_clip", r["cauchy_clip"], 0.0, _MAX_CLIP, open_lo=True),
        kinds=v.names("noise.kinds", r["kinds"], NOISE_KINDS),
        clip=v.optional_bound("noise.clip", r["clip"], _MAX_CLIP),
    )


def _parse_interventions(data: Mapping[str, Any]) -> InterventionConfig:
    r = v.table(data, "interventions", InterventionConfig)
    value_lo = v.number("interventions.value_lo", r["value_lo"], -_MAX_CLIP, _MAX_CLIP)
    return InterventionConfig(
        intervention_prob=v.prob("interventions.intervention_prob", r["intervention_prob"]),
        mode=v.choice("interventions.mode", r["mode"], VALUE_MODES),
        coeffs=v.numbers("interventions.coeffs", r["coeffs"], -_MAX_SCALE, _MAX_SCALE),
        value_scale=v.number_range("interventions.value_scale", r["value_scale"], 0.0, _MAX_SCALE),
        sigma_ddof=v.integer("interventions.sigma_ddof", r["sigma_ddof"], 0, 1),
        sigma_min=v.number("interventions.sigma_min", r["sigma_min"], 0.0, 1.0),
        values=v.numbers("interventions.values", r["values"], -_MAX_CLIP, _MAX_CLIP),
        value_lo=value_lo,
        value_hi=v.number("interventions.value_hi", r["value_hi"], value_lo, _MAX_CLIP),
        per_target=v.integer("interventions.per_target", r["per_target"], 1),
        value_clip=v.optional_bound("interventions.value_clip", r["value_clip"], _MAX_CLIP),
    )


def _standardize(value: Any) -> str:
    if isinstance(value, bool):  # recipes before the pooled option: true = base-world statistics
        return "base" if value else "none"
    return v.choice("samples.standardize", value, STANDARDIZE_MODES)


def _parse_samples(data: Mapping[str, Any]) -> SampleConfig:
    r = v.table(data, "samples", SampleConfig)
    base = v.integer("samples.base", r["base"], 1)
    per_int = base  # unset: follows base
    if "per_intervention" in r["_given"]:
        per_int = v.integer("samples.per_intervention", r["per_intervention"], 1)
    if per_int != base:
        raise ConfigError(
            f"config keys 'samples.base' ({base}) and 'samples.per_intervention' ({per_int}) differ: they must be "
            "equal (delta = int - base pairs intervened rows with base rows); set samples.base alone and the other follows"
        )
    twin = v.boolean("samples.twin", r["twin"])
    return SampleConfig(base, per_int, twin, _standardize(r["standardize"]))


_SECTIONS = ("graph", "mechanism", "noise", "interventions", "samples")


def parse_causal_config(data: Mapping[str, Any]) -> CausalConfig:
    """Validate a TOML-shaped mapping and build a :class:`CausalConfig`.

    Missing tables or keys take the defaults; keys in
    :data:`IGNORED_TOP_LEVEL_KEYS` are skipped; anything else unknown raises
    :class:`ConfigError` naming the key.
    """
    if not isinstance(data, Mapping):
        raise ConfigError.bad_value("<causal config>", data, "must be a table")
    for k in data:
        if k not in _SECTIONS and k not in IGNORED_TOP_LEVEL_KEYS:
            raise ConfigError(f"unknown config key '{k}' (known: {', '.join(_SECTIONS)}; and the recipe's seed, graphs and [build] table: shard_mb, codec, level, pack, workers)")
    return CausalConfig(
        graph=_parse_graph(data),
        mechanism=_parse_mechanism(data),
        noise=_parse_noise(data),
        interventions=_parse_interventions(data),
        samples=_parse_samples(data),
    )
