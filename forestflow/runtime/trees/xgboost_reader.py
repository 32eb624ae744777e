"""XGBoost models (JSON and UBJSON, as xgboost 2.x and 3.x save them) read into a :class:`Forest`.

Our own reader rather than treelite's: treelite 4.8 refuses XGBoost 3.x models that store their
category names (any model trained on pandas categoricals), pulls scipy into the core install,
and gives back its own model object, while the kernel needs the raw arrays anyway; the JSON is
plain parallel arrays and UBJSON is read by the small ``ubjson`` module.

Scoring rules (the library's CPU predictor): a row goes left when ``x < split_condition`` in
float32, a missing value to the default child, a categorical value in the node's set to the
right (an invalid category to the left); leaves are summed in float32 from the base margin in
tree order (DART trees times their ``weight_drop``), then the objective's link, in float32.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from forestflow.runtime.trees import ubjson
from forestflow.runtime.trees.codes import CATEGORICAL, DEFAULT_LEFT, EXP, IDENTITY, LT_F32, SIGMOID, SOFTMAX
from forestflow.runtime.trees.forest import ForestBuilder, ModelFileError
from forestflow.runtime.trees.model import Feature, TreeModel

#: Objectives scored, and their link: identity, sigmoid (a probability), exp (counts, gamma...).
_REGRESSION = {
    "reg:squarederror": IDENTITY,
    "reg:squaredlogerror": IDENTITY,
    "reg:pseudohubererror": IDENTITY,
    "reg:absoluteerror": IDENTITY,
    "reg:quantileerror": IDENTITY,
    "reg:linear": IDENTITY,
    "binary:logitraw": IDENTITY,
    "reg:logistic": SIGMOID,
    "count:poisson": EXP,
    "reg:gamma": EXP,
    "reg:tweedie": EXP,
}
_CLASSIFIERS = ("binary:logistic", "multi:softprob", "multi:softmax")
SUPPORTED = tuple(sorted((*_REGRESSION, *_CLASSIFIERS)))


def load(path: Path) -> dict[str, Any]:
    """The model document of a ``.json`` or ``.ubj`` file (UBJSON unless it starts like JSON)."""
    data = path.read_bytes()
    head = data.lstrip()[:2]
    # Both start with "{": JSON goes on with a key's quote (or "}"), UBJSON with a length marker.
    if head[:1] != b"{" or head[1:2] in (b'"', b"}", b" ", b"\n", b"\t", b"\r"):
        try:
            doc = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelFileError(f"not valid JSON: {exc}") from None
    else:
        try:
            doc = ubjson.loads(data)
        except ubjson.UBJSONError as exc:
            raise ModelFileError(f"not an XGBoost JSON or UBJSON model: {exc}") from None
    if not isinstance(doc, dict):
        raise ModelFileError("not an XGBoost model (the document is not an object)")
    return doc


def _obj(parent: Any, key: str, where: str) -> dict[str, Any]:
    value = parent.get(key) if isinstance(parent, dict) else None
    if not isinstance(value, dict):
        raise ModelFileError(f"{where}.{key}: missing or not an object")
    return value


def _number(text: Any, where: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise ModelFileError(f"{where}: {text!r} is not a number") from None


def _int(text: Any, where: str) -> int:
    value = _number(text, where)
    if not value.is_integer():
        raise ModelFileError(f"{where}: {text!r} is not an integer")
    return int(value)


def _array(tree: dict[str, Any], key: str, where: str, kind: str, n: int | None = None) -> np.ndarray:
    raw = tree.get(key)
    if not isinstance(raw, (list, np.ndarray)):
        raise ModelFileError(f"{where}.{key}: missing or not an array")
    try:
        arr = np.asarray(raw, dtype=np.float64 if kind == "f" else np.int64)
    except (TypeError, ValueError, OverflowError):
        raise ModelFileError(f"{where}.{key}: not an array of numbers") from None
    if arr.ndim != 1:
        raise ModelFileError(f"{where}.{key}: not a flat array")
    if kind == "i" and isinstance(raw, list) and not all(isinstance(v, (int, bool)) for v in raw):
        raise ModelFileError(f"{where}.{key}: not an array of integers")
    if n is not None and len(arr) != n:
        raise ModelFileError(f"{where}.{key}: {len(arr)} entries for {n} nodes")
    return arr


def base_scores(text: Any, where: str) -> list[float]:
    """``base_score`` as saved: a number in a string, or (3.1+) a vector ``"[5E-1,...]"``."""
    if isinstance(text, str) and text.startswith("["):
        parts = [p for p in text.strip("[]").split(",") if p.strip()]
        if not parts:
            raise ModelFileError(f"{where}: an empty vector")
        return [_number(p, where) for p in parts]
    return [_number(text, where)]


def _margin(objective: str, base: float) -> float:
    """The base score in margin space, as the objective's ProbToMargin computes it (in float32)."""
    b = np.float32(base)
    if objective in ("binary:logistic", "reg:logistic"):
        if not 0 < b < 1:
            raise ModelFileError(f"learner.learner_model_param.base_score: {base} is not a probability")
        return float(-np.log(np.float32(1) / b - np.float32(1)))
    if objective in ("count:poisson", "reg:gamma", "reg:tweedie"):
        if not b > 0:
            raise ModelFileError(f"learner.learner_model_param.base_score: {base} must be positive for {objective}")
        return float(np.log(b))
    return float(b)


