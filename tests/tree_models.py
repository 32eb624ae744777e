"""Small XGBoost, LightGBM and scikit-learn models trained at test time, with the rows they answer
on and the libraries' own answers (the tree flavors must give the same).

Every case's request rows carry missing numbers (None), a missing category, an unseen category
and categories as strings; the library is given the same rows the way it takes them (NaN, and
NaN for the unseen level, which the flavors treat as missing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

COLORS = ["red", "green", "blue", "teal"]
N_TRAIN = 300


@dataclass
class TreeCase:
    """One saved model, its flavor, the request columns and the library's answers on them."""

    name: str
    flavor: str
    file: str
    #: Request columns (numbers, None = missing; category names as str).
    columns: dict[str, list[Any]]
    #: Expected output columns: ``predict`` (label or value) and one probability per class.
    expected: dict[str, list[Any]]
    #: Relative tolerance (0 = exact; a float32 library's answers are compared as float32).
    rtol: float = 0.0

    @property
    def rows(self) -> int:
        return len(next(iter(self.columns.values())))


def training_frame(categorical: bool = True, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    """Features a (with NaNs), b, and color (a pandas categorical), and a latent score."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"a": rng.normal(size=N_TRAIN), "b": rng.normal(size=N_TRAIN)})
    frame.loc[::9, "a"] = np.nan
    color = rng.choice(COLORS, N_TRAIN)
    if categorical:
        frame["color"] = pd.Categorical(color, categories=COLORS)
    score = frame["a"].fillna(0.3).to_numpy() + 0.5 * frame["b"].to_numpy() + (color == "green") - 0.7 * (color == "blue")
    return frame, score


def request_rows(categorical: bool = True) -> tuple[dict[str, list[Any]], pd.DataFrame]:
    """The request columns, and the same rows as the library takes them."""
    a = [0.5, None, -1.25, 2.0, 0.0, None, 1e-40, -0.3]
    b = [1.0, -0.5, 0.25, None, 0.75, 2.5, -1.0, 0.1]
    columns: dict[str, list[Any]] = {"a": a, "b": b}
    frame = pd.DataFrame({"a": [np.nan if v is None else v for v in a], "b": [np.nan if v is None else v for v in b]})
    if categorical:
        color = ["red", "green", None, "blue", "purple", "teal", "green", "red"]  # purple: unseen
        columns["color"] = color
        frame["color"] = pd.Categorical([c if c in COLORS else None for c in color], categories=COLORS)
    return columns, frame


def _classifier(probs: np.ndarray, classes: list[str]) -> dict[str, list[Any]]:
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim == 1:
        probs = np.column_stack([1.0 - probs, probs])
    out: dict[str, list[Any]] = {"predict": [classes[k] for k in np.argmax(probs, axis=1)]}
    for k, c in enumerate(classes):
        out[c] = probs[:, k].tolist()
    return out


def _regressor(values: np.ndarray) -> dict[str, list[Any]]:
    return {"predict": np.asarray(values, dtype=np.float64).reshape(-1).tolist()}


# ---- XGBoost ----------------------------------------------------------------------------------
def _xgb(directory: Path, name: str, params: dict[str, Any], label: Callable[[np.ndarray], np.ndarray], ext: str) -> TreeCase:
    import xgboost as xgb

    frame, score = training_frame()
    params = {"max_depth": 4, "max_cat_to_onehot": 1, "seed": 0, **params}
    booster = xgb.train(params, xgb.DMatrix(frame, label(score), enable_categorical=True), num_boost_round=15)
    file = f"{name}.{ext}"
    booster.save_model(str(directory / file))
    columns, rows = request_rows()
    got = booster.inplace_predict(rows)
    objective = params["objective"]
    if objective.startswith("multi:"):
        expected = _classifier(got, [str(k) for k in range(params["num_class"])])
    elif objective == "binary:logistic":
        expected = _classifier(got, ["0", "1"])
    else:
        expected = _regressor(got)
    # XGBoost computes in float32; DART's weighted sums round differently in a few rows' last bits.
    return TreeCase(name, "XGBoost", file, columns, expected, rtol=1e-6 if params.get("booster") == "dart" else 0.0)


def xgb_binary(directory: Path) -> TreeCase:
    return _xgb(directory, "xgb_binary", {"objective": "binary:logistic"}, lambda s: (s > 0.2).astype(int), "json")


def xgb_regression(directory: Path) -> TreeCase:
    return _xgb(directory, "xgb_regression", {"objective": "reg:squarederror"}, lambda s: s, "ubj")


def xgb_multiclass(directory: Path) -> TreeCase:
    return _xgb(
        directory, "xgb_multiclass", {"objective": "multi:softprob", "num_class": 3}, lambda s: np.digitize(s, [-0.3, 0.6]), "ubj"
    )


def xgb_poisson(directory: Path) -> TreeCase:
    return _xgb(directory, "xgb_poisson", {"objective": "count:poisson"}, lambda s: np.round(np.exp(s / 2)), "json")


def xgb_dart(directory: Path) -> TreeCase:
    params = {"objective": "reg:squarederror", "booster": "dart", "rate_drop": 0.3}
    return _xgb(directory, "xgb_dart", params, lambda s: s, "json")


XGBOOST_CASES = [xgb_binary, xgb_regression, xgb_multiclass, xgb_poisson, xgb_dart]


# ---- LightGBM ---------------------------------------------------------------------------------
def _lgb(directory: Path, name: str, params: dict[str, Any], label: Callable[[np.ndarray], np.ndarray]) -> TreeCase:
    import lightgbm as lgb

    frame, score = training_frame()
    params = {
        "verbose": -1,
        "num_leaves": 8,
        "min_data_in_leaf": 5,
        "min_data_per_group": 5,
        "cat_smooth": 1,
        "seed": 0,
        **params,
    }
    booster = lgb.train(params, lgb.Dataset(frame, label(score)), num_boost_round=10)
    file = f"{name}.txt"
    booster.save_model(str(directory / file))
    columns, rows = request_rows()
    got = booster.predict(rows)
    objective = params["objective"]
    if objective == "multiclass":
        expected = _classifier(got, [str(k) for k in range(params["num_class"])])
    elif objective == "binary":
        expected = _classifier(got, ["0", "1"])
    else:
        expected = _regressor(got)
    return TreeCase(name, "LightGBM", file, columns, expected)


def lgb_binary(directory: Path) -> TreeCase:
    return _lgb(directory, "lgb_binary", {"objective": "binary"}, lambda s: (s > 0.2).astype(int))


def lgb_regression_zero(directory: Path) -> TreeCase:
    """Regression whose numeric nodes use the "zero" missing type (1e-40 is missing there)."""
    return _lgb(directory, "lgb_regression", {"objective": "regression", "zero_as_missing": True}, lambda s: s)


def lgb_multiclass(directory: Path) -> TreeCase:
    return _lgb(directory, "lgb_multiclass", {"objective": "multiclass", "num_class": 3}, lambda s: np.digitize(s, [-0.3, 0.6]))


def lgb_rf(directory: Path) -> TreeCase:
    params = {"objective": "binary", "boosting": "rf", "bagging_fraction": 0.7, "bagging_freq": 1, "use_missing": False}
    return _lgb(directory, "lgb_rf", params, lambda s: (s > 0.2).astype(int))


LIGHTGBM_CASES = [lgb_binary, lgb_regression_zero, lgb_multiclass, lgb_rf]


# ---- scikit-learn -----------------------------------------------------------------------------
def _sk(directory: Path, name: str, make: Callable[[], Any], classifier: bool, nan_ok: bool = True) -> TreeCase:
    import joblib

    frame, score = training_frame(categorical=False)
    if not nan_ok:
        frame = frame.fillna(0.3)
    y = np.digitize(score, [-0.3, 0.6]) if classifier else score
    if classifier and "binary" in name:
        y = np.where(score > 0.2, "yes", "no")
    est = make().fit(frame, y)
    file = f"{name}.joblib"
    joblib.dump(est, directory / file)
    columns, rows = request_rows(categorical=False)
    if not nan_ok:
        columns = {k: [0.3 if v is None else v for v in vs] for k, vs in columns.items()}
        rows = rows.fillna(0.3)
    if classifier:
        expected = _classifier(est.predict_proba(rows), [str(c) for c in est.classes_])
        assert expected["predict"] == [str(v) for v in est.predict(rows)]
    else:
        expected = _regressor(est.predict(rows))
    # scikit-learn's histogram GBMs take the softmax with numpy's exp, which on CPUs with AVX-512 is a
    # vectorized exp that can differ from the C library's (ours) in the last bit: there, allow 1 ulp.
    rtol = 2.3e-16 if name == "sk_hgb_multiclass" else 0.0
    return TreeCase(name, "SKLearn", file, columns, expected, rtol=rtol)


def sk_rf_classifier(directory: Path) -> TreeCase:
    from sklearn.ensemble import RandomForestClassifier

    return _sk(directory, "sk_rf_multiclass", lambda: RandomForestClassifier(12, max_depth=5, random_state=0), True)


def sk_et_regressor(directory: Path) -> TreeCase:
    from sklearn.ensemble import ExtraTreesRegressor

    return _sk(directory, "sk_et_regressor", lambda: ExtraTreesRegressor(12, max_depth=5, random_state=0), False)


def sk_gb_binary(directory: Path) -> TreeCase:
    from sklearn.ensemble import GradientBoostingClassifier

    make = lambda: GradientBoostingClassifier(n_estimators=15, max_depth=3, random_state=0)  # noqa: E731
    return _sk(directory, "sk_gb_binary", make, True, nan_ok=False)


def sk_gb_regressor(directory: Path) -> TreeCase:
    from sklearn.ensemble import GradientBoostingRegressor

    make = lambda: GradientBoostingRegressor(n_estimators=15, max_depth=3, random_state=0)  # noqa: E731
    return _sk(directory, "sk_gb_regressor", make, False, nan_ok=False)


def sk_hgb_multiclass(directory: Path) -> TreeCase:
    from sklearn.ensemble import HistGradientBoostingClassifier

    return _sk(directory, "sk_hgb_multiclass", lambda: HistGradientBoostingClassifier(max_iter=15, random_state=0), True)


def sk_hgb_regressor(directory: Path) -> TreeCase:
    from sklearn.ensemble import HistGradientBoostingRegressor

    return _sk(directory, "sk_hgb_regressor", lambda: HistGradientBoostingRegressor(max_iter=15, random_state=0), False)


def sk_logistic(directory: Path) -> TreeCase:
    """Not a tree ensemble: scored by its own predict_proba."""
    from sklearn.linear_model import LogisticRegression

    return _sk(directory, "sk_logistic_binary", LogisticRegression, True, nan_ok=False)


SKLEARN_CASES = [
    sk_rf_classifier,
    sk_et_regressor,
    sk_gb_binary,
    sk_gb_regressor,
    sk_hgb_multiclass,
    sk_hgb_regressor,
    sk_logistic,
]
