"""The forest exact TreeSHAP reads (``runtime.treeshap.ShapForest``), made from a scoring Forest."""

from __future__ import annotations

import numpy as np

from forestflow.runtime.trees.codes import FEATURE, LEFT, RIGHT
from forestflow.runtime.trees.forest import Forest
from forestflow.runtime.treeshap import ShapForest


def shap_forest(forest: Forest, feature_names: list[str]) -> ShapForest:
    """The ShapForest of a scoring forest: tree weights and averaging folded into the leaf values;
    a tree with vector leaves (scikit-learn classifiers) becomes one copy per class, whose nodes
    follow the original table (decisions of copy k of node i are those of node i: the copy's
    node indices are ``i + k * n_nodes``)."""
    nodes = forest.nodes
    n, width = len(nodes), forest.leaves.shape[1]
    scale = (np.where(forest.weighted, forest.weights, 1.0) / forest.divisor).astype(np.float64)
    per_node = np.zeros(n)
    for t, root in enumerate(forest.roots.tolist()):
        end = forest.roots[t + 1] if t + 1 < len(forest.roots) else n
        per_node[root:end] = scale[t]
    parts = []
    for k in range(width):
        offset = k * n
        inner = nodes[:, LEFT] >= 0
        parts.append(
            (
                np.where(inner, nodes[:, LEFT] + offset, -1),
                np.where(inner, nodes[:, RIGHT] + offset, -1),
                nodes[:, FEATURE],
                forest.cover,
                np.where(inner, 0.0, forest.leaves[:, k] * per_node),
                forest.roots + offset,
                forest.groups + k,
            )
        )
    stack = [np.concatenate(list(column)) for column in zip(*parts)]
    return ShapForest(
        left=stack[0].astype(np.int32),
        right=stack[1].astype(np.int32),
        feature=stack[2].astype(np.int32),
        cover=stack[3].astype(np.float64),
        value=stack[4].astype(np.float64),
        roots=stack[5].astype(np.int32),
        group=stack[6].astype(np.int32),
        n_groups=forest.n_groups,
        feature_names=list(feature_names),
        base_margin=forest.base.copy(),
    )


def tiled_decisions(forest: Forest, decisions: np.ndarray) -> np.ndarray:
    """Decisions for the ShapForest of :func:`shap_forest` (one block of columns per leaf copy)."""
    width = forest.leaves.shape[1]
    return decisions if width == 1 else np.ascontiguousarray(np.tile(decisions, (1, width)))