def _category_names(model: dict[str, Any], n_features: int, where: str) -> list[tuple[str, ...] | None]:
    """Category names per feature from ``cats`` (xgboost 3.x, models trained on pandas categoricals)."""
    cats = model.get("cats")
    names: list[tuple[str, ...] | None] = [None] * n_features
    if not isinstance(cats, dict) or not cats.get("enc"):
        return names
    enc = cats["enc"]
    if not isinstance(enc, list) or len(enc) != n_features:
        raise ModelFileError(f"{where}.cats.enc: expected one entry per feature ({n_features})")
    for j, entry in enumerate(enc):
        if not isinstance(entry, dict):
            raise ModelFileError(f"{where}.cats.enc[{j}]: not an object")
        values = _array(entry, "values", f"{where}.cats.enc[{j}]", "i")
        offsets = _array(entry, "offsets", f"{where}.cats.enc[{j}]", "i")
        if len(offsets):  # strings: UTF-8 bytes and their offsets
            if offsets[0] != 0 or offsets[-1] != len(values) or np.any(np.diff(offsets) < 0):
                raise ModelFileError(f"{where}.cats.enc[{j}].offsets: not increasing offsets into values")
            if len(values) and (values.min() < 0 or values.max() > 255):
                raise ModelFileError(f"{where}.cats.enc[{j}].values: not bytes")
            raw = bytes(values.astype(np.uint8))
            try:
                names[j] = tuple(raw[a:b].decode("utf-8") for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()))
            except UnicodeDecodeError:
                raise ModelFileError(f"{where}.cats.enc[{j}].values: a category name is not UTF-8") from None
        elif len(values):  # numeric categories
            names[j] = tuple(str(v) for v in values.tolist())
    return names


