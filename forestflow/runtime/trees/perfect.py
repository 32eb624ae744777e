"""The padded perfect-tree layout the C kernel walks without branches, built from a checked node table.

Each tree of depth ``d <= MAX_DEPTH`` without categorical splits becomes a complete binary tree of
depth ``d`` in heap order (node ``i``'s children are ``2i+1`` and ``2i+2``): a row takes exactly
``d`` steps ``i = 2*i + 1 + (value > threshold)`` and lands on leaf ``i - (2^d - 1)``. A leaf of
the original tree above depth ``d`` fills every padded leaf below it, so whatever a padding node
decides, the row reaches the same original leaf.

Every split is rewritten as one comparison, "right when value > T", exact for each format:

- XGBoost's ``x < t`` in float32 is ``x > T`` with T the float32 just below the smallest float32
  >= t (the current kernel compares ``(double)(float)x < t`` at plain nodes and ``(float)x <
  (float)t`` at the others: both are kept); scikit-learn's ``(double)(float)x <= t`` is ``x > T``
  with T the largest float32 <= t; LightGBM's double ``x <= t`` is ``x > t``.
- Missing values become values: each (feature, missing rule) pair the trees use is one *slot*
  of the row, computed once per row: NaN becomes -inf where missing goes left, +inf where it goes
  right, 0 for LightGBM's "none" type; LightGBM's "zero" type also maps |x| <= 1e-35f.

A tree whose rewrite would not be exact (a threshold T that is NaN or +inf, which the infinities
standing for missing values cannot pass), a categorical split, or depth over MAX_DEPTH keeps depth
-1: the kernel walks it in the node table, in its place in the tree order. Leaves are summed in
tree order either way, so the sums are the node-table walk's, bit for bit. ``_forest.check_layout``
checks every index before the kernel trusts the layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forestflow.runtime.trees.codes import (
    CATEGORICAL,
    DEFAULT_LEFT,
    FEATURE,
    FLAGS,
    LE,
    LEFT,
    LT_F32,
    MISSING_NAN,
    MISSING_SHIFT,
    MISSING_ZERO,
    RIGHT,
)

#: Deeper trees are walked in the node table (a padded tree has 2^d - 1 nodes and 2^d leaves).
MAX_DEPTH = 8
#: Slot families (as in _forest.c): NaN -> -inf, NaN -> +inf, NaN -> 0, and NaN or |x| <= 1e-35f -> -inf / +inf.
NAN_LEFT, NAN_RIGHT, NAN_ZERO, ZERO_LEFT, ZERO_RIGHT = range(5)
N_FAMILIES = 5


@dataclass(frozen=True)
class PerfectLayout:
    """The padded trees of a forest (``_forest.c`` reads them in this order)."""

    trees: np.ndarray  # int32 [n_trees, 3]: depth (-1: walked in the node table), first node, first leaf
    slots: np.ndarray  # int32 [padded nodes]: the row slot each node compares
    thresholds: np.ndarray  # float32 (XGBoost, scikit-learn trees) or float64 (LightGBM) [padded nodes]: T
    leaves: np.ndarray  # int32 [padded leaves]: the forest's node whose leaf value the row gets
    sources: np.ndarray  # int32 [slots]: the feature each slot is computed from
    families: np.ndarray  # int32 [N_FAMILIES + 1]: slots of family m are families[m] .. families[m+1] - 1

    @property
    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The arrays in the kernel's order."""
        return (self.trees, self.slots, self.thresholds, self.leaves, self.sources, self.families)

    @property
    def padded_trees(self) -> int:
        """How many trees the kernel walks in this layout (the rest in the node table)."""
        return int(np.count_nonzero(self.trees[:, 0] >= 0))


def _gt_thresholds(thresholds: np.ndarray, flags: np.ndarray, compare: int) -> tuple[np.ndarray, np.ndarray]:
    """T per node such that "right when value > T" is the format's rule; and where no T is exact."""
    t = thresholds
    with np.errstate(over="ignore", invalid="ignore"):
        if compare == LE:
            gt: np.ndarray = t.astype(np.float64)
            bad = np.zeros(len(t), dtype=bool)
        else:
            near = t.astype(np.float32)
            if compare == LT_F32:
                up = np.where(near.astype(np.float64) < t, np.nextafter(near, np.float32(np.inf)), near)
                plain = (flags & ~DEFAULT_LEFT) == 0  # the kernel's inline comparison, in double
                least = np.where(plain, up, near)  # the smallest float32 a row must reach to go right
                bad = least == -np.inf
                gt = np.nextafter(least, np.float32(-np.inf))
            else:
                gt = np.where(near.astype(np.float64) > t, np.nextafter(near, np.float32(-np.inf)), near)
                bad = np.zeros(len(t), dtype=bool)
    return gt, bad | np.isnan(gt) | (gt == np.inf)


