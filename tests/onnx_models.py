"""Small scikit-learn models exported to ONNX at test time (skl2onnx), with the data they answer on.

Every model is trained on float32-representable features, so scikit-learn (float64) and the ONNX
graph (float32) see the same numbers and their answers agree to float32 rounding.

scikit-learn and skl2onnx are imported by the builders, not at import: test modules import this one at
collection, on every test worker, and the two take seconds to import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FEATURES = ["f0", "f1", "f2", "f3"]
COLORS = ["red", "green", "blue"]


@dataclass
class OnnxCase:
    """One exported model: its file, flavor settings, test rows and scikit-learn's answers on them."""

    name: str
    file: str
    settings: dict[str, Any]
    #: Request columns: one per feature (numbers as float64, strings as str).
    columns: dict[str, list[Any]]
    #: Expected output columns (label and one per class, or the regression value).
    expected: dict[str, list[Any]]
    classes: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(next(iter(self.columns.values())))

    def matrix(self, features: list[str]) -> np.ndarray:
        """The named feature columns as one float64 [N, F] matrix."""
        return np.column_stack([np.asarray(self.columns[f], dtype=np.float64) for f in features])


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32).astype(np.float64)


def _classifier_expected(model: Any, X: Any, label_type: type) -> tuple[dict[str, list[Any]], list[str]]:
    classes = [str(c) for c in model.classes_]
    expected: dict[str, list[Any]] = {"output_label": [label_type(v) for v in model.predict(X)]}
    for j, c in enumerate(classes):
        expected[c] = model.predict_proba(X)[:, j].tolist()
    return expected, classes


def _save(directory: Path, name: str, onx: Any, props: dict[str, str] | None = None) -> str:
    for key, value in (props or {}).items():
        onx.metadata_props.add(key=key, value=value)
    (directory / f"{name}.onnx").write_bytes(onx.SerializeToString())
    return f"{name}.onnx"


def regressor(directory: Path, rows: int = 7) -> OnnxCase:
    """A random-forest regressor on one [N, 4] input; feature names given by ``featureOrder``."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.ensemble import RandomForestRegressor

    rng = np.random.default_rng(1)
    X = _f32(rng.normal(size=(200, 4)))
    y = X[:, 0] * 1.5 - X[:, 2] + 0.3 * X[:, 3] ** 2
    model = RandomForestRegressor(n_estimators=10, max_depth=5, random_state=0).fit(X, y)
    onx = convert_sklearn(model, initial_types=[("float_input", FloatTensorType([None, 4]))])
    test = X[:rows]
    return OnnxCase(
        "regressor",
        _save(directory, "regressor", onx),
        {"featureOrder": FEATURES},
        {f: test[:, j].tolist() for j, f in enumerate(FEATURES)},
        {"variable": model.predict(test).tolist()},
    )


def binary(directory: Path, rows: int = 7) -> OnnxCase:
    """Logistic regression, labels 0/1, ZipMap probabilities; feature names in the model's metadata."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(2)
    X = _f32(rng.normal(size=(300, 4)))
    y = (X[:, 0] + 0.5 * X[:, 1] - X[:, 3] > 0).astype(np.int64)
    model = LogisticRegression().fit(X, y)
    onx = convert_sklearn(model, initial_types=[("X", FloatTensorType([None, 4]))])
    test = X[:rows]
    expected, classes = _classifier_expected(model, test, int)
    return OnnxCase(
        "binary",
        _save(directory, "binary", onx, {"feature_names": ",".join(FEATURES)}),
        {},
        {f: test[:, j].tolist() for j, f in enumerate(FEATURES)},
        expected,
        classes,
    )


def multiclass(directory: Path, rows: int = 9) -> OnnxCase:
    """A random forest on iris with string labels (string label output, string-keyed ZipMap)."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.datasets import load_iris
    from sklearn.ensemble import RandomForestClassifier

    X, y = load_iris(return_X_y=True)
    X = _f32(X)
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    model = RandomForestClassifier(n_estimators=8, max_depth=4, random_state=0).fit(X, names)
    onx = convert_sklearn(model, initial_types=[("input", FloatTensorType([None, 4]))])
    test = X[:: 150 // rows][:rows]
    expected, classes = _classifier_expected(model, test, str)
    return OnnxCase(
        "multiclass",
        _save(directory, "multiclass", onx, {"feature_names": '["f0", "f1", "f2", "f3"]'}),
        {},
        {f: test[:, j].tolist() for j, f in enumerate(FEATURES)},
        expected,
        classes,
    )


def pipeline(directory: Path, rows: int = 8) -> OnnxCase:
    """One-hot encoded string column + scaled numbers -> logistic regression.

    Inputs: ``color`` (string [N, 1]) and ``x`` (float [N, 2], features x1, x2 by ``featureOrder``).
    """
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    rng = np.random.default_rng(3)
    n = 300
    color = rng.choice(COLORS, n)
    x = _f32(rng.normal(size=(n, 2)))
    y = ((color == "red") ^ (x[:, 0] + x[:, 1] > 0)).astype(np.int64)
    X = np.empty((n, 3), dtype=object)
    X[:, 0], X[:, 1:] = color, x
    transform = ColumnTransformer([("cat", OneHotEncoder(handle_unknown="ignore"), [0]), ("num", StandardScaler(), [1, 2])])
    model = Pipeline([("prep", transform), ("clf", LogisticRegression())]).fit(X, y)
    onx = convert_sklearn(model, initial_types=[("color", StringTensorType([None, 1])), ("x", FloatTensorType([None, 2]))])
    test = X[:rows]
    expected, classes = _classifier_expected(model, test, int)
    columns = {"color": [str(c) for c in test[:, 0]], "x1": [float(v) for v in test[:, 1]], "x2": [float(v) for v in test[:, 2]]}
    return OnnxCase(
        "pipeline",
        _save(directory, "pipeline", onx),
        {"featureOrder": {"x": ["x1", "x2"]}},
        columns,
        expected,
        classes,
    )


def prostate_gbm(directory: Path, rows: list[dict[str, str]], categorical: list[str], numeric: list[str]) -> str:
    """A GBM the size of the H2O prostate fixture's (25 trees, depth 3) on the same columns, for bench/run.py.

    Inputs ``cat`` (string [N, 3]) and ``num`` (float [N, 4]); the flavor assembles both from
    one column per feature (``featureOrder``), so the H2O cell's request bodies score unchanged.
    """
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import GradientBoostingClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder

    X = np.empty((len(rows), len(categorical) + len(numeric)), dtype=object)
    for i, r in enumerate(rows):
        X[i] = [r[c] for c in categorical] + [float(r[c]) for c in numeric]
    y = np.array([int(r["out:predict"]) for r in rows])
    k = len(categorical)
    transform = ColumnTransformer(
        [
            ("cat", OneHotEncoder(handle_unknown="ignore"), list(range(k))),
            ("num", "passthrough", list(range(k, k + len(numeric)))),
        ]
    )
    model = Pipeline([("prep", transform), ("gbm", GradientBoostingClassifier(n_estimators=25, max_depth=3, random_state=0))])
    model.fit(X, y)
    onx = convert_sklearn(
        model, initial_types=[("cat", StringTensorType([None, k])), ("num", FloatTensorType([None, len(numeric)]))]
    )
    return _save(directory, "prostate_gbm", onx)


CASES = (regressor, binary, multiclass, pipeline)
