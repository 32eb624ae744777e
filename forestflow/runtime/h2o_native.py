"""Native scoring of H2O GBM and DRF MOJOs: genmodel's ``score0``, compiled with numba, no Java.

:class:`NativeTreeScorer` takes the model :mod:`h2o_tree_reader` parsed and scores a batch of
encoded rows (the same matrix the JVM path builds: categoricals as level indices, NA as NaN)
in one compiled call: every tree walked for every row, then genmodel's ``unifyPreds`` (link
functions, DRF averaging, class rescaling, balance-classes correction, the label). The result
is exactly ``score0``'s ``(n, preds_size)`` array: the trees are summed in genmodel's order,
float32 leaves widened to double as Java does, so the sums match bit for bit; link functions
use the C library's ``exp`` where Java uses ``Math.exp`` (within an ulp).

Why numba: it compiles these loops to machine code with no C toolchain at install time, caches
the machine code on disk (``cache=True``) and releases the GIL (``nogil=True``), so two scoring
threads run at once as they did through JPype.
"""

from __future__ import annotations

import math
import time

import numpy as np
from numba import njit

from forestflow.runtime.h2o_tree_reader import LEAF, LINKS, NA_VS_REST, NUMERIC, TreeModel

# Columns of the packed integer node table.
_KIND, _COL, _NA_LEFT, _LEFT, _RIGHT, _BSTART, _BOFF, _BCOUNT = range(8)
# Slots of the packed parameters.
_P_ALGO, _P_FAMILY, _P_LINK, _P_INIT_F, _P_NCLASSES, _P_GROUPS, _P_BDT, _P_BALANCE, _P_THRESHOLD, _P_VERSION = range(10)
_GBM, _DRF = 0, 1
_FAMILY_BINOMIAL, _FAMILY_MULTINOMIAL, _FAMILY_REGRESSION = 0, 1, 2
_INT_MAX, _INT_MIN = 2147483647, -2147483648


@njit(cache=True, nogil=True, inline="always")
def _java_int(d: float) -> int:
    """Java's ``(int) d`` for a non-NaN double: truncation, saturated to the int range."""
    if d >= _INT_MAX:
        return _INT_MAX
    if d <= _INT_MIN:
        return _INT_MIN
    return int(d)


@njit(cache=True, nogil=True, inline="always")
def _tree_value(x, node, nodes, values, bits, dom_len, version):  # type: ignore[no-untyped-def]
    """One tree's leaf value for one row, following genmodel's ``scoreTree`` decisions."""
    while True:
        kind = nodes[node, _KIND]
        if kind == LEAF:
            return values[node]
        col = nodes[node, _COL]
        d = x[col]
        n_levels = dom_len[col]
        if math.isnan(d):
            right = nodes[node, _NA_LEFT] == 0
        elif kind == NUMERIC and (n_levels < 0 or version < 2):  # the common case: a number against a threshold
            right = d >= values[node]
        else:
            di = _java_int(d)
            outside = False
            start = nodes[node, _BSTART]
            if version >= 1 and start >= 0:  # a level outside the bitset in effect counts as NA
                rel = di - nodes[node, _BOFF]
                outside = rel < 0 or rel >= nodes[node, _BCOUNT]
            if version >= 2 and n_levels >= 0 and n_levels <= di:  # so does a level past the column's domain
                outside = True
            if outside:
                right = nodes[node, _NA_LEFT] == 0
            elif kind == NA_VS_REST:
                right = False
            elif kind == NUMERIC:
                right = d >= values[node]
            else:  # BITSET: levels in the set go right
                rel = di - nodes[node, _BOFF]
                if rel < 0 or rel >= nodes[node, _BCOUNT]:
                    right = False  # MOJO 1.00 (contains0): outside the set
                else:
                    right = (bits[start + (rel >> 3)] & (1 << (rel & 7))) != 0
        node = nodes[node, _RIGHT] if right else nodes[node, _LEFT]


@njit(cache=True, nogil=True)
def _sexp(x):  # type: ignore[no-untyped-def]
    """genmodel's sanitized ``exp``: capped at 1e19."""
    return min(1e19, math.exp(x))


@njit(cache=True, nogil=True)
def _link_inv(link, f):  # type: ignore[no-untyped-def]
    if link == 1:  # log
        return _sexp(f)
    if link == 2:  # logit
        return 1.0 / (1.0 + _sexp(-f))
    if link == 3:  # inverse (genmodel clamps with -1e-5 on both sides)
        xx = min(-1e-5, f) if f < 0 else max(-1e-5, f)
        return 1.0 / xx
    return f  # identity


