"""The flattened in-memory form of a tree ensemble, its checks, and the calls into the C kernel.

A :class:`Forest` is one node table for all the trees of a model (``_forest.c`` explains the
layout). Readers build it with :class:`ForestBuilder`, one tree at a time, from the arrays of
the model file: every tree is checked as it is added (sizes, node references in range, every
node reached once from the root: no cycle, no shared subtree, features and bitsets in range),
with a message naming the model file's field; then the C kernel checks the whole table again
before it ever walks it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from forestflow.runtime import _forest
from forestflow.runtime.trees.codes import CAT_START, CAT_WORDS, FEATURE, FLAGS, IDENTITY, LEFT, RIGHT
from forestflow.runtime.trees.perfect import PerfectLayout, perfect_layout

#: The kernel keeps at most this many output groups per row.
MAX_GROUPS = 64


class ModelFileError(ValueError):
    """A model file that is malformed, truncated or not supported; the message names the field."""


@dataclass(frozen=True)
class Forest:
    """One model's trees in flat arrays, the rules to walk them and how sums become outputs."""

    nodes: np.ndarray  # int32 [n_nodes, 6]: feature, left, right, flags, cat_start, cat_words (left = -1 at a leaf)
    thresholds: np.ndarray  # float64 [n_nodes]
    leaves: np.ndarray  # float64 [n_nodes, leaf_width]: what a leaf adds to groups group..group+width-1
    cats: np.ndarray  # uint32 bitset words of every categorical node
    roots: np.ndarray  # int32 [n_trees]
    groups: np.ndarray  # int32 [n_trees]: the first output group each tree adds to
    weights: np.ndarray  # float64 [n_trees]: tree weights (DART), used when ``weighted``
    cover: np.ndarray  # float64 [n_nodes]: training weight reaching each node (for explanations)
    base: np.ndarray  # float64 [n_groups]: where the sums start (a margin)
    n_features: int
    compare: int
    float32_sum: bool = False
    link: int = IDENTITY
    scale: float = 1.0
    divisor: float = 1.0
    weighted: bool = False
    params: np.ndarray = field(init=False, repr=False)
    #: The padded perfect trees score() walks (perfect.py).
    layout: PerfectLayout = field(init=False, repr=False)

    def __post_init__(self) -> None:
        params = np.array(
            [
                self.compare,
                float(self.float32_sum),
                self.link,
                self.scale,
                self.divisor,
                float(self.weighted),
                self.n_features,
                self.n_groups,
            ],
            dtype=np.float64,
        )
        object.__setattr__(self, "params", params)
        if not 1 <= self.n_groups <= MAX_GROUPS:
            raise ModelFileError(f"{self.n_groups} output groups: at most {MAX_GROUPS} are scored")
        try:
            _forest.check(*self.tables, self.n_features, self.n_groups)
        except (ValueError, TypeError) as exc:
            raise ModelFileError(str(exc)) from None
        layout = perfect_layout(self.nodes, self.thresholds, self.roots, self.n_features, self.compare)
        _forest.check_layout(*self.tables, *layout.tables, self.n_features, self.compare)
        object.__setattr__(self, "layout", layout)

    @property
    def n_groups(self) -> int:
        """Outputs per row before the label: one per class (or one for binary and regression)."""
        return int(len(self.base))

    @property
    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The arrays every kernel call takes, in its order."""
        return (self.nodes, self.thresholds, self.leaves, self.cats, self.roots, self.groups, self.weights)

    def score(self, X: np.ndarray, padded: bool = True) -> np.ndarray:
        """Linked outputs ``(rows, n_groups)`` of the rows of ``X`` (float64, NaN = missing); ``padded``
        False walks every tree in the node table (the same outputs, bit for bit; for tests and benchmarks)."""
        out = np.empty((X.shape[0], self.n_groups))
        if padded:
            _forest.score(X, *self.tables, self.params, self.base, out, self.layout.tables)
        else:
            _forest.score(X, *self.tables, self.params, self.base, out)
        return out

    def decisions(self, X: np.ndarray) -> np.ndarray:
        """uint8 ``(rows, n_nodes)``: 1 where the row goes right at an internal node."""
        out = np.empty((X.shape[0], len(self.nodes)), dtype=np.uint8)
        _forest.decisions(X, *self.tables, self.params, out)
        return out


def check_tree(where: str, left: np.ndarray, right: np.ndarray, feature: np.ndarray, n_features: int) -> None:
    """Raise ModelFileError unless the tree is well formed (``left == -1`` marks a leaf)."""
    n = len(left)
    if n == 0:
        raise ModelFileError(f"{where}: a tree without nodes")
    if len(right) != n or len(feature) != n:
        raise ModelFileError(f"{where}: the node arrays differ in length")
    inner = left >= 0
    bad = np.flatnonzero(((left < -1) | (left >= n)) | (inner & ((right < 0) | (right >= n))))
    if len(bad):
        raise ModelFileError(f"{where}: node {int(bad[0])} has a child out of range")
    bad = np.flatnonzero(inner & ((feature < 0) | (feature >= n_features)))
    if len(bad):
        raise ModelFileError(
            f"{where}: node {int(bad[0])} splits on feature {int(feature[bad[0]])}, but the model has {n_features} features"
        )
    # Every node reached exactly once from the root: no cycle, no shared subtree, no stray node.
    seen = np.zeros(n, dtype=bool)
    stack = [0]
    lefts, rights = left.tolist(), right.tolist()
    while stack:
        k = stack.pop()
        if seen[k]:
            raise ModelFileError(f"{where}: node {k} is reached twice (a cycle or a shared subtree)")
        seen[k] = True
        if lefts[k] >= 0:
            stack.append(lefts[k])
            stack.append(rights[k])
    if not seen.all():
        raise ModelFileError(f"{where}: node {int(np.flatnonzero(~seen)[0])} is not reached from the root")


def bitset(categories: Sequence[int], where: str) -> list[int]:
    """The uint32 words of a set of non-negative category codes (bit c of word c // 32)."""
    if not len(categories):
        return []
    top = max(categories)
    if min(categories) < 0 or top >= 1 << 24:
        raise ModelFileError(f"{where}: category codes must be in [0, 2^24)")
    words = [0] * (top // 32 + 1)
    for c in categories:
        words[c >> 5] |= 1 << (c & 31)
    return words


class ForestBuilder:
    """Collects checked trees, then builds the :class:`Forest`."""

    def __init__(self, n_features: int, leaf_width: int = 1) -> None:
        if n_features < 1:
            raise ModelFileError("the model has no features")
        self.n_features = n_features
        self.leaf_width = leaf_width
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._cats: list[int] = []
        self._roots: list[int] = []
        self._groups: list[int] = []
        self._weights: list[float] = []
        self._n_nodes = 0

    def add_tree(
        self,
        where: str,
        *,
        left: np.ndarray,
        right: np.ndarray,
        feature: np.ndarray,
        flags: np.ndarray,
        thresholds: np.ndarray,
        leaves: np.ndarray,
        cover: np.ndarray,
        group: int,
        weight: float = 1.0,
        cat_sets: dict[int, list[int]] | None = None,
    ) -> None:
        """One tree: node arrays (children relative to the tree, -1 at leaves); categorical node -> codes."""
        left = np.asarray(left, dtype=np.int64)
        right = np.asarray(right, dtype=np.int64)
        feature = np.asarray(feature, dtype=np.int64)
        check_tree(where, left, right, feature, self.n_features)
        n = len(left)
        leaves = np.asarray(leaves, dtype=np.float64).reshape(n, self.leaf_width)
        for name, arr in (("thresholds", thresholds), ("cover", cover), ("flags", flags)):
            if len(arr) != n:
                raise ModelFileError(f"{where}: {name} has {len(arr)} entries for {n} nodes")
        table = np.zeros((n, 6), dtype=np.int64)
        offset = self._n_nodes
        inner = left >= 0
        table[:, FEATURE] = np.where(inner, feature, -1)
        table[:, LEFT] = np.where(inner, left + offset, -1)
        table[:, RIGHT] = np.where(inner, right + offset, -1)
        table[:, FLAGS] = flags
        for node, codes in (cat_sets or {}).items():
            if not 0 <= node < n or not inner[node]:
                raise ModelFileError(f"{where}: categories given for node {node}, which is not a split")
            words = bitset(codes, f"{where} node {node}")
            table[node, CAT_START] = len(self._cats)
            table[node, CAT_WORDS] = len(words)
            self._cats.extend(words)
        if len(self._cats) >= 1 << 31 or offset + n >= 1 << 31:
            raise ModelFileError(f"{where}: the model is too large")
        self._parts.append((table, np.asarray(thresholds, dtype=np.float64), leaves, np.asarray(cover, dtype=np.float64)))
        self._roots.append(offset)
        self._groups.append(group)
        self._weights.append(weight)
        self._n_nodes += n

    def build(self, base: Sequence[float], compare: int, **options: object) -> Forest:
        """The forest of the trees added so far (``options``: Forest's link, sums and averaging)."""
        if not self._parts:
            raise ModelFileError("the model has no trees")
        return Forest(
            nodes=np.ascontiguousarray(np.concatenate([p[0] for p in self._parts]), dtype=np.int32),
            thresholds=np.ascontiguousarray(np.concatenate([p[1] for p in self._parts])),
            leaves=np.ascontiguousarray(np.concatenate([p[2] for p in self._parts])),
            cats=np.array(self._cats, dtype=np.uint32),
            roots=np.array(self._roots, dtype=np.int32),
            groups=np.array(self._groups, dtype=np.int32),
            weights=np.array(self._weights, dtype=np.float64),
            cover=np.concatenate([p[3] for p in self._parts]),
            base=np.array(base, dtype=np.float64),
            n_features=self.n_features,
            compare=compare,
            **options,  # type: ignore[arg-type]  # Forest's keyword options, passed through
        )
