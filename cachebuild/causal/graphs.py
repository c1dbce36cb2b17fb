"""Random DAG families, drawn for a whole block of same-size graphs at once.

Every function here works in *causal order*: node ``p`` is the p-th node of a
topological order, so adjacency is strictly upper triangular (``A[g, i, j]``
for ``i < j`` means edge ``i -> j``). The sampler permutes node indices only
when it writes records, so stored index order never leaks the causal order.

Families (``graph.family``):

* ``topo``: each forward pair of a random topological order is an edge with
  probability ``edge_prob``; expected edges ``p * n (n - 1) / 2``.
* ``er``: the same model parameterised by expected degree,
  ``p = expected_degree / (n - 1)``; expected edges ``expected_degree * n / 2``.
* ``scale_free``: Barabasi-Albert as in ``networkx.barabasi_albert_graph``
  (a star on ``m + 1`` nodes, then each new node attaches to ``m`` distinct
  existing nodes chosen with probability proportional to degree, sampled
  without replacement by the Efraimidis-Spirakis keys ``log(u) / degree``),
  oriented from older to newer node; exactly ``m (n - m)`` edges.
"""

from __future__ import annotations

import numpy as np

from .config import GraphConfig

__all__ = ["sample_dags", "expected_edge_count", "descendants", "random_permutations"]


def sample_dags(cfg: GraphConfig, rng: np.random.Generator, g: int, n: int) -> np.ndarray:
    """Draw ``g`` DAGs of ``n`` nodes: bool ``[g, n, n]``, strictly upper triangular."""
    if cfg.family == "scale_free":
        return _barabasi_albert(rng, g, n, cfg.m)
    p = cfg.edge_prob if cfg.family == "topo" else min(1.0, cfg.expected_degree / (n - 1))
    adj = rng.random((g, n, n)) < p
    adj &= np.triu(np.ones((n, n), dtype=bool), k=1)
    return adj


def _barabasi_albert(rng: np.random.Generator, g: int, n: int, m: int) -> np.ndarray:
    """Preferential attachment for ``g`` graphs at once; one loop step per new node."""
    adj = np.zeros((g, n, n), dtype=bool)
    adj[:, 0, 1 : m + 1] = True  # star: node 0 is the centre of nodes 1..m
    deg = np.zeros((g, n), dtype=np.float64)
    deg[:, 0] = m
    deg[:, 1 : m + 1] = 1.0
    rows = np.arange(g)[:, None]
    for t in range(m + 1, n):
        keys = np.log1p(-rng.random((g, t))) / deg[:, :t]  # Efraimidis-Spirakis, larger wins
        chosen = np.argpartition(-keys, m - 1, axis=1)[:, :m]
        adj[rows, chosen, t] = True
        deg[rows, chosen] += 1.0
        deg[:, t] = m
    return adj


def expected_edge_count(cfg: GraphConfig, n: int) -> float:
    """Expected number of edges of a graph of ``n`` nodes from this family."""
    if cfg.family == "topo":
        return cfg.edge_prob * n * (n - 1) / 2
    if cfg.family == "er":
        return min(1.0, cfg.expected_degree / (n - 1)) * n * (n - 1) / 2
    return float(cfg.m * (n - cfg.m))


def descendants(adj: np.ndarray) -> np.ndarray:
    """Strict descendants in causal order: ``out[g, a, b]`` iff a directed path ``a -> ... -> b``.

    One step per node, last to first: a node reaches its children and what
    they reach (rows of later nodes are final by then).
    """
    g, n, _ = adj.shape
    out = np.zeros_like(adj, dtype=bool)
    for a in range(n - 2, -1, -1):
        kids = adj[:, a, :]
        out[:, a, :] = kids | np.any(kids[:, :, None] & out, axis=1)
    return out


def random_permutations(rng: np.random.Generator, g: int, n: int) -> np.ndarray:
    """``perm[g, p]`` = stored index of the node at causal position ``p`` (int64 ``[g, n]``)."""
    return rng.permuted(np.broadcast_to(np.arange(n), (g, n)), axis=1)
