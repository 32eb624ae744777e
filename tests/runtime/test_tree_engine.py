"""The tree engine: readers refuse damaged files with a ModelFileError (fuzzed), the C kernel's
check refuses unsafe tables (fuzzed), decisions and the ShapForest reproduce the scores, and a
served XGBoost or LightGBM model imports none of the libraries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV
from forestflow.runtime import _forest
from forestflow.runtime.flavors import create_servable
from forestflow.runtime.trees import lightgbm_reader, ubjson, xgboost_reader
from forestflow.runtime.trees.codes import CATEGORICAL, FLAGS, IDENTITY
from forestflow.runtime.trees.forest import ModelFileError
from forestflow.runtime.trees.servable import TreeServable
from forestflow.runtime.trees.shap_forest import ShapForest
from tests import tree_models
from tests.tiers import examples
from tests.tree_models import TreeCase

FUZZ = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, TreeCase]]:
    directory = tmp_path_factory.mktemp("engine-models")
    built = [
        tree_models.xgb_binary(directory),
        tree_models.xgb_multiclass(directory),
        tree_models.lgb_multiclass(directory),
        tree_models.sk_rf_classifier(directory),
    ]
    return directory, {c.name: c for c in built}


def servable(directory: Path, case: TreeCase) -> TreeServable:
    s = create_servable(case.flavor, FQRV.parse("t.m.1.r1"), directory, {"modelPath": case.file})
    assert isinstance(s, TreeServable)
    s.load()
    return s


def mutate(data: bytes, cut: int, flips: list[tuple[int, int]]) -> bytes:
    buf = bytearray(data[: max(1, len(data) * cut // 100)])
    for pos, value in flips:
        buf[pos % len(buf)] = value
    return bytes(buf)


def read_or_refuse(read: object, data: bytes, path: Path) -> None:
    path.write_bytes(data)
    try:
        model = read(path)  # type: ignore[operator]  # a reader's read_file
    except ModelFileError:
        return
    X = np.full((3, model.forest.n_features), np.nan)
    X[1] = 0.5
    assert model.forest.score(X).shape == (3, model.forest.n_groups)


@FUZZ
@given(cut=st.integers(1, 100), flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=4))
def test_damaged_xgboost_json_and_ubjson_are_refused_or_read(
    models: tuple[Path, dict[str, TreeCase]], tmp_path: Path, cut: int, flips: list[tuple[int, int]]
) -> None:
    directory, cases = models
    for file in (cases["xgb_binary"].file, cases["xgb_multiclass"].file):  # JSON and UBJSON
        read_or_refuse(xgboost_reader.read_file, mutate((directory / file).read_bytes(), cut, flips), tmp_path / file)


@FUZZ
@given(cut=st.integers(1, 100), flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.sampled_from(b"-0129 .=\n~x")), max_size=4))
def test_damaged_lightgbm_text_is_refused_or_read(
    models: tuple[Path, dict[str, TreeCase]], tmp_path: Path, cut: int, flips: list[tuple[int, int]]
) -> None:
    directory, cases = models
    data = (directory / cases["lgb_multiclass"].file).read_bytes()
    read_or_refuse(lightgbm_reader.read_file, mutate(data, cut, flips), tmp_path / "model.txt")


@settings(max_examples=examples(200), deadline=None)
@given(st.binary(max_size=64))
def test_ubjson_reader_refuses_garbage_cleanly(data: bytes) -> None:
    try:
        ubjson.loads(data)
    except ubjson.UBJSONError:
        pass


@settings(max_examples=examples(150), deadline=None)
@given(
    st.lists(st.tuples(st.integers(-2, 6), st.integers(-2, 6), st.integers(-1, 3), st.integers(0, 7)), min_size=1, max_size=7),
    st.lists(st.integers(-1, 7), min_size=1, max_size=3),
)
def test_kernel_check_refuses_unsafe_tables(nodes: list[tuple[int, int, int, int]], roots: list[int]) -> None:
    table = np.zeros((len(nodes), 6), dtype=np.int32)
    for k, (left, right, feature, flags) in enumerate(nodes):
        table[k, :4] = (feature, left, right, flags)
        table[k, 4:] = (0, 1)  # one bitset word for categorical nodes
    n = len(nodes)
    args = (
        table,
        np.zeros(n),
        np.ones((n, 1)),
        np.array([5], dtype=np.uint32),
        np.array(roots, dtype=np.int32),
        np.zeros(len(roots), dtype=np.int32),
        np.ones(len(roots)),
    )
    try:
        _forest.check(*args, 3, 1)
    except ValueError:
        return
    params = np.array([1, 0, IDENTITY, 1, 1, 0, 3, 1], dtype=np.float64)
    out = np.empty((2, 1))
    X = np.array([[0.0, 1.0, np.nan], [np.nan, -1.0, 2.0]])
    _forest.score(X, *args, params, np.zeros(1), out)  # safe tables: the walk ends at leaves
    assert np.isfinite(out).all()


def margins(forest: ShapForest, decisions: np.ndarray) -> np.ndarray:
    """Each row's margin per group, by walking the ShapForest along the decisions."""
    out = np.tile(forest.base_margin, (decisions.shape[0], 1))
    for i, row in enumerate(decisions):
        for root, group in zip(forest.roots.tolist(), forest.group.tolist()):
            node = root
            while forest.left[node] >= 0:
                node = forest.right[node] if row[node] else forest.left[node]
            out[i, group] += forest.value[node]
    return out


