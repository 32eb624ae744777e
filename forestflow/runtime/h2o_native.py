"""Native scoring of H2O GBM and DRF MOJOs: genmodel's ``score0`` in C, no Java.

:class:`NativeTreeScorer` takes the model :mod:`h2o_tree_reader` parsed, flattens its trees into
arrays once, and scores a batch of encoded rows (the same matrix the JVM path builds:
categoricals as level indices, NA as NaN) in one call to the C kernel (``_h2o_trees.c``): every
tree walked for every row, then genmodel's ``unifyPreds`` (link functions, DRF averaging, class
rescaling, balance-classes correction, the label). The result is exactly ``score0``'s
``(n, preds_size)`` array: the trees are summed in genmodel's order, float32 leaves widened to
double as Java does, so the sums match bit for bit; link functions use the C library's ``exp``
where Java uses ``Math.exp`` (within an ulp). Multinomial ties are broken here, as genmodel does.
Trees of depth <= 8 are walked in the padded layout of :mod:`h2o_padded` (branch-free, the same
leaves), deeper ones in the node table.

Why a C extension of our own rather than numba: numba and llvmlite cost ~100 MiB of memory in
every gateway process that imports them (the issue's budget for five models was 100 MB in all)
and up to seconds to load or compile the kernel; this kernel is ~20 KiB, built with the package
(setup.py), and releases the GIL while it scores, so two scoring threads run at once.
"""

from __future__ import annotations

import math
import time

import numpy as np

from forestflow.runtime import _h2o_trees
from forestflow.runtime.h2o_padded import h2o_layout
from forestflow.runtime.h2o_tree_reader import LINKS, TreeModel, TreeTable

#: Batches from this many rows walk the padded layout: below, its fixed cost per call (its arrays read
#: and checked) is more than the node-table walk's mispredicted branches (callgrind, the prostate GBM).
PADDED_FROM_ROWS = 16

# Slots of the packed parameters (_h2o_trees.c reads them in this order).
_GBM, _DRF = 0, 1
_FAMILY_BINOMIAL, _FAMILY_MULTINOMIAL, _FAMILY_REGRESSION = 0, 1, 2


class _JavaRandom:
    """``java.util.Random``'s generator, for genmodel's tie-breaking (seeded from the row)."""

    _MASK = (1 << 48) - 1

    def __init__(self, seed: int) -> None:
        self._seed = (seed ^ 0x5DEECE66D) & self._MASK

    def _next(self, bits: int) -> int:
        self._seed = (self._seed * 0x5DEECE66D + 0xB) & self._MASK
        value = self._seed >> (48 - bits)
        return value - (1 << bits) if bits == 32 and value >= 1 << 31 else value

    def next_double(self) -> float:
        return ((self._next(26) << 27) + self._next(27)) * 2.0**-53


def _java_long(x: int) -> int:
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


