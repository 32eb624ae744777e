"""Types of the C extension forestflow/runtime/_forest.c (its docstrings say what each call does)."""

import numpy as np

def check(
    nodes: np.ndarray,
    thresholds: np.ndarray,
    leaves: np.ndarray,
    cats: np.ndarray,
    roots: np.ndarray,
    groups: np.ndarray,
    weights: np.ndarray,
    n_features: int,
    n_groups: int,
    /,
) -> None: ...
def score(
    X: np.ndarray,
    nodes: np.ndarray,
    thresholds: np.ndarray,
    leaves: np.ndarray,
    cats: np.ndarray,
    roots: np.ndarray,
    groups: np.ndarray,
    weights: np.ndarray,
    params: np.ndarray,
    base: np.ndarray,
    out: np.ndarray,
    layout: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] = ...,
    /,
) -> None: ...
def check_layout(
    nodes: np.ndarray,
    thresholds: np.ndarray,
    leaves: np.ndarray,
    cats: np.ndarray,
    roots: np.ndarray,
    groups: np.ndarray,
    weights: np.ndarray,
    trees: np.ndarray,
    slots: np.ndarray,
    layout_thresholds: np.ndarray,
    layout_leaves: np.ndarray,
    sources: np.ndarray,
    families: np.ndarray,
    n_features: int,
    compare: int,
    /,
) -> None: ...
def decisions(
    X: np.ndarray,
    nodes: np.ndarray,
    thresholds: np.ndarray,
    leaves: np.ndarray,
    cats: np.ndarray,
    roots: np.ndarray,
    groups: np.ndarray,
    weights: np.ndarray,
    params: np.ndarray,
    out: np.ndarray,
    /,
) -> None: ...