def read(doc: dict[str, Any]) -> TreeModel:
    """The checked model of an XGBoost document (JSON or UBJSON)."""
    learner = _obj(doc, "learner", "")
    where = "learner"
    params = _obj(learner, "learner_model_param", where)
    objective_obj = _obj(learner, "objective", where)
    objective = objective_obj.get("name")
    if objective not in SUPPORTED:
        raise ModelFileError(f"learner.objective.name: {objective!r} is not scored; supported: {', '.join(SUPPORTED)}")
    booster = _obj(learner, "gradient_booster", where)
    kind = booster.get("name")
    weights: list[float] | None = None
    if kind == "dart":
        raw_weights = booster.get("weight_drop")
        booster = _obj(booster, "gbtree", "learner.gradient_booster")
        bwhere = "learner.gradient_booster.gbtree"
    elif kind == "gbtree":
        bwhere = "learner.gradient_booster"
    else:
        raise ModelFileError(f"learner.gradient_booster.name: {kind!r} is not scored (gbtree and dart are)")
    model = _obj(booster, "model", bwhere)
    mwhere = f"{bwhere}.model"
    n_features = _int(params.get("num_feature"), "learner.learner_model_param.num_feature")
    n_class = _int(params.get("num_class", "0"), "learner.learner_model_param.num_class")
    n_target = _int(params.get("num_target", "1"), "learner.learner_model_param.num_target")
    if n_target != 1:
        raise ModelFileError(f"learner.learner_model_param.num_target: {n_target} targets; multi-target models are not scored")
    if not 1 <= n_features <= 1 << 20:
        raise ModelFileError(f"learner.learner_model_param.num_feature: {n_features} is out of range")
    multi = objective.startswith("multi:")
    if multi and not 2 <= n_class <= 64:
        raise ModelFileError(f"learner.learner_model_param.num_class: {n_class} classes (2 to 64 are scored)")
    n_groups = n_class if multi else 1
    trees = model.get("trees")
    if not isinstance(trees, list) or not trees:
        raise ModelFileError(f"{mwhere}.trees: missing or empty")
    tree_info = _array(model, "tree_info", mwhere, "i", len(trees))
    if np.any((tree_info < 0) | (tree_info >= n_groups)):
        raise ModelFileError(f"{mwhere}.tree_info: a tree's group is out of range (the model has {n_groups})")
    if kind == "dart":
        if not isinstance(raw_weights, (list, np.ndarray)) or len(raw_weights) != len(trees):
            raise ModelFileError("learner.gradient_booster.weight_drop: expected one weight per tree")
        weights = [_number(w, "learner.gradient_booster.weight_drop") for w in raw_weights]

    builder = ForestBuilder(n_features)
    for t, tree in enumerate(trees):
        twhere = f"{mwhere}.trees[{t}]"
        if not isinstance(tree, dict):
            raise ModelFileError(f"{twhere}: not an object")
        tparam: dict[str, Any] = tree["tree_param"] if isinstance(tree.get("tree_param"), dict) else {}
        if _int(tparam.get("size_leaf_vector", "1"), f"{twhere}.tree_param.size_leaf_vector") > 1:
            raise ModelFileError(f"{twhere}: vector leaves (multi-target trees) are not scored")
        left = _array(tree, "left_children", twhere, "i")
        n = len(left)
        right = _array(tree, "right_children", twhere, "i", n)
        feature = _array(tree, "split_indices", twhere, "i", n)
        cond = _array(tree, "split_conditions", twhere, "f", n)
        default_left = _array(tree, "default_left", twhere, "i", n)
        split_type = _array(tree, "split_type", twhere, "i", n) if "split_type" in tree else np.zeros(n, dtype=np.int64)
        hess = _array(tree, "sum_hessian", twhere, "f", n)
        leaf = left == -1
        flags = np.where(default_left != 0, DEFAULT_LEFT, 0) | np.where((split_type == 1) & ~leaf, CATEGORICAL, 0)
        cat_sets: dict[int, list[int]] = {}
        cat_nodes = _array(tree, "categories_nodes", twhere, "i") if "categories_nodes" in tree else np.zeros(0, np.int64)
        if len(cat_nodes):
            segments = _array(tree, "categories_segments", twhere, "i", len(cat_nodes))
            sizes = _array(tree, "categories_sizes", twhere, "i", len(cat_nodes))
            categories = _array(tree, "categories", twhere, "i")
            for node, start, size in zip(cat_nodes.tolist(), segments.tolist(), sizes.tolist()):
                if start < 0 or size < 0 or start + size > len(categories):
                    raise ModelFileError(f"{twhere}.categories_segments: node {node}'s categories are out of range")
                cat_sets[node] = categories[start : start + size].tolist()
        missing_sets = [k for k in np.flatnonzero((split_type == 1) & ~leaf).tolist() if k not in cat_sets]
        for k in missing_sets:
            cat_sets[k] = []
        builder.add_tree(
            twhere,
            left=np.where(leaf, -1, left),
            right=np.where(leaf, -1, right),
            feature=feature,
            flags=flags,
            thresholds=cond,
            leaves=np.where(leaf, cond, 0.0),
            cover=hess,
            group=int(tree_info[t]),
            weight=1.0 if weights is None else weights[t],
            cat_sets=cat_sets,
        )

    bases = base_scores(params.get("base_score", "0.5"), "learner.learner_model_param.base_score")
    if len(bases) not in (1, n_groups):
        raise ModelFileError(f"learner.learner_model_param.base_score: {len(bases)} values for {n_groups} outputs")
    margins = [_margin(objective, b) for b in bases] * (n_groups if len(bases) == 1 else 1)
    link = SOFTMAX if multi else (SIGMOID if objective == "binary:logistic" else _REGRESSION[objective])
    forest = builder.build(margins, LT_F32, float32_sum=True, link=link, weighted=weights is not None)
    features = _features(learner, model, n_features, mwhere)
    classes = tuple(str(k) for k in range(n_class)) if multi else ("0", "1") if objective == "binary:logistic" else None
    version = doc.get("version")
    facts = {
        "library": "xgboost",
        "objective": objective,
        "booster": kind,
        "trees": len(trees),
        "savedBy": ".".join(str(int(v)) for v in version) if isinstance(version, (list, np.ndarray)) else None,
        "baseScore": bases if len(bases) > 1 else bases[0],
    }
    if any(math.isnan(m) or math.isinf(m) for m in margins):
        raise ModelFileError("learner.learner_model_param.base_score: not a finite margin")
    return TreeModel(forest, features, classes, facts)


def _features(learner: dict[str, Any], model: dict[str, Any], n: int, mwhere: str) -> list[Feature]:
    names = learner.get("feature_names")
    types = learner.get("feature_types")
    if isinstance(names, list) and names:
        if len(names) != n or not all(isinstance(x, str) and x for x in names) or len(set(names)) != n:
            raise ModelFileError(f"learner.feature_names: expected {n} distinct names")
    else:
        names = [f"f{j}" for j in range(n)]
    if isinstance(types, list) and types:
        if len(types) != n:
            raise ModelFileError(f"learner.feature_types: expected {n} types")
    else:
        types = ["float"] * n
    categories = _category_names(model, n, mwhere)
    return [Feature(str(name), t == "c", categories[j] if t == "c" else None) for j, (name, t) in enumerate(zip(names, types))]


def read_file(path: Path) -> TreeModel:
    """Read and check an XGBoost model file."""
    return read(load(path))
