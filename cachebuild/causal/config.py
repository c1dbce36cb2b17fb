"""The causal generator's configuration: frozen dataclasses and their parser.

Config enters once: :func:`parse_causal_config` takes the TOML table (as
``tomllib`` returns it), validates every key and value, and returns a frozen
:class:`CausalConfig` that is passed down whole. ``CausalConfig.to_dict()``
gives back a JSON-able dict that parses to an equal config, which is what the
manifest stores. Errors are :class:`~cachebuild.errors.ConfigError` naming the
dotted key (``graph.edge_prob``), the value and what is allowed.

Top-level keys owned by other parts of cachebuild are skipped (see
:data:`IGNORED_TOP_LEVEL_KEYS`); any other unknown key is an error.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import ConfigError
from .mechanisms import EDGE_FUNCTIONS, NOISE_KINDS

__all__ = [
    "CausalConfig",
    "GraphConfig",
    "MechanismConfig",
    "NoiseConfig",
    "InterventionConfig",
    "SampleConfig",
    "FAMILIES",
    "MECHANISMS",
    "NOISE_CHOICES",
    "VALUE_MODES",
    "IGNORED_TOP_LEVEL_KEYS",
    "parse_causal_config",
]

FAMILIES: tuple[str, ...] = ("topo", "er", "scale_free")
MECHANISMS: tuple[str, ...] = ("linear", "nonlinear")
NOISE_CHOICES: tuple[str, ...] = NOISE_KINDS + ("mixed",)
VALUE_MODES: tuple[str, ...] = ("adaptive", "fixed", "sampled")
IGNORED_TOP_LEVEL_KEYS: frozenset[str] = frozenset({"seed", "graphs", "out", "build", "kind", "shard", "codec"})
"""Top-level keys that belong to the builder / writer / CLI and are skipped here."""

_MAX_NODES = 32767  # targets are stored as int16


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
    """Structural equations. Clipping bounds apply to the nonlinear kind only."""

    kind: str = "nonlinear"  # linear | nonlinear
    w_lo: float = 0.5  # |weight| ~ U(w_lo, w_hi), sign +-1 with prob 1/2
    w_hi: float = 2.0
    functions: tuple[str, ...] = EDGE_FUNCTIONS  # nonlinear: allowed edge functions
    interaction_prob: float = 0.2  # nonlinear: P(node with >= 2 parents multiplies its first two terms)
    clip_parent: float = 10.0
    clip_term: float = 10.0
    clip_value: float = 100.0


@dataclass(frozen=True)
class NoiseConfig:
    """Exogenous noise: kind, and the scale (std; Cauchy scale for cauchy) of each node."""

    kind: str = "normal"  # normal | laplace | gumbel | cauchy | uniform | mixed
    scale: float = 1.0  # used when per_node is false
    per_node: bool = False  # draw each node's scale from U(scale_lo, scale_hi)
    scale_lo: float = 0.5
    scale_hi: float = 1.5
    cauchy_clip: float = 10.0  # standard Cauchy variate clipped to +-cauchy_clip before scaling
    kinds: tuple[str, ...] = NOISE_KINDS  # mixed: kinds drawn from (uniformly, per graph)


@dataclass(frozen=True)
class InterventionConfig:
    """Perfect interventions do(X_k = c) on ``max(1, int(n * intervention_prob))`` distinct nodes."""

    intervention_prob: float = 0.5
    mode: str = "adaptive"  # adaptive | fixed | sampled
    coeffs: tuple[float, ...] = (-2.0, -1.0, 1.0, 2.0)  # adaptive: c = coeff * std(base X_k) * value_scale
    value_scale: float = 1.0
    values: tuple[float, ...] = (-2.0, -1.0, 1.0, 2.0)  # fixed: one intervention per value per target
    value_lo: float = -2.0  # sampled: c ~ U(value_lo, value_hi), per_target per target
    value_hi: float = 2.0
    per_target: int = 4

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
    """Rows per world. ``per_intervention`` must equal ``base`` (delta pairs rows)."""

    base: int = 64
    per_intervention: int = 64
    twin: bool = True  # intervened worlds reuse the base rows' exogenous noise
    standardize: bool = False  # z-score both worlds (and c) with the base world's mean/std


@dataclass(frozen=True)
class CausalConfig:
    """Everything that determines the causal records, besides the seed."""

    graph: GraphConfig = field(default_factory=GraphConfig)
    mechanism: MechanismConfig = field(default_factory=MechanismConfig)
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    interventions: InterventionConfig = field(default_factory=InterventionConfig)
    samples: SampleConfig = field(default_factory=SampleConfig)

    def to_dict(self) -> dict:
        """JSON-able nested dict (tuples as lists) that :func:`parse_causal_config` accepts."""
        out: dict[str, dict[str, Any]] = {}
        for f in dataclasses.fields(self):
            sub = getattr(self, f.name)
            out[f.name] = {
                k.name: list(v) if isinstance(v := getattr(sub, k.name), tuple) else v
                for k in dataclasses.fields(sub)
            }
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
            json_bytes = 160 + 4 * n + (48 * n if self.samples.standardize else 0)
            total += arrays + json_bytes
        return int(round(total / len(sizes)))


# ---------------------------------------------------------------- parsing


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _number(key: str, v: Any, lo: float | None = None, hi: float | None = None, what: str = "") -> float:
    ok = _is_number(v) and (lo is None or v >= lo) and (hi is None or v <= hi)
    if not ok:
        raise ConfigError.bad_value(key, v, what or "must be a finite number")
    return float(v)


def _prob(key: str, v: Any) -> float:
    return _number(key, v, 0.0, 1.0, "must be a number in [0, 1]")


def _positive(key: str, v: Any) -> float:
    if not (_is_number(v) and v > 0):
        raise ConfigError.bad_value(key, v, "must be a finite number > 0")
    return float(v)


def _int(key: str, v: Any, lo: int, hi: int | None = None) -> int:
    if not (isinstance(v, int) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ConfigError.bad_value(key, v, f"must be an integer {bound}")
    return v


def _bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ConfigError.bad_value(key, v, "must be true or false")
    return v


def _choice(key: str, v: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(v, str) or v not in allowed:
        raise ConfigError.bad_value(key, v, "must be one of " + ", ".join(repr(a) for a in allowed))
    return v


def _names(key: str, v: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    if not isinstance(v, (list, tuple)) or not v:
        raise ConfigError.bad_value(key, v, "must be a non-empty list of names from " + ", ".join(allowed))
    for name in v:
        if not isinstance(name, str) or name not in allowed:
            raise ConfigError.bad_value(key, name, "unknown name; allowed: " + ", ".join(allowed))
    if len(set(v)) != len(v):
        raise ConfigError.bad_value(key, list(v), "must not repeat a name")
    return tuple(v)


def _numbers(key: str, v: Any) -> tuple[float, ...]:
    if not isinstance(v, (list, tuple)) or not v or not all(_is_number(x) for x in v):
        raise ConfigError.bad_value(key, v, "must be a non-empty list of finite numbers")
    return tuple(float(x) for x in v)


def _table(data: Mapping[str, Any], section: str, cls: type) -> dict[str, Any]:
    raw = data.get(section, {})
    if not isinstance(raw, Mapping):
        raise ConfigError.bad_value(section, raw, "must be a table")
    known = {f.name for f in dataclasses.fields(cls)}
    for k in raw:
        if k not in known:
            raise ConfigError(f"unknown config key '{section}.{k}' (known: {', '.join(sorted(known))})")
    defaults = cls()
    return {name: raw.get(name, getattr(defaults, name)) for name in known}


def _parse_graph(data: Mapping[str, Any]) -> GraphConfig:
    r = _table(data, "graph", GraphConfig)
    family = _choice("graph.family", r["family"], FAMILIES)
    n_min = _int("graph.n_min", r["n_min"], 2, _MAX_NODES)
    n_max = _int("graph.n_max", r["n_max"], 2, _MAX_NODES)
    if n_max < n_min:
        raise ConfigError.bad_value("graph.n_max", n_max, f"must be >= graph.n_min ({n_min})")
    edge_prob = _prob("graph.edge_prob", r["edge_prob"])
    deg = _number("graph.expected_degree", r["expected_degree"], 0.0, what="must be a number >= 0")
    if family == "er" and deg > n_min - 1:
        raise ConfigError.bad_value("graph.expected_degree", deg, f"must be <= graph.n_min - 1 ({n_min - 1})")
    m = _int("graph.m", r["m"], 1)
    if family == "scale_free" and m >= n_min:
        raise ConfigError.bad_value("graph.m", m, f"must be < graph.n_min ({n_min}) for family 'scale_free'")
    return GraphConfig(family, n_min, n_max, edge_prob, deg, m)


def _parse_mechanism(data: Mapping[str, Any]) -> MechanismConfig:
    r = _table(data, "mechanism", MechanismConfig)
    kind = _choice("mechanism.kind", r["kind"], MECHANISMS)
    w_lo = _number("mechanism.w_lo", r["w_lo"], 0.0, what="must be a finite number >= 0")
    w_hi = _number("mechanism.w_hi", r["w_hi"], w_lo, what=f"must be a finite number >= mechanism.w_lo ({w_lo})")
    functions = _names("mechanism.functions", r["functions"], EDGE_FUNCTIONS)
    return MechanismConfig(
        kind=kind,
        w_lo=w_lo,
        w_hi=w_hi,
        functions=functions,
        interaction_prob=_prob("mechanism.interaction_prob", r["interaction_prob"]),
        clip_parent=_positive("mechanism.clip_parent", r["clip_parent"]),
        clip_term=_positive("mechanism.clip_term", r["clip_term"]),
        clip_value=_positive("mechanism.clip_value", r["clip_value"]),
    )


def _parse_noise(data: Mapping[str, Any]) -> NoiseConfig:
    r = _table(data, "noise", NoiseConfig)
    scale_lo = _positive("noise.scale_lo", r["scale_lo"])
    scale_hi = _number(
        "noise.scale_hi", r["scale_hi"], scale_lo, what=f"must be a number >= noise.scale_lo ({scale_lo})"
    )
    return NoiseConfig(
        kind=_choice("noise.kind", r["kind"], NOISE_CHOICES),
        scale=_positive("noise.scale", r["scale"]),
        per_node=_bool("noise.per_node", r["per_node"]),
        scale_lo=scale_lo,
        scale_hi=scale_hi,
        cauchy_clip=_positive("noise.cauchy_clip", r["cauchy_clip"]),
        kinds=_names("noise.kinds", r["kinds"], NOISE_KINDS),
    )


def _parse_interventions(data: Mapping[str, Any]) -> InterventionConfig:
    r = _table(data, "interventions", InterventionConfig)
    value_lo = _number("interventions.value_lo", r["value_lo"])
    value_hi = _number(
        "interventions.value_hi", r["value_hi"], value_lo,
        what=f"must be a number >= interventions.value_lo ({value_lo})",
    )
    return InterventionConfig(
        intervention_prob=_prob("interventions.intervention_prob", r["intervention_prob"]),
        mode=_choice("interventions.mode", r["mode"], VALUE_MODES),
        coeffs=_numbers("interventions.coeffs", r["coeffs"]),
        value_scale=_number("interventions.value_scale", r["value_scale"]),
        values=_numbers("interventions.values", r["values"]),
        value_lo=value_lo,
        value_hi=value_hi,
        per_target=_int("interventions.per_target", r["per_target"], 1),
    )


def _parse_samples(data: Mapping[str, Any]) -> SampleConfig:
    r = _table(data, "samples", SampleConfig)
    base = _int("samples.base", r["base"], 1)
    per_int = _int("samples.per_intervention", r["per_intervention"], 1)
    if per_int != base:
        raise ConfigError.bad_value(
            "samples.per_intervention", per_int,
            f"must equal samples.base ({base}): delta = int - base pairs intervened rows with base rows",
        )
    return SampleConfig(base, per_int, _bool("samples.twin", r["twin"]), _bool("samples.standardize", r["standardize"]))


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
            raise ConfigError(f"unknown config key '{k}' (known: {', '.join(_SECTIONS)})")
    return CausalConfig(
        graph=_parse_graph(data),
        mechanism=_parse_mechanism(data),
        noise=_parse_noise(data),
        interventions=_parse_interventions(data),
        samples=_parse_samples(data),
    )