@njit(cache=True, nogil=True)
def _score(X, offsets, nodes, values, bits, roots, target, dom_len, params, prior, model_distrib, preds, ties):  # type: ignore[no-untyped-def]
    """``score0`` of every row of ``X`` into ``preds`` (zeroed); ``ties[i]`` = 1 where a tie needs breaking."""
    algo = int(params[_P_ALGO])
    family = int(params[_P_FAMILY])
    link = int(params[_P_LINK])
    init_f = params[_P_INIT_F]
    nclasses = int(params[_P_NCLASSES])
    groups = params[_P_GROUPS]
    bdt = params[_P_BDT] != 0
    balance = params[_P_BALANCE] != 0
    threshold = params[_P_THRESHOLD]
    version = int(params[_P_VERSION])
    width = preds.shape[1]
    for i in range(X.shape[0]):
        x = X[i]
        p = preds[i]
        for t in range(roots.shape[0]):  # genmodel's order: class by class, groups in order
            p[target[t]] += _tree_value(x, roots[t], nodes, values, bits, dom_len, version)
        offset = offsets[i]
        if algo == _GBM:
            if family == _FAMILY_BINOMIAL:
                p[2] = _link_inv(link, p[1] + init_f + offset)
                p[1] = 1.0 - p[2]
            elif family == _FAMILY_MULTINOMIAL:
                if nclasses == 2:
                    p[1] += init_f + offset
                    p[2] = -p[1]
                maxval = -np.inf
                for k in range(1, width):
                    maxval = max(maxval, p[k])
                dsum = 0.0
                for k in range(1, width):
                    p[k] = math.exp(p[k] - maxval)
                    dsum += p[k]
                for k in range(1, width):
                    p[k] /= dsum
            else:
                p[0] = _link_inv(link, p[0] + init_f + offset)
                continue
        else:
            if nclasses == 1:
                p[0] /= groups
                continue
            if nclasses == 2 and not bdt:
                p[1] /= groups
                p[2] = 1.0 - p[1]
            else:
                total = 0.0
                for k in range(1, nclasses + 1):
                    total += p[k]
                if total > 0:
                    for k in range(1, nclasses + 1):
                        p[k] /= total
        if balance:
            probsum = 0.0
            for c in range(1, width):
                if prior[c - 1] != 0 and model_distrib[c - 1] != 0:
                    p[c] *= prior[c - 1] / model_distrib[c - 1]
                probsum += p[c]
            if probsum > 0:
                for c in range(1, width):
                    p[c] /= probsum
        if width == 3:
            p[0] = 1.0 if p[2] >= threshold else 0.0
        else:
            best, tied = 1, False
            for c in range(2, width):
                if p[best] < p[c]:
                    best, tied = c, False
                elif p[best] == p[c]:
                    tied = True
            p[0] = best - 1
            ties[i] = 1 if tied else 0


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


class NativeTreeScorer:
    """Scores encoded rows for one GBM/DRF model exactly as genmodel's ``score0`` does."""

    def __init__(self, model: TreeModel) -> None:
        self.model = model
        t = model.trees
        self._nodes = np.ascontiguousarray(np.stack(
            [t.kind.astype(np.int32), t.column, t.na_left.astype(np.int32), t.left, t.right,
             t.bits_start, t.bits_offset, t.bits_count], axis=1), dtype=np.int32)
        self._values, self._bits, self._roots, self._target = t.split, t.bits, t.roots, t.target
        features = model.domains[: model.n_features]
        self._dom_len = np.array([-1 if d is None else len(d) for d in features], dtype=np.int64)
        if model.algo == "gbm":
            family = (_FAMILY_BINOMIAL if model.distribution in ("bernoulli", "quasibinomial", "modified_huber")
                      else _FAMILY_MULTINOMIAL if model.distribution == "multinomial" else _FAMILY_REGRESSION)
        else:
            family = _FAMILY_REGRESSION if model.n_classes == 1 else _FAMILY_MULTINOMIAL
        version = 0 if model.mojo_version == 1.0 else (1 if model.mojo_version == 1.1 else 2)
        self._params = np.array([
            _GBM if model.algo == "gbm" else _DRF, family, LINKS.index(model.link) if model.link else 0,
            model.init_f, model.n_classes, model.n_tree_groups, model.binomial_double_trees,
            model.balance_classes, model.default_threshold, version,
        ], dtype=np.float64)
        width = model.preds_size
        self._prior = np.array(model.prior_class_distrib or [0.0] * max(width - 1, 1), dtype=np.float64)
        self._model_distrib = np.array(model.model_class_distrib or [0.0] * max(width - 1, 1), dtype=np.float64)
        self.preds_size = width
        self.n_features = model.n_features
        self.load_seconds = 0.0

    def score(self, X: np.ndarray, offsets: np.ndarray | None = None) -> np.ndarray:
        """``score0`` of every row of ``X`` (``n x n_features``, NaN = NA): ``(n, preds_size)``."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        n = X.shape[0]
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"expected rows of {self.n_features} features, got shape {X.shape}")
        offs = np.zeros(n) if offsets is None else np.ascontiguousarray(offsets, dtype=np.float64)
        preds = np.zeros((n, self.preds_size))
        ties = np.zeros(n, dtype=np.uint8)
        _score(X, offs, self._nodes, self._values, self._bits, self._roots, self._target, self._dom_len,
               self._params, self._prior, self._model_distrib, preds, ties)
        if self.preds_size > 3 and ties.any():
            prior = self.model.prior_class_distrib
            for i in np.flatnonzero(ties).tolist():
                preds[i, 0] = break_tie(preds[i], X[i], prior)
        return preds

    def warm(self) -> float:
        """Compile (or load from numba's cache) and run the kernel once; returns the seconds it took."""
        start = time.perf_counter()
        X = np.full((2, self.n_features), np.nan)
        X[0] = 0.0
        self.score(X)
        return time.perf_counter() - start


__all__ = ["NativeTreeScorer", "break_tie"]