@pytest.mark.parametrize("name", ["xgb_binary", "xgb_multiclass", "lgb_multiclass", "sk_rf_multiclass"])
def test_shap_inputs_walk_to_the_scored_margins(models: tuple[Path, dict[str, TreeCase]], name: str) -> None:
    directory, cases = models
    case = cases[name]
    s = servable(directory, case)
    frame = Frame.from_columns({k: [np.nan if v is None else v for v in vs] for k, vs in case.columns.items()})
    forest, decisions = s.shap_inputs(frame)
    assert decisions.dtype == np.uint8 and decisions.shape == (case.rows, len(forest.left))
    assert forest.feature_names == [f.name for f in s.model.features]  # type: ignore[union-attr]
    walked = margins(forest, decisions)
    engine = s.model.forest  # type: ignore[union-attr]
    raw = np.empty((case.rows, engine.n_groups))
    X, _, _ = s._inputs.matrix(frame)  # type: ignore[union-attr]
    params = engine.params.copy()
    params[1:3] = (0, IDENTITY)  # double sums, no link: the margin
    _forest.score(X, *engine.tables, params, engine.base, raw)
    np.testing.assert_allclose(walked, raw, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", ["xgb_binary", "xgb_multiclass", "lgb_multiclass", "sk_rf_multiclass"])
def test_padded_trees_score_what_the_node_table_scores(models: tuple[Path, dict[str, TreeCase]], name: str) -> None:
    """The trained models' trees are walked padded where exact (xgb_binary's all split on a category), and score
    the node-table walk's outputs bit for bit."""
    directory, cases = models
    case = cases[name]
    s = servable(directory, case)
    forest = s.model.forest  # type: ignore[union-attr]
    ends = [*forest.roots.tolist(), len(forest.nodes)]
    categorical = np.array([bool(np.any(forest.nodes[a:b, FLAGS] & CATEGORICAL)) for a, b in zip(ends, ends[1:])], dtype=bool)
    depths = forest.layout.trees[:, 0]
    # Categorical trees keep the node-table walk; so do scikit-learn's "missing only" splits (threshold +inf).
    assert np.all(depths[categorical] < 0) and np.any(depths >= 0) == (name != "xgb_binary")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(70, forest.n_features))
    X[rng.random(X.shape) < 0.2] = np.nan
    X[rng.random(X.shape) < 0.1] = 0.0
    for rows in (X, X[:1], X[:17]):
        assert forest.score(rows).tobytes() == forest.score(rows, padded=False).tobytes()


def test_a_garbage_pickle_is_a_model_file_error(tmp_path: Path) -> None:
    (tmp_path / "m.joblib").write_bytes(b"\x80\x04garbage")
    s = create_servable("SKLearn", FQRV.parse("t.m.1.r1"), tmp_path, {"modelPath": "m.joblib"})
    with pytest.raises(Exception, match="'m.joblib': not a readable pickle"):
        s.load()


def test_served_models_import_no_library(models: tuple[Path, dict[str, TreeCase]]) -> None:
    directory, cases = models
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from forestflow.core.frame import Frame\n"
        "from forestflow.core.ids import FQRV\n"
        "from forestflow.runtime.flavors import create_servable\n"
        f"for flavor, file in (('XGBoost', {cases['xgb_binary'].file!r}), ('LightGBM', {cases['lgb_multiclass'].file!r})):\n"
        f"    s = create_servable(flavor, FQRV.parse('t.m.1.r1'), Path({str(directory)!r}), {{'modelPath': file}})\n"
        "    s.load()\n"
        "    s.predict(Frame.from_columns({'a': [1.0], 'b': [2.0], 'color': ['red']}))\n"
        "print(sorted(m for m in ('xgboost', 'lightgbm', 'sklearn', 'pandas', 'scipy') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
