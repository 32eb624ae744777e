"""A Frame becomes the tree kernel's float64 matrix (rows x model features, NaN = missing).

Two layouts: one column per model feature, matched by name (``/score``, V2 "pd", V1 instances,
GraphPipe named tensors), or one ``[N, F]`` tensor holding every feature in model order (what
XGBoost and scikit-learn users send MLServer). Numeric features take numbers (numeric strings
are parsed; any other string is a 400 naming the feature); a categorical feature with stored
category names takes the names (a number names a category by its text, as in the H2O flavor),
one without takes the integer codes. Missing values, missing columns and unseen categories are
NaN, which every format scores as missing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forestflow.core.frame import Frame
from forestflow.errors import InvalidInput
from forestflow.runtime.h2o_inputs import NA, ModelColumn, one_per_row
from forestflow.runtime.trees.model import Feature


def _number(v: Any, feature: str) -> float:
    if v is None:
        return NA
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        raise InvalidInput(f"input {feature!r}: {v!r} is not a number; the model takes a number for {feature!r}") from None


def numbers(arr: np.ndarray, feature: str) -> np.ndarray:
    """A column as float64 (NaN = missing); a value that is not a number is a 400 naming the feature."""
    if arr.dtype.kind in "biuf":
        return arr.astype(np.float64, copy=False)
    return np.array([_number(v, feature) for v in arr.tolist()], dtype=np.float64)


class InputMap:
    """How a frame's columns fill the model's feature matrix."""

    def __init__(self, features: list[Feature]) -> None:
        self.features = features
        self.names = [f.name for f in features]
        self.index = {f.name: j for j, f in enumerate(features)}
        self.columns: list[ModelColumn | None] = [
            ModelColumn.make(f.name, f.categories) if f.categories is not None else None for f in features
        ]

    def matrix(self, frame: Frame) -> tuple[np.ndarray, list[str], list[str]]:
        """``(X, unknown column names, model features the frame lacks)``."""
        n, width = frame.num_rows, len(self.features)
        if len(frame.columns) == 1:
            ((name, arr),) = frame.columns.items()
            if name not in self.index and arr.ndim == 2 and arr.shape[1] != 1:
                return self._tensor(name, arr), [], []
        if n == 1:  # one row: plain Python per value beats numpy per column
            return self._row(frame)
        X = np.full((n, width), NA)
        unknown: list[str] = []
        for name, arr in frame.columns.items():
            j = self.index.get(name)
            if j is None:
                unknown.append(name)
                continue
            values = one_per_row(name, arr)
            column = self.columns[j]
            if column is None:
                X[:, j] = numbers(values, name)
            else:
                column.fill(values, X, j, NA)
        missing = [f for f in self.names if f not in frame.columns]
        return X, unknown, missing

    def _row(self, frame: Frame) -> tuple[np.ndarray, list[str], list[str]]:
        row = [NA] * len(self.features)
        unknown: list[str] = []
        for name, arr in frame.columns.items():
            j = self.index.get(name)
            if j is None:
                unknown.append(name)
                continue
            value = one_per_row(name, arr)[0]
            column = self.columns[j]
            row[j] = _number(value, name) if column is None else column.code_of(value, NA)
        missing = [f for f in self.names if f not in frame.columns] if len(frame.columns) - len(unknown) < len(row) else []
        return np.array([row], dtype=np.float64), unknown, missing

    def _tensor(self, name: str, arr: np.ndarray) -> np.ndarray:
        width = len(self.features)
        if arr.shape[1] != width:
            raise InvalidInput(
                f"input {name!r} has {arr.shape[1]} columns; the model takes {width} features ({', '.join(self.names)})"
            )
        if arr.dtype.kind in "biuf":
            return np.ascontiguousarray(arr, dtype=np.float64)
        X = np.empty(arr.shape, dtype=np.float64)
        for j, feature in enumerate(self.features):
            column = self.columns[j]
            if column is None:
                X[:, j] = numbers(arr[:, j], feature.name)
            else:
                column.fill(arr[:, j], X, j, NA)
        return X

    def dummy(self, rows: int) -> np.ndarray:
        """Rows covering numbers, categories and missing values, for warming up and probes."""
        rng = np.random.default_rng(0)
        X = rng.normal(0.0, 2.0, (rows, len(self.features)))
        for j, f in enumerate(self.features):
            if f.categorical:
                X[:, j] = rng.integers(0, max(len(f.categories or ()), 4), rows)
        X[::7] = NA
        return X
