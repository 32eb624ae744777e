"""The padded perfect-tree layout of an H2O GBM/DRF model: ``_h2o_trees.c`` walks it branch-free.

The layout is :mod:`forestflow.runtime.trees.perfect`'s (trees of depth <= 8 padded to complete
trees, "right when slot > T" at every node, 16 walks at once), built from the H2O node table
rewritten into that module's terms:

- A plain numeric split (genmodel: NA goes its way, else right when ``d >= split``, compared in
  double) reads a feature slot where NaN becomes -inf (NA goes left) or +inf (NA goes right), with
  T the largest double below the split: ``d > T`` is ``d >= split`` for every non-NaN ``d``.
- Every other split (a categorical bitset, NA-vs-rest, a numeric split on a categorical column in
  MOJO 1.2+, or a split value that is NaN or -inf, which no T can stand for) reads a *decision
  slot*: the kernel computes ``goes_right`` of one node per distinct split once per row (1.0 right,
  0.0 left; T = 0.5). Splits with the same column, kind, NA direction, split value and bitset decide
  alike for every row, so they share one slot.

So every tree of depth <= 8 is padded, categorical splits included; deeper trees are walked in the
node table, in their place in the tree order. The kernel sums each row's trees in genmodel's order
either way and reaches the same leaves, so the predictions are the node-table walk's bit for bit.
``_h2o_trees.score`` checks every index of the layout before it walks it.
"""

from __future__ import annotations

import numpy as np

from forestflow.runtime.h2o_tree_reader import LEAF, NUMERIC, TreeTable
from forestflow.runtime.trees import codes
from forestflow.runtime.trees.perfect import PerfectLayout, perfect_layout


def _decision_key(t: TreeTable, node: int) -> tuple[object, ...]:
    """What ``goes_right`` reads of a node besides the row (the column's domain size and the tree
    version are the model's)."""
    start, count = int(t.bits_start[node]), int(t.bits_count[node])
    bitset = bytes(t.bits[start : start + (count + 7) // 8]) if start >= 0 else None
    split = float(t.split[node])
    return (
        int(t.kind[node]),
        int(t.column[node]),
        bool(t.na_left[node]),
        split if split == split else "nan",  # NaN != NaN: one key for every NaN split
        bitset,
        int(t.bits_offset[node]),
        count,
    )


def h2o_layout(t: TreeTable, dom_len: np.ndarray, version: int) -> PerfectLayout:
    """The padded layout of a checked H2O node table (``version``: 0, 1, 2 as the kernel's params).

    Feature slots come from the features (families NaN -> -inf and NaN -> +inf); decision slots
    (family "none") have as source ``n_features + node``, the node whose decision they hold.
    """
    n_nodes, n_features = len(t.kind), len(dom_len)
    kind = t.kind.astype(np.int64)
    column = t.column.astype(np.int64)
    split = t.split
    inner = kind != LEAF
    if n_features:  # a leaf's column is 0, an inner node's a feature (the table was checked)
        numeric_column = (dom_len[np.clip(column, 0, n_features - 1)] < 0) | (version < 2)
    else:
        numeric_column = np.zeros(n_nodes, dtype=bool)
    plain = inner & (kind == NUMERIC) & numeric_column & ~np.isnan(split) & (split != -np.inf)
    nodes = np.zeros((n_nodes, 6), dtype=np.int64)
    nodes[:, codes.LEFT] = np.where(inner, t.left, -1)
    nodes[:, codes.RIGHT] = np.where(inner, t.right, -1)
    nodes[:, codes.FEATURE] = np.where(plain, column, 0)
    nodes[:, codes.FLAGS] = np.where(plain & t.na_left, codes.DEFAULT_LEFT, 0)
    with np.errstate(invalid="ignore"):
        thresholds = np.where(plain, np.nextafter(split, -np.inf), 0.5)
    representative: dict[tuple[object, ...], int] = {}
    for node in np.flatnonzero(inner & ~plain).tolist():
        rep = representative.setdefault(_decision_key(t, node), node)
        nodes[node, codes.FEATURE] = n_features + rep
        nodes[node, codes.FLAGS] = codes.MISSING_NONE << codes.MISSING_SHIFT
    return perfect_layout(nodes, thresholds, t.roots, n_features + n_nodes, codes.LE)


__all__ = ["h2o_layout"]