def break_tie(p: np.ndarray, row: np.ndarray, prior: list[float] | None) -> int:
    """genmodel's ``getPredictionMultinomial``: the label index, ties broken from a hash of the row."""
    # genmodel's list of tied classes is never cleared when a new best appears; its count is.
    ties, best, tie_count = [0], 1, 0
    for c in range(2, len(p)):
        if p[best] < p[c]:
            best, tie_count = c, 0
        elif p[best] == p[c]:
            tie_count += 1
            ties.append(c - 1)
    if tie_count == 0:
        return best - 1
    h = 0
    for bits in row.astype(np.float64).view(np.int64).tolist():
        h ^= bits >> 6
    h = _java_long(h)
    if prior is not None:
        total = 0.0
        for i in ties:
            total += prior[i]
        tie = _JavaRandom(h).next_double()
        partial = 0.0
        for i in ties:
            partial += prior[i] / total
            if tie <= partial:
                return i
    res = p[best]
    as_int = ((h & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000  # Java's (int) of a long
    idx = int(math.fmod(as_int, tie_count + 1))  # Java's % keeps the dividend's sign
    for b in range(1, len(p)):
        if res == p[b]:
            idx -= 1
            if idx < 0:
                return b - 1
    raise RuntimeError("no tied class found")


def node_table(t: TreeTable) -> np.ndarray:
    """The int32 node table the C kernel reads (one row per node, its columns in _h2o_trees.c's order)."""
    columns = [t.kind, t.column, t.na_left, t.left, t.right, t.bits_start, t.bits_offset, t.bits_count]
    return np.ascontiguousarray(np.stack([c.astype(np.int32) for c in columns], axis=1), dtype=np.int32)


class NativeTreeScorer:
    """Scores encoded rows for one GBM/DRF model exactly as genmodel's ``score0`` does."""

    def __init__(self, model: TreeModel) -> None:
        self.model = model
        t = model.trees
        self._nodes = node_table(t)
        self._values, self._bits, self._roots, self._target = t.split, t.bits, t.roots, t.target
        features = model.domains[: model.n_features]
        self._dom_len = np.array([-1 if d is None else len(d) for d in features], dtype=np.int64)
        if model.algo == "gbm":
            family = (
                _FAMILY_BINOMIAL
                if model.distribution in ("bernoulli", "quasibinomial", "modified_huber")
                else _FAMILY_MULTINOMIAL
                if model.distribution == "multinomial"
                else _FAMILY_REGRESSION
            )
        else:
            family = _FAMILY_REGRESSION if model.n_classes == 1 else _FAMILY_MULTINOMIAL
        version = 0 if model.mojo_version == 1.0 else (1 if model.mojo_version == 1.1 else 2)
        self._params = np.array(
            [
                _GBM if model.algo == "gbm" else _DRF,
                family,
                LINKS.index(model.link) if model.link else 0,
                model.init_f,
                model.n_classes,
                model.n_tree_groups,
                model.binomial_double_trees,
                model.balance_classes,
                model.default_threshold,
                version,
            ],
            dtype=np.float64,
        )
        width = model.preds_size
        self._prior = np.array(model.prior_class_distrib or [0.0] * max(width - 1, 1), dtype=np.float64)
        self._model_distrib = np.array(model.model_class_distrib or [0.0] * max(width - 1, 1), dtype=np.float64)
        self.preds_size = width
        self.n_features = model.n_features
        _h2o_trees.check_tables(self._nodes, self._values, self._bits, self._roots, self._target, self.n_features, width)
        #: The padded trees.
        self.layout = h2o_layout(t, self._dom_len, version)
        self._tables, self._layout_error = self._checked_tables(width)

    def _checked_tables(self, width: int) -> tuple[_h2o_trees.Tables, str | None]:
        """The C kernel's tables, held read-only and checked once (``_h2o_trees.tables``) rather than by
        every call (a walk over the node table and a buffer per array), and the error of a layout the
        check refuses (then every padded call fails with it, as it did when each call checked it)."""
        self._values, self._bits, self._roots, self._target = (
            np.array(a) for a in (self._values, self._bits, self._roots, self._target)
        )  # copies: the tree model's own arrays stay writable
        arrays = (
            self._nodes, self._values, self._bits, self._roots, self._target,
            self._dom_len, self._params, self._prior, self._model_distrib,
        )  # fmt: skip
        for array in (*arrays, *self.layout.tables):
            array.flags.writeable = False
        try:
            return _h2o_trees.tables(*arrays, width, self.layout.tables), None
        except ValueError as error:
            return _h2o_trees.tables(*arrays, width), str(error).replace("tables():", "score():", 1)

    def score(self, X: np.ndarray, offsets: np.ndarray | None = None, padded: bool = True) -> np.ndarray:
        """``score0`` of every row of ``X`` (``n x n_features``, NaN = NA): ``(n, preds_size)``;
        ``padded=False`` walks every tree in the node table (the same numbers, as below PADDED_FROM_ROWS)."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        n = X.shape[0]
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"expected rows of {self.n_features} features, got shape {X.shape}")
        offs = np.zeros(n) if offsets is None else np.ascontiguousarray(offsets, dtype=np.float64)
        preds = np.zeros((n, self.preds_size))
        ties = np.zeros(n, dtype=np.uint8)
        padded = padded and n >= PADDED_FROM_ROWS
        if padded and self._layout_error is not None:
            raise ValueError(self._layout_error)
        _h2o_trees.score_tables(self._tables, X, offs, preds, ties, padded)
        if self.preds_size > 3 and ties.any():
            prior = self.model.prior_class_distrib
            for i in np.flatnonzero(ties).tolist():
                preds[i, 0] = break_tie(preds[i], X[i], prior)
        return preds

    def decisions(self, X: np.ndarray) -> np.ndarray:
        """uint8 ``(n, nodes)``: 1 where ``score`` sends the row right at a split (TreeSHAP's input)."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"expected rows of {self.n_features} features, got shape {X.shape}")
        out = np.empty((X.shape[0], len(self._nodes)), dtype=np.uint8)
        _h2o_trees.decisions(X, self._nodes, self._values, self._bits, self._dom_len, self._params, out)
        return out

    def warm(self) -> float:
        """Score two rows (numbers and NAs) once, touching every table; returns the seconds it took."""
        start = time.perf_counter()
        X = np.full((2, self.n_features), np.nan)
        X[0] = 0.0
        self.score(X)
        return time.perf_counter() - start


__all__ = ["NativeTreeScorer", "break_tie", "node_table"]
