"""The users' curriculum as caches: one causal cache per level, n growing from 20 to 50 nodes.

    python examples/curriculum/levels.py --out cache/curriculum --levels 4 --graphs 2000

Their trainer (``MultiModelDeltaPredictor``, ``main.py`` with
``src/training/curriculum.py``) rebuilds its dataset every epoch from the
current level: ``max_vars = 20 + 30 * progress`` nodes (``num_nodes_range =
(max_vars - 1, max_vars)``), edge probability ``density_max = 0.25 + 0.10 *
progress`` (``progress = level / (levels - 1)``), and an intervention scale
drawn per graph from ``intervention_scale_range=(1.0, 50.0)`` at every level
(``main.py``'s training ``CausalDataset``; the level's ``intervention_range``
``2 + 8 * progress`` only sets the fixed scale of their validation graphs).
Here each level is a cache built once from the users' recipe
(``configs/causal-users-2026-01-15.toml``) with those values as overrides.
``train.py`` then reads the levels through a schedule.

Edge probability: 0.3 at every level, what their code computes. ``main.py`` gives the
level's ``density_max`` (``0.25 + 0.10 * progress``) to ``SCMGenerator``, but its
``CausalDataset`` (which ``main.py`` gives no ``edge_prob``, for training or validation)
passes its own default 0.3 to ``generate_pipeline``, which overrides the generator's.
``--stated-density`` (``level_params(..., stated_density=True)``) builds the density their
curriculum states instead: a deliberate difference from their runs (docs/mixtures.md, "The
curriculum example").
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs" / "causal-users-2026-01-15.toml"
TRAINING_SCALE_RANGE = (1.0, 50.0)
"""Their training ``CausalDataset(intervention_scale_range=(1.0, 50.0))``, the same at every level."""
THEIR_EDGE_PROB = 0.3
"""``CausalDataset``'s default ``edge_prob``, which their generator uses at every level."""


def level_params(level: int, levels: int, min_vars: int = 20, max_vars: int = 50, stated_density: bool = False) -> dict[str, Any]:
    """The users' curriculum values of ``level`` (of ``levels``), as recipe overrides: what their
    code computes, or with ``stated_density`` the curriculum's ``density_max`` as edge probability."""
    progress = level / max(1, levels - 1)
    n = int(min_vars + (max_vars - min_vars) * progress)
    return {
        "graph.n_min": n - 1,
        "graph.n_max": n,
        "graph.edge_prob": round(0.25 + 0.10 * progress, 4) if stated_density else THEIR_EDGE_PROB,
        "interventions.value_scale": list(TRAINING_SCALE_RANGE),
    }


def level_name(level: int) -> str:
    return f"level{level}"


def build_levels(out: Path, levels: int, graphs: int, samples: int | None = None, workers: int | None = None, seed: int = 0, stated_density: bool = False) -> dict[str, str]:
    """Build (or confirm) every level's cache under ``out``; ``{name: folder}`` in level order."""
    from cachebuild import build

    roots = {}
    for level in range(levels):
        overrides = [f"{k}={v}" for k, v in level_params(level, levels, stated_density=stated_density).items()]
        if samples is not None:
            overrides += [f"samples.base={samples}", f"samples.per_intervention={samples}"]
        folder = out / level_name(level)
        build(RECIPE, folder, records=graphs, seed=seed + level, workers=workers, overrides=overrides, progress=False)
        roots[level_name(level)] = str(folder)
    return roots


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="cache/curriculum")
    ap.add_argument("--levels", type=int, default=4)
    ap.add_argument("--graphs", type=int, default=2000, help="graphs per level")
    ap.add_argument("--samples", type=int, default=None, help="rows per world (default: the recipe's 64)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--stated-density", action="store_true", help="edge probability 0.25 + 0.10 * progress (their curriculum's stated density; their code uses 0.3)")
    args = ap.parse_args()
    for name, folder in build_levels(Path(args.out), args.levels, args.graphs, args.samples, args.workers, stated_density=args.stated_density).items():
        print(f"{name}: {folder}  {level_params(int(name[5:]), args.levels, stated_density=args.stated_density)}")


if __name__ == "__main__":
    main()
