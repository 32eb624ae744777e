"""Test oracles for explanations: random forests and exact Shapley values by enumeration."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

from forestflow.runtime.treeshap import ShapForest


def random_forest(rng: np.random.Generator, n_features: int, n_trees: int, n_groups: int = 1, max_depth: int = 4) -> ShapForest:
    """Random trees (splits on random columns, repeats included; covers = sums of random leaf covers)."""
    left: list[int] = []
    right: list[int] = []
    feature: list[int] = []
    cover: list[float] = []
    value: list[float] = []

    def grow(depth: int) -> int:
        j = len(left)
        left.append(-1)
        right.append(-1)
        feature.append(-1)
        cover.append(0.0)
        value.append(0.0)
        if depth < max_depth and rng.random() < 0.75:
            feature[j] = int(rng.integers(n_features))
            lo, hi = grow(depth + 1), grow(depth + 1)
            left[j], right[j] = lo, hi
            cover[j] = cover[lo] + cover[hi]
        else:
            value[j] = float(rng.normal())
            cover[j] = float(rng.integers(1, 20)) if rng.random() < 0.9 else 0.0  # a few empty leaves
        return j

    roots = [grow(0) for _ in range(n_trees)]
    return ShapForest(
        left=np.array(left),
        right=np.array(right),
        feature=np.array(feature),
        cover=np.array(cover),
        value=np.array(value),
        roots=np.array(roots),
        group=np.arange(n_trees) % n_groups,
        n_groups=n_groups,
        feature_names=[f"x{i}" for i in range(n_features)],
        base_margin=rng.normal(size=n_groups),
    )


def margin(forest: ShapForest, decisions: np.ndarray) -> np.ndarray:
    """``[rows, groups]``: the leaves the decisions lead to, summed per group, plus the base margin."""
    out = np.tile(forest.base_margin, (len(decisions), 1))
    for r, dec in enumerate(decisions):
        for root, g in zip(forest.roots, forest.group):
            j = int(root)
            while forest.left[j] >= 0:
                j = int(forest.right[j] if dec[j] else forest.left[j])
            out[r, g] += forest.value[j]
    return out


def _fraction(forest: ShapForest, child: int, parent: int) -> float:
    r = forest.cover[parent]
    return float(forest.cover[child] / r) if r > 0 else 0.5


def _conditional(forest: ShapForest, dec: np.ndarray, j: int, known: frozenset[int]) -> float:
    """The path-dependent expectation of one tree given the columns in ``known``."""
    if forest.left[j] < 0:
        return float(forest.value[j])
    lo, hi = int(forest.left[j]), int(forest.right[j])
    if int(forest.feature[j]) in known:
        return _conditional(forest, dec, hi if dec[j] else lo, known)
    return _fraction(forest, lo, j) * _conditional(forest, dec, lo, known) + _fraction(forest, hi, j) * _conditional(
        forest, dec, hi, known
    )


def shapley(n_features: int, value: Callable[[frozenset[int]], np.ndarray]) -> np.ndarray:
    """Exact Shapley values by enumerating every subset: ``[..., n_features + 1]``, ``value(empty)`` last."""
    v = {frozenset(s): value(frozenset(s)) for k in range(n_features + 1) for s in itertools.combinations(range(n_features), k)}
    empty = v[frozenset()]
    phi = np.zeros((*np.shape(empty), n_features + 1))
    for i in range(n_features):
        others = [f for f in range(n_features) if f != i]
        for k in range(n_features):
            weight = math.factorial(k) * math.factorial(n_features - k - 1) / math.factorial(n_features)
            for s in itertools.combinations(others, k):
                phi[..., i] += weight * (v[frozenset(s) | {i}] - v[frozenset(s)])
    phi[..., -1] = empty
    return phi


def brute_force_tree_shap(forest: ShapForest, decisions: np.ndarray) -> np.ndarray:
    """TreeSHAP's values computed the slow way: Shapley values of the path-dependent expectation."""
    out = np.zeros((len(decisions), forest.n_groups, forest.n_features + 1))
    for r, dec in enumerate(decisions):

        def value(known: frozenset[int], dec: np.ndarray = dec) -> np.ndarray:
            v = forest.base_margin.copy()
            for root, g in zip(forest.roots, forest.group):
                v[g] += _conditional(forest, dec, int(root), known)
            return v

        out[r] = shapley(forest.n_features, value)
    return out
