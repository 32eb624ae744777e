"""scikit-learn tree ensembles, read from the unpickled estimator's own arrays into a :class:`Forest`.

A pickle can only be read by unpickling it (scikit-learn must be importable, and unpickling runs
code: the SKLearn flavor is gated like the Python flavor), so this reader takes the estimator,
not the file: its trees' ``tree_`` arrays (children, feature, threshold, missing_go_to_left,
value, weighted_n_node_samples) or, for histogram GBMs, the predictors' node arrays. Estimators
it does not score natively raise :class:`NotNative` and are scored by their own methods.

Scoring rules: scikit-learn's trees read X as float32 and go left when ``float32(x) <= threshold``
(a double); histogram GBMs compare ``x <= threshold`` in double; NaN follows
``missing_go_to_left``. Forests average the trees' leaf class proportions (classifiers) or
values (regressors); gradient boosting starts from the init estimator's constant raw prediction,
adds learning_rate * leaf value per tree in stage order, then expit or softmax.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forestflow.runtime.trees.codes import DEFAULT_LEFT, EXP, IDENTITY, LE, LE_X_F32, SIGMOID, SOFTMAX
from forestflow.runtime.trees.forest import ForestBuilder, ModelFileError
from forestflow.runtime.trees.model import Feature, TreeModel

_FORESTS = ("RandomForestClassifier", "RandomForestRegressor", "ExtraTreesClassifier", "ExtraTreesRegressor")
_GB = ("GradientBoostingClassifier", "GradientBoostingRegressor")
_HGB = ("HistGradientBoostingClassifier", "HistGradientBoostingRegressor")
_LOSS_LINKS = {
    "HalfSquaredError": IDENTITY,
    "AbsoluteError": IDENTITY,
    "PinballLoss": IDENTITY,
    "HuberLoss": IDENTITY,
    "HalfPoissonLoss": EXP,
    "HalfGammaLoss": EXP,
    "HalfBinomialLoss": SIGMOID,
    "HalfMultinomialLoss": SOFTMAX,
}


class NotNative(Exception):
    """An estimator this reader does not score natively (it is scored by its own methods)."""


def features_of(est: Any) -> list[Feature]:
    """The estimator's input columns: ``feature_names_in_`` if fitted on a DataFrame, else x0, x1..."""
    n = int(getattr(est, "n_features_in_", 0) or 0)
    if n < 1:
        raise ModelFileError("the estimator has no n_features_in_ (is it fitted?)")
    names = getattr(est, "feature_names_in_", None)
    if names is None or len(names) != n:
        names = [f"x{j}" for j in range(n)]
    return [Feature(str(name)) for name in names]


def _tree(builder: ForestBuilder, tree: Any, where: str, group: int, leaves: np.ndarray) -> None:
    left = np.asarray(tree.children_left, dtype=np.int64)
    right = np.asarray(tree.children_right, dtype=np.int64)
    n = len(left)
    missing_left = np.asarray(getattr(tree, "missing_go_to_left", np.zeros(n)), dtype=np.int64)
    builder.add_tree(
        where,
        left=left,
        right=np.where(left < 0, -1, right),
        feature=np.asarray(tree.feature, dtype=np.int64),
        flags=np.where(missing_left != 0, DEFAULT_LEFT, 0),
        thresholds=np.asarray(tree.threshold, dtype=np.float64),
        leaves=leaves,
        cover=np.asarray(tree.weighted_n_node_samples, dtype=np.float64),
        group=group,
    )


def _classes(est: Any) -> tuple[str, ...]:
    return tuple(str(c) for c in est.classes_)


def _forest(est: Any, name: str, features: list[Feature]) -> TreeModel:
    classifier = name.endswith("Classifier")
    n_outputs = int(getattr(est, "n_outputs_", 1))
    if n_outputs != 1:
        raise NotNative(f"{n_outputs} outputs")
    trees = est.estimators_
    width = len(est.classes_) if classifier else 1
    builder = ForestBuilder(len(features), leaf_width=width)
    for t, tree_est in enumerate(trees):
        tree = tree_est.tree_
        # Classifier trees store each leaf's class proportions (scikit-learn >= 1.4), which
        # predict_proba returns as they are.
        value = np.asarray(tree.value, dtype=np.float64)[:, 0, :width]
        if classifier and np.any(value.sum(axis=1) > 1.0 + 1e-9):  # older versions stored counts
            normalizer = value.sum(axis=1)[:, np.newaxis]
            normalizer[normalizer == 0.0] = 1.0
            value = value / normalizer
        _tree(builder, tree, f"estimators_[{t}].tree_", 0, value)
    forest = builder.build([0.0] * width, LE_X_F32, divisor=float(len(trees)))
    return TreeModel(forest, features, _classes(est) if classifier else None, {"trees": len(trees)})


