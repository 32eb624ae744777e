"""H2O GBM and DRF trees as a :class:`ShapForest`: what exact TreeSHAP needs beyond the scorer's tables.

TreeSHAP weighs the two sides of a split by the training weight that reached them. H2O keeps those
node weights beside each tree, in ``trees/tCC_GGG_aux.bin``: one 40-byte little-endian record per
split node (node id, a reserved int, the float32 weights of the left and right child, their
predictions and squared errors, then the int ids of the left and right child). The root is node 0,
its weight the sum of its children's. genmodel's contributions read the same records.

The margin explained is the one the model links to its prediction: for GBM the trees' sum plus
``init_f`` (log-odds for binomial, the link's scale for regression, one set per class for
multinomial); for DRF the trees' average (regression: the prediction; binomial: the probability of
the second class, as ``1 - mean(trees)``; multinomial and binomial with double trees: each class's
average vote before the votes are normalised). An offset column is not part of the explanation.
"""

from __future__ import annotations

import numpy as np

from forestflow.runtime.h2o_tree_reader import LEAF, TreeModel
from forestflow.runtime.treeshap import ShapForest

#: One aux record: node id, reserved, weightL, weightR, predL, predR, sqErrL, sqErrR, nidL, nidR.
_AUX = np.dtype(
    [
        ("nid", "<i4"),
        ("reserved", "<i4"),
        ("weight_left", "<f4"),
        ("weight_right", "<f4"),
        ("pred_left", "<f4"),
        ("pred_right", "<f4"),
        ("sqerr_left", "<f4"),
        ("sqerr_right", "<f4"),
        ("nid_left", "<i4"),
        ("nid_right", "<i4"),
    ]
)


class NotExplainable(Exception):
    """The model's trees cannot be explained exactly; the message says why."""


def node_covers(model: TreeModel) -> np.ndarray:
    """The training weight reaching every node of ``model.trees`` (float64, one per node)."""
    t = model.trees
    cover = np.zeros(len(t.kind))
    if len(model.aux) != len(t.roots):
        raise NotExplainable("the MOJO's trees have no node weights (trees/*_aux.bin)")
    for root, blob in zip(t.roots.tolist(), model.aux):
        if t.kind[root] == LEAF:  # a tree that is one leaf: all of its weight is there
            cover[root] = 1.0
            continue
        if blob is None:
            raise NotExplainable("a tree of the MOJO has no node weights (trees/*_aux.bin)")
        if len(blob) % _AUX.itemsize:
            raise NotExplainable(f"node weights of {len(blob)} bytes: not a whole number of {_AUX.itemsize}-byte records")
        records = np.frombuffer(blob, dtype=_AUX)
        by_id = {int(nid): i for i, nid in enumerate(records["nid"].tolist())}
        stack = [(root, 0)]
        first = True
        while stack:
            node, nid = stack.pop()
            if t.kind[node] == LEAF:
                continue
            i = by_id.get(nid)
            if i is None:
                raise NotExplainable(f"a tree's node weights have no record for node {nid}")
            rec = records[i]
            wl, wr = float(rec["weight_left"]), float(rec["weight_right"])
            if first:  # the root's weight is its children's (in float32, as genmodel adds them)
                cover[node] = float(np.float32(wl) + np.float32(wr))
                first = False
            cover[t.left[node]], cover[t.right[node]] = wl, wr
            stack.append((int(t.right[node]), int(rec["nid_right"])))
            stack.append((int(t.left[node]), int(rec["nid_left"])))
    return cover


def shap_forest(model: TreeModel) -> ShapForest:
    """The model's trees as TreeSHAP reads them (covers from the aux files, values in margin space)."""
    t = model.trees
    leaf = t.kind == LEAF
    value = np.where(leaf, t.split, 0.0)
    target = t.target
    base = 0.0
    if model.algo == "gbm":
        if model.distribution == "multinomial" and model.n_classes == 2:
            raise NotExplainable("a two-class GBM with the multinomial distribution is not explained")
        base = model.init_f
    else:  # DRF: the trees are averaged
        value = value / model.n_tree_groups
        if model.category == "Binomial" and not model.binomial_double_trees:
            value, base = -value, 1.0  # the trees vote for the first class: explain the second's probability
    group = np.where(target > 0, target - 1, 0).astype(np.int32)
    n_groups = int(group.max()) + 1 if len(group) else 1
    if model.category == "Multinomial" or (model.algo == "drf" and model.binomial_double_trees):
        n_groups = model.n_classes
    return ShapForest(
        left=np.where(leaf, -1, t.left),
        right=np.where(leaf, -1, t.right),
        feature=np.where(leaf, -1, t.column),
        cover=node_covers(model),
        value=value,
        roots=t.roots,
        group=group,
        n_groups=n_groups,
        feature_names=model.columns[: model.n_features],
        base_margin=np.full(n_groups, base),
    )


__all__ = ["NotExplainable", "node_covers", "shap_forest"]
