"""Exact TreeSHAP in C (runtime/_treeshap.c): brute-force Shapley values, additivity, and a fuzzed check."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forestflow.runtime import _treeshap
from forestflow.runtime.treeshap import ShapForest, contributions
from tests.runtime.shap_oracle import brute_force_tree_shap, margin, random_forest
from tests.tiers import examples


@pytest.mark.parametrize("seed", range(12))
def test_equals_brute_force_shapley_on_random_trees(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_features = int(rng.integers(1, 6))
    forest = random_forest(rng, n_features, n_trees=int(rng.integers(1, 4)), n_groups=int(rng.integers(1, 3)))
    decisions = rng.integers(0, 2, size=(5, forest.n_nodes), dtype=np.uint8)
    got = contributions(forest, decisions)
    assert got.shape == (5, forest.n_groups, n_features + 1)
    np.testing.assert_allclose(got, brute_force_tree_shap(forest, decisions), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got.sum(axis=2), margin(forest, decisions), rtol=1e-9, atol=1e-9)


@settings(max_examples=examples(60), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.integers(1, 3))
def test_additive_and_exact_on_generated_trees(seed: int, n_features: int, n_trees: int) -> None:
    rng = np.random.default_rng(seed)
    forest = random_forest(rng, n_features, n_trees, max_depth=5)
    decisions = rng.integers(0, 2, size=(2, forest.n_nodes), dtype=np.uint8)
    got = contributions(forest, decisions)
    np.testing.assert_allclose(got.sum(axis=2), margin(forest, decisions), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got, brute_force_tree_shap(forest, decisions), rtol=1e-8, atol=1e-9)


def test_deep_trees_stay_additive() -> None:
    rng = np.random.default_rng(7)
    forest = random_forest(rng, 12, n_trees=30, n_groups=3, max_depth=14)
    decisions = rng.integers(0, 2, size=(40, forest.n_nodes), dtype=np.uint8)
    got = contributions(forest, decisions)
    np.testing.assert_allclose(got.sum(axis=2), margin(forest, decisions), rtol=1e-9, atol=1e-9)


def test_a_single_leaf_tree_is_all_bias() -> None:
    forest = ShapForest(
        left=np.array([-1]),
        right=np.array([-1]),
        feature=np.array([-1]),
        cover=np.array([3.0]),
        value=np.array([2.5]),
        roots=np.array([0]),
        group=np.array([0]),
        n_groups=1,
        feature_names=["a", "b"],
        base_margin=np.array([0.5]),
    )
    assert contributions(forest, np.zeros((2, 1), dtype=np.uint8)).tolist() == [[[0.0, 0.0, 3.0]]] * 2
    assert contributions(forest, np.zeros((0, 1), dtype=np.uint8)).shape == (0, 1, 3)


def test_one_split_gives_the_textbook_values() -> None:
    # x0 < t: left leaf 1 (cover 3), right leaf 5 (cover 1): E = 2; a row going right gets +3.
    forest = ShapForest(
        left=np.array([1, -1, -1]),
        right=np.array([2, -1, -1]),
        feature=np.array([0, -1, -1]),
        cover=np.array([4.0, 3.0, 1.0]),
        value=np.array([0.0, 1.0, 5.0]),
        roots=np.array([0]),
        group=np.array([0]),
        n_groups=1,
        feature_names=["x0", "x1"],
        base_margin=np.array([0.0]),
    )
    got = contributions(forest, np.array([[1, 0, 0], [0, 0, 0]], dtype=np.uint8))
    assert got[:, 0].tolist() == [[3.0, 0.0, 2.0], [-1.0, 0.0, 2.0]]


def _table(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "left": np.array([1, -1, -1]),
        "right": np.array([2, -1, -1]),
        "feature": np.array([0, -1, -1]),
        "cover": np.array([2.0, 1.0, 1.0]),
        "value": np.array([0.0, 1.0, 2.0]),
        "roots": np.array([0]),
        "group": np.array([0]),
        "n_groups": 1,
        "feature_names": ["x"],
        "base_margin": np.array([0.0]),
    }
    base.update(changes)
    return base


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"left": np.array([5, -1, -1])}, "outside the node table"),
        ({"right": np.array([0, -1, -1])}, "reached twice"),
        ({"left": np.array([1, -1, -1]), "right": np.array([1, -1, -1])}, "reached twice"),
        ({"feature": np.array([1, -1, -1])}, "column out of range"),
        ({"cover": np.array([2.0, -1.0, 1.0])}, "cover"),
        ({"cover": np.array([np.nan, 1.0, 1.0])}, "cover"),
        ({"value": np.array([0.0, np.inf, 2.0])}, "leaf value"),
        ({"roots": np.array([3])}, "root"),
        ({"group": np.array([1])}, "group"),
        ({"roots": np.array([0, 0]), "group": np.array([0, 0])}, "reached twice"),
        ({"right": np.array([2, -1, 1])}, "both be -1"),
        ({"right": np.array([2, -1])}, "differ in length"),
        ({"base_margin": np.array([0.0, 1.0])}, "base_margin"),
        ({"n_groups": 0}, "n_groups"),
        ({"left": np.array([[1, -1, -1]])}, "1-D"),
    ],
)
def test_a_bad_table_is_refused_before_c_walks_it(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ShapForest(**_table(**changes))  # type: ignore[arg-type]


def test_the_table_cannot_be_changed_after_the_check() -> None:
    left = np.array([1, -1, -1])
    forest = ShapForest(**_table(left=left))  # type: ignore[arg-type]
    left[0] = 99  # the caller's array is not the one C reads
    assert forest.left[0] == 1
    with pytest.raises(ValueError):
        forest.left[0] = 99


def test_decisions_of_the_wrong_shape_are_refused() -> None:
    forest = ShapForest(**_table())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="decisions"):
        contributions(forest, np.zeros((2, 4), dtype=np.uint8))
    with pytest.raises(ValueError, match="shapes"):  # the C side checks shapes too
        _treeshap.shap(
            *(forest.left, forest.right, forest.feature, forest.cover, forest.value, forest.roots, forest.group),
            1,
            forest.depth,
            np.zeros((2, 3), dtype=np.uint8),
            np.zeros((3, 1, 2)),
        )
    with pytest.raises(TypeError):
        _treeshap.shap(
            *(forest.left, forest.right, forest.feature, forest.cover, forest.value, forest.roots, forest.group),
            1,
            forest.depth,
            np.zeros((2, 3), dtype=np.int64),
            np.zeros((2, 1, 2)),
        )


@settings(max_examples=examples(150), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 8).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(-2, n), min_size=n, max_size=n),
            st.lists(st.integers(-2, n), min_size=n, max_size=n),
            st.lists(st.integers(-2, 3), min_size=n, max_size=n),
            st.lists(st.one_of(st.floats(-1, 10), st.sampled_from([np.nan, np.inf])), min_size=n, max_size=n),
            st.lists(st.integers(-1, n), min_size=1, max_size=3),
            st.integers(0, 2),
        )
    )
)
def test_fuzzed_tables_are_refused_or_explained_additively(table: tuple) -> None:  # type: ignore[type-arg]
    left, right, feature, cover, roots, group = table
    try:
        forest = ShapForest(
            left=np.array(left),
            right=np.array(right),
            feature=np.array(feature),
            cover=np.array(cover),
            value=np.linspace(-1, 1, len(left)),
            roots=np.array(roots),
            group=np.full(len(roots), group),
            n_groups=2,
            feature_names=["a", "b", "c"],
            base_margin=np.zeros(2),
        )
    except ValueError:
        return
    decisions = np.random.default_rng(len(left)).integers(0, 2, size=(3, forest.n_nodes), dtype=np.uint8)
    got = contributions(forest, decisions)
    np.testing.assert_allclose(got.sum(axis=2), margin(forest, decisions), rtol=1e-9, atol=1e-9)


def test_the_gil_is_released_while_explaining() -> None:
    rng = np.random.default_rng(3)
    forest = random_forest(rng, 10, n_trees=200, max_depth=8)
    decisions = rng.integers(0, 2, size=(300, forest.n_nodes), dtype=np.uint8)
    ticks = 0
    done = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1

    counter = threading.Thread(target=count)
    counter.start()
    try:
        before = ticks
        contributions(forest, decisions)
        during = ticks - before
    finally:
        done.set()
        counter.join()
    assert during > 1000  # the counting thread ran while C explained 300 rows
