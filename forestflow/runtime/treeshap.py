"""Exact TreeSHAP for every tree flavor: the node table it reads and the call that explains a batch.

A tree servable that explains exactly implements :class:`TreeExplainable`: it turns a batch into its
:class:`ShapForest` (one node table for every tree of the model, built once at load) and the
``decisions`` of the batch's rows, which its own scoring kernel computes, so missing values,
categorical sets and float32 comparisons follow the format exactly. :func:`contributions` then runs
path-dependent TreeSHAP (Lundberg, Erion & Lee 2018, Algorithm 2) in C (``_treeshap.c``, the GIL
released, the whole batch in one call): one value per original input column plus the bias, in the
model's margin space, per output group; they add up to the margin the trees predict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from forestflow.core.frame import Frame
from forestflow.runtime import _treeshap


def _frozen(array: np.ndarray, dtype: type, name: str) -> np.ndarray:
    """A private, read-only, C-contiguous 1-D copy (C reads it after the check: nobody may change it)."""
    out: np.ndarray = np.array(array, dtype=dtype, order="C", copy=True)
    if out.ndim != 1:
        raise ValueError(f"ShapForest.{name} must be 1-D, got shape {out.shape}")
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class ShapForest:
    """What exact TreeSHAP reads: one node table for all trees of a model.

    Built once per model; the table is checked when it is built (every index in range, each tree a
    tree, covers and leaf values finite) and kept as private read-only copies, so the C code that
    walks it can trust it.
    """

    left: np.ndarray  # int32 [n_nodes]: node index of the left child, -1 at a leaf
    right: np.ndarray  # int32 [n_nodes]: node index of the right child, -1 at a leaf
    feature: np.ndarray  # int32 [n_nodes]: ORIGINAL input column the split reads, -1 at a leaf
    cover: np.ndarray  # float64 [n_nodes]: training weight reaching the node
    value: np.ndarray  # float64 [n_nodes]: leaf output (tree weight applied); ignored at internal nodes
    roots: np.ndarray  # int32 [n_trees]: root node of each tree
    group: np.ndarray  # int32 [n_trees]: output group the tree adds to
    n_groups: int
    feature_names: list[str]  # one per original input column, in column order
    base_margin: np.ndarray  # float64 [n_groups]: the margin constant outside the trees
    #: The deepest tree's depth (set by the check; sizes the C code's scratch path).
    depth: int = field(init=False, repr=False, compare=False, default=0)
    #: Per group, ``base_margin`` plus its trees' expected values: every row's bias (set by the check).
    bias: np.ndarray = field(init=False, repr=False, compare=False, default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        arrays = {
            "left": (self.left, np.int32),
            "right": (self.right, np.int32),
            "feature": (self.feature, np.int32),
            "cover": (self.cover, np.float64),
            "value": (self.value, np.float64),
            "roots": (self.roots, np.int32),
            "group": (self.group, np.int32),
            "base_margin": (self.base_margin, np.float64),
        }
        for name, (array, dtype) in arrays.items():
            object.__setattr__(self, name, _frozen(array, dtype, name))
        if not isinstance(self.n_groups, int) or self.n_groups < 1:
            raise ValueError(f"ShapForest.n_groups must be a positive int, got {self.n_groups!r}")
        if len(self.base_margin) != self.n_groups:
            raise ValueError(f"ShapForest.base_margin has {len(self.base_margin)} values for {self.n_groups} groups")
        object.__setattr__(self, "feature_names", [str(n) for n in self.feature_names])
        expected = np.zeros(len(self.roots))
        depth = _treeshap.check(
            self.left,
            self.right,
            self.feature,
            self.cover,
            self.value,
            self.roots,
            self.group,
            self.n_features,
            self.n_groups,
            expected,
        )
        object.__setattr__(self, "depth", int(depth))
        object.__setattr__(self, "bias", self.base_margin + np.bincount(self.group, weights=expected, minlength=self.n_groups))

    @property
    def n_features(self) -> int:
        """Original input columns (contributions per group: this many plus the bias)."""
        return len(self.feature_names)

    @property
    def n_nodes(self) -> int:
        return len(self.left)


@runtime_checkable
class TreeExplainable(Protocol):
    """A servable whose trees are explained exactly (TreeSHAP)."""

    def shap_inputs(self, frame: Frame) -> tuple[ShapForest, np.ndarray]:
        """The forest and the decisions of this batch's rows (same input checks as predict)."""
        ...


def contributions(forest: ShapForest, decisions: np.ndarray) -> np.ndarray:
    """TreeSHAP values of every row: float64 ``[rows, n_groups, n_features + 1]``, the bias last.

    ``decisions`` is uint8 ``[rows, n_nodes]``: 1 where the row goes right at an internal node.
    The bias is the trees' expected value plus ``base_margin``; each row's values of a group sum to
    the margin the trees predict for it (up to float rounding).
    """
    decisions = np.ascontiguousarray(decisions, dtype=np.uint8)
    if decisions.ndim != 2 or decisions.shape[1] != forest.n_nodes:
        raise ValueError(f"decisions must be [rows, {forest.n_nodes}], got shape {decisions.shape}")
    out = np.zeros((decisions.shape[0], forest.n_groups, forest.n_features + 1))
    out[:, :, -1] = forest.bias
    _treeshap.shap(
        forest.left,
        forest.right,
        forest.feature,
        forest.cover,
        forest.value,
        forest.roots,
        forest.group,
        forest.n_features,
        forest.depth,
        decisions,
        out,
    )
    return out


__all__ = ["ShapForest", "TreeExplainable", "contributions"]
