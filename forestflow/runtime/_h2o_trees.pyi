"""Types of the C extension forestflow/runtime/_h2o_trees.c (its docstrings say what each call does)."""

import numpy as np

class Tables:
    """One model's tables, checked once (made by tables(), read by score_tables())."""

def tables(
    nodes: np.ndarray,
    values: np.ndarray,
    bits: np.ndarray,
    roots: np.ndarray,
    target: np.ndarray,
    dom_len: np.ndarray,
    params: np.ndarray,
    prior: np.ndarray,
    model_distrib: np.ndarray,
    width: int,
    layout: tuple[np.ndarray, ...] | None = None,
    /,
) -> Tables: ...
def score_tables(
    tables: Tables, X: np.ndarray, offsets: np.ndarray, preds: np.ndarray, ties: np.ndarray, padded: bool, /
) -> None: ...
def score(
    X: np.ndarray,
    offsets: np.ndarray | None,
    nodes: np.ndarray,
    values: np.ndarray,
    bits: np.ndarray,
    roots: np.ndarray,
    target: np.ndarray,
    dom_len: np.ndarray,
    params: np.ndarray,
    prior: np.ndarray,
    model_distrib: np.ndarray,
    preds: np.ndarray,
    ties: np.ndarray,
    /,
) -> None: ...
def check_tables(
    nodes: np.ndarray, values: np.ndarray, bits: np.ndarray, roots: np.ndarray, target: np.ndarray, n_features: int, width: int, /
) -> None: ...
def decisions(
    X: np.ndarray,
    nodes: np.ndarray,
    values: np.ndarray,
    bits: np.ndarray,
    dom_len: np.ndarray,
    params: np.ndarray,
    out: np.ndarray,
    /,
) -> None: ...
def level_codes(values: list[object], lookup: dict[str, int], X: np.ndarray, j: int, /) -> list[int]: ...
def encode_columns(arrays: list[np.ndarray | None], lookups: list[dict[str, int] | None], X: np.ndarray, /) -> list[int]: ...