def _family(flags: np.ndarray) -> np.ndarray:
    """The slot family of each node's missing rule (the kernel's goes_right())."""
    kind = (flags >> MISSING_SHIFT) & 3
    left = (flags & DEFAULT_LEFT) != 0
    return np.where(
        kind == MISSING_NAN,
        np.where(left, NAN_LEFT, NAN_RIGHT),
        np.where(kind == MISSING_ZERO, np.where(left, ZERO_LEFT, ZERO_RIGHT), NAN_ZERO),
    )


def perfect_layout(nodes: np.ndarray, thresholds: np.ndarray, roots: np.ndarray, n_features: int, compare: int) -> PerfectLayout:
    """The layout of a checked node table (every tree reached once from its root, see forest.py)."""
    nodes = nodes.astype(np.int64)
    left, right, flags, feature = nodes[:, LEFT], nodes[:, RIGHT], nodes[:, FLAGS], nodes[:, FEATURE]
    gt, bad = _gt_thresholds(thresholds, flags, compare)
    unusable = bad | ((flags & CATEGORICAL) != 0)
    n_trees = len(roots)
    depth = np.zeros(n_trees, dtype=np.int64)
    ok = np.ones(n_trees, dtype=bool)
    node, tree, level = roots.astype(np.int64), np.arange(n_trees), 0
    while len(node):
        inner = left[node] >= 0
        np.maximum.at(depth, tree[~inner], level)
        node, tree = node[inner], tree[inner]
        if level == MAX_DEPTH:
            ok[tree] = False
            break
        ok[tree[unusable[node]]] = False
        node, tree, level = np.concatenate([left[node], right[node]]), np.concatenate([tree, tree]), level + 1
    depth = np.where(ok, depth, -1)
    size = np.where(ok, 1 << np.maximum(depth, 0), 0)
    leaf_start = np.concatenate([[0], np.cumsum(size)])
    node_start = np.concatenate([[0], np.cumsum(np.maximum(size - 1, 0))])
    keys = np.full(int(node_start[-1]), -1, dtype=np.int64)
    gts = np.zeros(len(keys), dtype=gt.dtype)
    leaves = np.full(int(leaf_start[-1]), -1, dtype=np.int64)
    tree = np.flatnonzero(ok)
    node, pos, level = roots.astype(np.int64)[tree], np.zeros(len(tree), dtype=np.int64), 0
    while len(node):
        inner = left[node] >= 0
        lt, lp, ln = tree[~inner], pos[~inner], node[~inner]
        span = 1 << (depth[lt] - level)
        first = leaf_start[lt] + (lp + 1) * span - (1 << depth[lt])  # the leftmost padded leaf below
        starts = np.repeat(first - np.concatenate([[0], np.cumsum(span)[:-1]]), span)
        leaves[starts + np.arange(int(span.sum()))] = np.repeat(ln, span)
        node, tree, pos = node[inner], tree[inner], pos[inner]
        at = node_start[tree] + pos
        keys[at] = _family(flags[node]) * n_features + feature[node]
        gts[at] = gt[node]
        node, tree, pos = (
            np.concatenate([left[node], right[node]]),
            np.concatenate([tree, tree]),
            np.concatenate([2 * pos + 1, 2 * pos + 2]),
        )
        level += 1
    used, slot = np.unique(keys[keys >= 0], return_inverse=True)
    slots = np.zeros(len(keys), dtype=np.int32)  # padding nodes compare slot 0: either way leads to the same leaf
    slots[keys >= 0] = slot
    families = np.searchsorted(used // n_features, np.arange(N_FAMILIES + 1), side="left")
    return PerfectLayout(
        trees=np.ascontiguousarray(np.stack([depth, node_start[:-1], leaf_start[:-1]], axis=1), dtype=np.int32),
        slots=slots,
        thresholds=gts,
        leaves=leaves.astype(np.int32),
        sources=(used % n_features).astype(np.int32),
        families=families.astype(np.int32),
    )
