"""The padded walk of H2O trees (runtime/h2o_padded.py, _h2o_trees.c) against the node-table walk, bit for bit.

Random H2O trees of every split kind (numeric, categorical bitsets with offsets, NA-vs-rest, split
values that are NaN or infinite, deeper than the padded bound) and rows of split values, their
neighbours, NaN, infinities and levels out of range must score the same numbers both ways; so must
the committed fixtures. A layout whose indices point outside the tables is refused, never walked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forestflow.runtime import _h2o_trees
from forestflow.runtime.h2o_native import PADDED_FROM_ROWS, NativeTreeScorer, node_table
from forestflow.runtime.h2o_padded import h2o_layout
from forestflow.runtime.h2o_tree_reader import BITSET, LEAF, NA_VS_REST, NUMERIC, TreeTable, read_tree_model
from tests.runtime.test_h2o_mojo import FIXTURES
from tests.runtime.test_h2o_native import TREES
from tests.tiers import examples

FUZZ = settings(
    max_examples=examples(300), deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
_EDGES = [0.0, -0.0, 0.5, 1.0, 2.0, 3.0, -1.0, 1e300, -1e300, np.inf, -np.inf, 2.5e9, -2.5e9]
_VALUES = st.sampled_from(_EDGES) | st.floats(-4, 6, allow_nan=False)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.int64)


@st.composite
def h2o_trees(draw: Any) -> tuple[TreeTable, np.ndarray, int]:
    """Random trees of every split kind over 1-3 features (some categorical), up to depth 10."""
    n_features = draw(st.integers(1, 3))
    dom_len = np.array([draw(st.sampled_from([-1, 2, 3, 5])) for _ in range(n_features)], dtype=np.int64)
    rows: list[list[Any]] = []
    bits = bytearray()

    def node(depth: int, deep: int) -> int:
        k = len(rows)
        rows.append([LEAF, 0, False, draw(st.floats(-2, 2, width=32)), k, k, -1, 0, 0])
        if depth < deep and len(rows) < 80 and draw(st.integers(0, 4)) > 0:
            kind = draw(st.sampled_from([NUMERIC, NUMERIC, BITSET, NA_VS_REST]))
            col = draw(st.integers(0, n_features - 1))
            split = np.nan if draw(st.integers(0, 30)) == 0 else draw(_VALUES)
            start, offset, count = -1, 0, 0
            if kind == BITSET or (kind == NA_VS_REST and draw(st.booleans())):
                count = draw(st.integers(1, 12))
                start, offset = len(bits), draw(st.integers(0, 3))
                bits.extend(draw(st.binary(min_size=(count + 7) // 8, max_size=(count + 7) // 8)))
                split = -1.0
            rows[k] = [kind, col, draw(st.booleans()), split, 0, 0, start, offset, count]
            rows[k][4] = node(depth + 1, deep)
            rows[k][5] = node(depth + 1, deep)
        return k

    roots = [node(0, draw(st.integers(0, 10))) for _ in range(draw(st.integers(1, 4)))]
    kind, col, na_left, split, left, right, bstart, boff, bcount = (np.array(c) for c in zip(*rows))
    table = TreeTable(
        kind=kind.astype(np.int8),
        column=col.astype(np.int32),
        na_left=na_left.astype(bool),
        split=split.astype(np.float64),
        left=left.astype(np.int32),
        right=right.astype(np.int32),
        bits_start=bstart.astype(np.int32),
        bits_offset=boff.astype(np.int32),
        bits_count=bcount.astype(np.int32),
        bits=np.frombuffer(bytes(bits) or b"\0", dtype=np.uint8).copy(),
        roots=np.array(roots, dtype=np.int32),
        target=np.zeros(len(roots), dtype=np.int32),
    )
    return table, dom_len, draw(st.integers(0, 2))


@st.composite
def rows_for(draw: Any, table: TreeTable, n_features: int) -> np.ndarray:
    """Rows of split values, their neighbours, levels in and out of range, NaN and infinities."""
    finite = table.split[np.isfinite(table.split)].tolist()
    near = [v for s in finite for v in (s, np.nextafter(s, -np.inf), np.nextafter(s, np.inf))]
    pool = st.sampled_from(near + _EDGES + [np.nan, 4.0, 7.0, 0.7]) | _VALUES
    n = draw(st.integers(1, 40))
    row = st.lists(pool, min_size=n_features, max_size=n_features)
    return np.array(draw(st.lists(row, min_size=n, max_size=n)), dtype=np.float64)


def _sums(table: TreeTable, dom_len: np.ndarray, version: int, X: np.ndarray, layout: tuple[Any, ...] | None) -> np.ndarray:
    """The regression score0 (the tree sums) of X, padded when a layout is given."""
    params = np.array([0, 2, 0, 0.0, 1, 1, 0, 0, 0.5, version], dtype=np.float64)
    preds = np.zeros((len(X), 1))
    extra = (layout,) if layout is not None else ()
    one = np.zeros(1)
    nodes = node_table(table)
    ties = np.zeros(len(X), dtype=np.uint8)
    _h2o_trees.score(
        X,
        np.zeros(len(X)),
        nodes,
        table.split,
        table.bits,
        table.roots,
        table.target,
        dom_len,
        params,
        one,
        one,
        preds,
        ties,
        *extra,
    )
    return preds


@FUZZ
@given(h2o_trees(), st.data())
def test_padded_walk_equals_the_node_table_walk_on_random_trees(case: tuple[TreeTable, np.ndarray, int], data: Any) -> None:
    table, dom_len, version = case
    X = data.draw(rows_for(table, len(dom_len)))
    layout = h2o_layout(table, dom_len, version)
    assert np.array_equal(_bits(_sums(table, dom_len, version, X, layout.tables)), _bits(_sums(table, dom_len, version, X, None)))


@pytest.mark.parametrize("name", TREES)
def test_padded_walk_equals_the_node_table_walk_on_the_fixtures(name: str) -> None:
    from tests.runtime.test_h2o_mojo import INFOS

    model = read_tree_model(FIXTURES / INFOS[name]["mojo"])
    scorer = NativeTreeScorer(model)
    rng = np.random.default_rng(7)
    n = 500
    X = np.empty((n, scorer.n_features))
    for j, domain in enumerate(model.domains[: model.n_features]):
        X[:, j] = rng.normal(0, 60, n) if domain is None else rng.integers(-2, len(domain) + 3, n) + (rng.random(n) < 0.1) * 0.5
    X[rng.random(X.shape) < 0.1] = np.nan
    X[rng.random(X.shape) < 0.02] = np.inf
    padded, plain = scorer.score(X), scorer.score(X, padded=False)
    assert np.array_equal(_bits(padded), _bits(plain))
    assert scorer.layout.padded_trees > 0


def test_the_benchmark_gbm_is_padded_whole_categorical_splits_included() -> None:
    model = read_tree_model(FIXTURES / "prostate_gbm_binomial.zip")
    layout = NativeTreeScorer(model).layout
    assert (model.trees.kind == BITSET).any()
    assert layout.padded_trees == len(model.trees.roots)
    assert np.diff(layout.families)[2] > 0  # decision slots (the bitset splits)


def test_a_layout_that_points_outside_the_tables_is_refused() -> None:
    model = read_tree_model(FIXTURES / "prostate_gbm_binomial.zip")
    scorer = NativeTreeScorer(model)
    X = np.zeros((PADDED_FROM_ROWS, scorer.n_features))
    tables = scorer.layout.tables

    def refused(index: int, position: int, value: int, match: str) -> None:
        bad = [t.copy() for t in tables]
        bad[index].reshape(-1)[position] = value
        preds = np.zeros((len(X), scorer.preds_size))
        with pytest.raises(ValueError, match=match):
            _h2o_trees.score(
                X, np.zeros(len(X)), scorer._nodes, scorer._values, scorer._bits, scorer._roots, scorer._target, scorer._dom_len,
                scorer._params, scorer._prior, scorer._model_distrib, preds, np.zeros(len(X), dtype=np.uint8), tuple(bad),
            )  # fmt: skip
        for array in bad:
            array.flags.writeable = False
        with pytest.raises(ValueError, match=match):  # the tables held once are checked alike
            _h2o_trees.tables(
                scorer._nodes, scorer._values, scorer._bits, scorer._roots, scorer._target, scorer._dom_len, scorer._params,
                scorer._prior, scorer._model_distrib, scorer.preds_size, tuple(bad),
            )  # fmt: skip

    n_features, n_nodes = scorer.n_features, len(scorer._nodes)
    decision = int(tables[5][2])  # the first decision slot
    leaf = int(np.flatnonzero(scorer._nodes[:, 0] == LEAF)[0])
    refused(0, 0, 9, "depth is out of range")
    refused(1, 0, len(tables[4]), "slot is out of range")
    refused(3, 0, n_nodes, "leaf's node is out of range")
    refused(4, 0, n_features, "feature slot's source")
    refused(4, decision, n_features + leaf, "does not name an inner node")
    refused(4, decision, n_features + n_nodes, "source is out of range")
    refused(5, 3, 0, "not in order")