def _gradient_boosting(est: Any, name: str, features: list[Feature]) -> TreeModel:
    from sklearn.dummy import DummyClassifier, DummyRegressor

    init = est.init_
    if not (isinstance(init, str) and init == "zero") and not isinstance(init, (DummyClassifier, DummyRegressor)):
        raise NotNative(f"init estimator {type(init).__name__}")
    base = np.asarray(est._raw_predict_init(np.zeros((1, len(features)), dtype=np.float32)), dtype=np.float64)[0]
    stages = est.estimators_
    k = stages.shape[1]
    builder = ForestBuilder(len(features))
    rate = float(est.learning_rate)
    for i in range(stages.shape[0]):
        for g in range(k):
            tree = stages[i, g].tree_
            value = np.asarray(tree.value, dtype=np.float64)[:, 0, 0] * rate
            _tree(builder, tree, f"estimators_[{i}, {g}].tree_", g, value)
    classifier = name.endswith("Classifier")
    link = (SIGMOID if k == 1 else SOFTMAX) if classifier else IDENTITY
    loss = type(getattr(est, "_loss", None)).__name__
    if not classifier and loss not in ("HalfSquaredError", "AbsoluteError", "PinballLoss", "HuberLoss"):
        raise NotNative(f"loss {loss}")
    forest = builder.build(base.tolist(), LE_X_F32, link=link)
    return TreeModel(forest, features, _classes(est) if classifier else None, {"trees": int(stages.size)})


def _hist_gradient_boosting(est: Any, name: str, features: list[Feature]) -> TreeModel:
    if getattr(est, "_preprocessor", None) is not None or getattr(est, "is_categorical_", None) is not None:
        raise NotNative("categorical features")
    loss = type(est._loss).__name__
    if loss not in _LOSS_LINKS:
        raise NotNative(f"loss {loss}")
    base = np.asarray(est._baseline_prediction, dtype=np.float64).reshape(-1)
    builder = ForestBuilder(len(features))
    count = 0
    for i, per_class in enumerate(est._predictors):
        for g, predictor in enumerate(per_class):
            nodes = predictor.nodes
            leaf = nodes["is_leaf"].astype(bool)
            builder.add_tree(
                f"_predictors[{i}][{g}].nodes",
                left=np.where(leaf, -1, nodes["left"].astype(np.int64)),
                right=np.where(leaf, -1, nodes["right"].astype(np.int64)),
                feature=nodes["feature_idx"].astype(np.int64),
                flags=np.where(nodes["missing_go_to_left"] != 0, DEFAULT_LEFT, 0),
                thresholds=nodes["num_threshold"].astype(np.float64),
                leaves=np.where(leaf, nodes["value"].astype(np.float64), 0.0),
                cover=nodes["count"].astype(np.float64),
                group=g,
            )
            count += 1
    link = _LOSS_LINKS[loss]
    forest = builder.build(base.tolist(), LE, link=link)
    classifier = name.endswith("Classifier")
    return TreeModel(forest, features, _classes(est) if classifier else None, {"trees": count})


def read_estimator(est: Any) -> TreeModel:
    """The forest of a fitted RandomForest/ExtraTrees/GradientBoosting/HistGradientBoosting estimator."""
    name = type(est).__name__
    features = features_of(est)
    try:
        if name in _FORESTS:
            model = _forest(est, name, features)
        elif name in _GB:
            model = _gradient_boosting(est, name, features)
        elif name in _HGB:
            model = _hist_gradient_boosting(est, name, features)
        else:
            raise NotNative(name)
    except (AttributeError, KeyError, TypeError, IndexError) as exc:
        raise ModelFileError(f"{name}: not a fitted estimator of the shape expected ({type(exc).__name__}: {exc})") from None
    facts = {"library": "scikit-learn", "estimator": name, "objective": name, **model.facts}
    return TreeModel(model.forest, model.features, model.classes, facts)
