"""A faithful re-implementation of our users' on-the-fly causal data pipeline.

Benchmark-only (never imported by the package). It follows the users' reports:
one structural causal model per step, built with networkx and pandas: a random
DAG, an observational DataFrame, one DataFrame per intervention computed node by
node in topological order (each node's parents read from, and its value written
to, the world's DataFrame columns; interaction terms re-drawn per world, as in
their code; about 90 graphs/s on one core here, the issue's "roughly 100"), then a ``CausalDataset.__iter__`` that converts every DataFrame to a
tensor and yields one dict per (intervention, row), re-stacked by a padding
collate function.
"""

from __future__ import annotations

import itertools
from typing import Iterator

import networkx as nx
import numpy as np
import pandas as pd
import torch

EDGE_FUNCS = [
    lambda x: x,
    lambda x: x,
    lambda x: -x,
    np.sin,
    np.cos,
    np.tanh,
    lambda x: np.sign(x) * np.log1p(np.abs(x)),
    lambda x: np.exp(np.clip(x, -5, 5)),
    lambda x: np.sign(x) * np.sqrt(np.abs(x)),
    lambda x: x**2,
    lambda x: x**3,
    lambda x: 1 / (1 + np.exp(-x)),
    lambda x: (x > 0).astype(float),
    np.abs,
    lambda x: 0.5 * x**2 + 0.5 * x,
    lambda x: x - np.floor(x),
    lambda x: 2 * x / (1 + np.abs(x)),
]


class UserStyleGenerator:
    """networkx + pandas, one graph at a time, per-node loops."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def random_dag(self, n: int, edge_prob: float) -> nx.DiGraph:
        order = self.rng.permutation(n)
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        for i in range(n):
            for j in range(i + 1, n):
                if self.rng.random() < edge_prob:
                    g.add_edge(int(order[i]), int(order[j]), weight=self.rng.uniform(0.5, 2.0) * self.rng.choice([-1, 1]), fn=int(self.rng.integers(len(EDGE_FUNCS))))
        return g

    def simulate(self, g: nx.DiGraph, noise: pd.DataFrame, do: dict[int, float] | None = None) -> pd.DataFrame:
        """One world, node by node in topological order: parents read from and each node
        written to the world's DataFrame column, the arithmetic on numpy arrays."""
        df = pd.DataFrame(0.0, index=noise.index, columns=list(g.nodes))
        for node in nx.topological_sort(g):
            if do and node in do:
                df[node] = do[node]
                continue
            parents = list(g.predecessors(node))
            interact = len(parents) >= 2 and self.rng.random() < 0.2  # re-drawn per world, as theirs
            terms = [np.clip(g.edges[p, node]["weight"] * EDGE_FUNCS[g.edges[p, node]["fn"]](np.clip(df[p].to_numpy(), -10, 10)), -10, 10) for p in parents]
            value = noise[node].to_numpy().copy()
            if interact:
                value += terms[0] * terms[1]
                terms = terms[2:]
            for t in terms:
                value += t
            df[node] = np.clip(value, -100, 100)
        return df

    def generate_pipeline(self, num_nodes: int, edge_prob: float = 0.3, num_samples_base: int = 64, num_samples_per_intervention: int = 64, intervention_prob: float = 0.5) -> dict:
        g = self.random_dag(num_nodes, edge_prob)
        noise = pd.DataFrame(self.rng.standard_normal((num_samples_base, num_nodes)), columns=list(g.nodes))
        base = self.simulate(g, noise)
        targets = self.rng.choice(num_nodes, size=max(1, int(num_nodes * intervention_prob)), replace=False)
        dfs, nodes = [base], []
        for k in targets:
            sigma = float(base[int(k)].std())
            for coeff in (-2, -1, 1, 2):
                dfs.append(self.simulate(g, noise.iloc[:num_samples_per_intervention], {int(k): coeff * sigma}))
                nodes.append(int(k))
        return {"dag": g, "all_dfs": dfs, "int_nodes": nodes}


class UserStyleCausalDataset(torch.utils.data.IterableDataset):
    """Generates a graph per step and yields one dict per (intervention, row)."""

    def __init__(self, n_range=(5, 10), max_nodes: int = 10, seed: int = 0, graphs: int | None = None):
        self.n_range, self.max_nodes, self.seed, self.graphs = n_range, max_nodes, seed, graphs

    def __iter__(self) -> Iterator[dict]:
        info = torch.utils.data.get_worker_info()
        gen = UserStyleGenerator(self.seed + (info.id if info else 0))
        count = itertools.count() if self.graphs is None else range(self.graphs // (info.num_workers if info else 1))
        for _ in count:
            n = int(gen.rng.integers(self.n_range[0], self.n_range[1] + 1))
            res = gen.generate_pipeline(num_nodes=n)
            base_tensor = torch.tensor(res["all_dfs"][0].values, dtype=torch.float32)
            adj = torch.tensor(nx.to_numpy_array(res["dag"], nodelist=range(n)), dtype=torch.float32)
            for i in range(1, len(res["all_dfs"])):
                int_tensor = torch.tensor(res["all_dfs"][i].values, dtype=torch.float32)
                node = res["int_nodes"][i - 1]
                int_mask = torch.zeros(n)
                int_mask[node] = 1.0
                for j in range(int_tensor.shape[0]):
                    target_row = base_tensor[j]
                    intervened_row = int_tensor[j]
                    yield {
                        "base_samples": base_tensor,
                        "int_samples": int_tensor,
                        "target_row": target_row,
                        "int_mask": int_mask,
                        "int_node_idx": node,
                        "delta": intervened_row - target_row,
                        "adj": adj,
                    }


def collate_fn_pad(batch: list[dict], max_nodes: int = 10) -> dict:
    """The users' padding collate: pads every tensor of every item to max_nodes, then stacks."""
    out: dict[str, list] = {k: [] for k in batch[0]}
    for item in batch:
        for k, v in item.items():
            if isinstance(v, torch.Tensor):
                pad = [0, max_nodes - v.shape[-1]] + ([0, max_nodes - v.shape[-2]] if k == "adj" else [])
                v = torch.nn.functional.pad(v, pad)
            out[k].append(v)
    return {k: torch.stack(v) if isinstance(v[0], torch.Tensor) else torch.tensor(v) for k, v in out.items()}
