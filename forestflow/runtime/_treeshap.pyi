"""Types of the C extension forestflow/runtime/_treeshap.c (its docstrings say what each call does)."""

import numpy as np

def check(
    left: np.ndarray,
    right: np.ndarray,
    feature: np.ndarray,
    cover: np.ndarray,
    value: np.ndarray,
    roots: np.ndarray,
    group: np.ndarray,
    n_features: int,
    n_groups: int,
    expected: np.ndarray,
    /,
) -> int: ...
def shap(
    left: np.ndarray,
    right: np.ndarray,
    feature: np.ndarray,
    cover: np.ndarray,
    value: np.ndarray,
    roots: np.ndarray,
    group: np.ndarray,
    n_features: int,
    depth: int,
    decisions: np.ndarray,
    out: np.ndarray,
    /,
) -> None: ...
