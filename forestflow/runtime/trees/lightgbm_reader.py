"""LightGBM models (the text format ``Booster.save_model`` writes) read into a :class:`Forest`.

Our own reader rather than treelite's: the text format is a header of ``key=value`` lines, then one
block of space-separated arrays per tree, which is as short to read as treelite's model is to
convert, and it keeps scipy out of the core install and the raw arrays in our hands.

Scoring rules (LightGBM's ``Tree::Decision``): numeric nodes send a row left when ``x <= threshold``
in double; NaN reads as 0 unless the node's missing type is NaN; a missing value (NaN, or |x| <= 1e-35
for the "zero" type) follows the default direction. A categorical node looks the integer value up in
its bitset: in the set goes left; negative values go right. Trees of each class interleave per
iteration; a random forest (``average_output``) averages over iterations; then the objective's link.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from forestflow.runtime.trees.codes import (
    CATEGORICAL,
    DEFAULT_LEFT,
    EXP,
    IDENTITY,
    IN_SET_LEFT,
    LE,
    MISSING_NAN,
    MISSING_NONE,
    MISSING_SHIFT,
    MISSING_ZERO,
    SIGMOID,
    SOFTMAX,
)
from forestflow.runtime.trees.forest import ForestBuilder, ModelFileError
from forestflow.runtime.trees.model import Feature, TreeModel

_IDENTITY_OBJECTIVES = ("regression", "regression_l1", "huber", "fair", "quantile", "mape")
_EXP_OBJECTIVES = ("poisson", "gamma", "tweedie")
SUPPORTED = tuple(sorted((*_IDENTITY_OBJECTIVES, *_EXP_OBJECTIVES, "binary", "multiclass", "multiclassova", "cross_entropy")))
#: LightGBM's missing types (decision_type >> 2 & 3: none, zero, NaN) as the kernel's.
_MISSING = {0: MISSING_NONE, 1: MISSING_ZERO, 2: MISSING_NAN}
_MAX_LINE = 1 << 28


def _blocks(text: str) -> tuple[dict[str, str], list[tuple[int, dict[str, str]]], str | None]:
    """The header's ``key=value`` lines, each ``Tree=i`` block's, and the pandas_categorical JSON."""
    header: dict[str, str] = {}
    trees: list[tuple[int, dict[str, str]]] = []
    current = header
    pandas: str | None = None
    ended = False
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("pandas_categorical:"):
            pandas = line[len("pandas_categorical:") :]
            continue
        if line == "end of trees":
            ended = True
            current = {}
            continue
        if ended:
            continue
        key, _, value = line.partition("=")  # a flag line ("average_output") has no value
        if key == "Tree":
            try:
                index = int(value)
            except ValueError:
                raise ModelFileError(f"Tree={value}: not a tree number") from None
            current = {}
            trees.append((index, current))
        else:
            current[key] = value
    if not ended:
        raise ModelFileError("no 'end of trees' line: the file is truncated or not a LightGBM model")
    return header, trees, pandas


def _int(block: dict[str, str], key: str, where: str, default: int | None = None) -> int:
    raw = block.get(key)
    if raw is None:
        if default is None:
            raise ModelFileError(f"{where}.{key}: missing")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ModelFileError(f"{where}.{key}: {raw!r} is not an integer") from None


def _values(block: dict[str, str], key: str, where: str, n: int, kind: type = float) -> np.ndarray:
    raw = block.get(key)
    if raw is None:
        raise ModelFileError(f"{where}.{key}: missing")
    parts = raw.split()
    if len(parts) != n:
        raise ModelFileError(f"{where}.{key}: {len(parts)} values, expected {n}")
    try:
        return np.array([kind(p) for p in parts], dtype=np.float64 if kind is float else np.int64)
    except (ValueError, OverflowError):
        raise ModelFileError(f"{where}.{key}: not a list of numbers") from None


def _objective(header: dict[str, str]) -> tuple[str, int, float, int]:
    """(objective name, link, sigmoid scale, classes) from ``objective=...``."""
    raw = header.get("objective")
    if not raw:
        raise ModelFileError("objective: missing")
    name, *options = raw.split()
    params = dict(o.split(":", 1) for o in options if ":" in o)
    if name not in SUPPORTED or "sqrt" in options:
        raise ModelFileError(f"objective: {raw!r} is not scored; supported: {', '.join(SUPPORTED)}")
    try:
        scale = float(params.get("sigmoid", "1"))
    except ValueError:
        raise ModelFileError(f"objective: bad sigmoid in {raw!r}") from None
    if name == "binary":
        return name, SIGMOID, scale, 2
    if name in ("multiclass", "multiclassova"):
        classes = _int(header, "num_class", "header")
        return name, SOFTMAX if name == "multiclass" else SIGMOID, scale if name == "multiclassova" else 1.0, classes
    if name == "cross_entropy":
        return name, SIGMOID, 1.0, 0
    return name, EXP if name in _EXP_OBJECTIVES else IDENTITY, 1.0, 0


def _codes(words: np.ndarray) -> list[int]:
    """The category codes set in a bitset of uint32 words."""
    return [w * 32 + b for w, word in enumerate(words.tolist()) for b in range(32) if (int(word) >> b) & 1]


def read_text(text: str) -> TreeModel:
    """The checked model of a LightGBM text model."""
    header, blocks, pandas = _blocks(text)
    if header.get("version", "").strip() not in ("v2", "v3", "v4"):
        raise ModelFileError(f"version: {header.get('version')!r} is not a LightGBM text model version (v2 to v4)")
    objective, link, scale, n_classes = _objective(header)
    per_iteration = _int(header, "num_tree_per_iteration", "header", 1)
    n_groups = n_classes if n_classes > 2 else 1
    if per_iteration != n_groups:
        raise ModelFileError(f"num_tree_per_iteration: {per_iteration} for {n_groups} output(s)")
    n_features = _int(header, "max_feature_idx", "header") + 1
    names = header.get("feature_names", "").split()
    infos = header.get("feature_infos", "").split()
    if len(names) != n_features or len(infos) != n_features or len(set(names)) != n_features:
        raise ModelFileError(f"feature_names/feature_infos: expected {n_features} distinct names and infos")
    categorical = [not (i.startswith("[") or i == "none") for i in infos]
    features = _features(names, categorical, pandas)
    if not blocks:
        raise ModelFileError("the model has no trees")
    averaged = "average_output" in header
    builder = ForestBuilder(n_features)
    for t, (index, tree) in enumerate(blocks):
        where = f"Tree={index}"
        if index != t:
            raise ModelFileError(f"{where}: trees out of order (expected Tree={t})")
        if _int(tree, "is_linear", where, 0):
            raise ModelFileError(f"{where}.is_linear: linear trees are not scored")
        _add_tree(builder, tree, where, t % n_groups if n_groups > 1 else 0)
    iterations = len(blocks) // per_iteration
    if len(blocks) % per_iteration:
        raise ModelFileError(f"{len(blocks)} trees for {per_iteration} per iteration")
    forest = builder.build([0.0] * n_groups, LE, link=link, scale=scale, divisor=float(iterations) if averaged else 1.0)
    classes = tuple(str(k) for k in range(n_classes)) if n_classes else None
    facts = {"library": "lightgbm", "objective": header.get("objective"), "trees": len(blocks), "averageOutput": averaged}
    return TreeModel(forest, features, classes, facts)


def _features(names: list[str], categorical: list[bool], pandas: str | None) -> list[Feature]:
    levels: list[tuple[str, ...] | None] = [None] * len(names)
    if pandas is not None and pandas.strip() not in ("null", ""):
        try:
            lists = json.loads(pandas)
        except json.JSONDecodeError:
            raise ModelFileError("pandas_categorical: not valid JSON") from None
        cat_columns = [j for j, c in enumerate(categorical) if c]
        if not isinstance(lists, list) or not all(isinstance(x, list) for x in lists):
            raise ModelFileError("pandas_categorical: expected a list of category lists")
        if len(lists) == len(cat_columns):
            for j, values in zip(cat_columns, lists):
                levels[j] = tuple(str(v) for v in values)
    return [Feature(n, c, levels[j]) for j, (n, c) in enumerate(zip(names, categorical))]


def _add_tree(builder: ForestBuilder, tree: dict[str, str], where: str, group: int) -> None:
    n_leaves = _int(tree, "num_leaves", where)
    if not 1 <= n_leaves <= 1 << 24:
        raise ModelFileError(f"{where}.num_leaves: {n_leaves} is out of range")
    leaf_values = _values(tree, "leaf_value", where, n_leaves)
    leaf_count = _values(tree, "leaf_count", where, n_leaves) if "leaf_count" in tree else np.zeros(n_leaves)
    inner = n_leaves - 1
    n = inner + n_leaves
    left = np.full(n, -1, dtype=np.int64)
    right = np.full(n, -1, dtype=np.int64)
    feature = np.full(n, -1, dtype=np.int64)
    flags = np.zeros(n, dtype=np.int64)
    thresholds = np.zeros(n)
    leaves = np.zeros(n)
    cover = np.zeros(n)
    leaves[inner:] = leaf_values
    cover[inner:] = leaf_count
    cat_sets: dict[int, list[int]] = {}
    if inner:
        feature[:inner] = _values(tree, "split_feature", where, inner, int)
        thr = _values(tree, "threshold", where, inner)
        dt = _values(tree, "decision_type", where, inner, int)
        lc = _values(tree, "left_child", where, inner, int)
        rc = _values(tree, "right_child", where, inner, int)
        if "internal_count" in tree:
            cover[:inner] = _values(tree, "internal_count", where, inner)
        # Children < 0 are leaves (~child); leaves follow the internal nodes in our table.
        for k, children in ((0, lc), (1, rc)):
            mapped = np.where(children < 0, inner + (~children), children)
            bad = (children >= inner) | (mapped >= n)
            if bad.any():
                raise ModelFileError(f"{where}.{('left_child', 'right_child')[k]}: a child is out of range")
            (left if k == 0 else right)[:inner] = mapped
        if np.any((dt < 0) | (dt > 15)):
            raise ModelFileError(f"{where}.decision_type: values out of range")
        is_cat = (dt & 1) != 0
        missing = np.vectorize(lambda m: _MISSING.get(int(m), -1))((dt >> 2) & 3)
        if np.any(missing < 0):
            raise ModelFileError(f"{where}.decision_type: unknown missing type")
        flags[:inner] = (
            np.where((dt & 2) != 0, DEFAULT_LEFT, 0) | np.where(is_cat, CATEGORICAL | IN_SET_LEFT, 0) | (missing << MISSING_SHIFT)
        )
        flags[:inner] = np.where(is_cat, flags[:inner] & ~DEFAULT_LEFT, flags[:inner])  # NaN goes right
        thresholds[:inner] = thr
        if is_cat.any():
            n_cat = _int(tree, "num_cat", where)
            bounds = _values(tree, "cat_boundaries", where, n_cat + 1, int)
            if bounds[0] != 0 or np.any(np.diff(bounds) < 0):
                raise ModelFileError(f"{where}.cat_boundaries: not increasing from 0")
            words = _values(tree, "cat_threshold", where, int(bounds[-1]), int)
            if np.any((words < 0) | (words >= 1 << 32)):
                raise ModelFileError(f"{where}.cat_threshold: not 32-bit words")
            for k in np.flatnonzero(is_cat).tolist():
                idx = thr[k]
                if not (idx.is_integer() and 0 <= idx < n_cat):
                    raise ModelFileError(f"{where}.threshold: node {k}'s category set {idx} is out of range")
                i = int(idx)
                cat_sets[k] = _codes(words[bounds[i] : bounds[i + 1]])
    if "shrinkage" in tree and not math.isfinite(_values(tree, "shrinkage", where, 1)[0]):  # one number, else refused
        raise ModelFileError(f"{where}.shrinkage: not finite")
    builder.add_tree(
        where,
        left=left,
        right=right,
        feature=feature,
        flags=flags,
        thresholds=thresholds,
        leaves=leaves,
        cover=cover,
        group=group,
        cat_sets=cat_sets,
    )


def read_file(path: Path) -> TreeModel:
    """Read and check a LightGBM text model file."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ModelFileError("not a LightGBM text model (not UTF-8 text)") from None
    if not text.startswith("tree"):
        raise ModelFileError("not a LightGBM text model (it does not start with 'tree')")
    return read_text(text)
