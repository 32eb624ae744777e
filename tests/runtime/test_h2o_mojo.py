"""H2OMojoServable's JVM scorer against real MOJOs and genmodel's own predictions (tests/fixtures/h2o).

The goldens were written by ``scripts/make_h2o_fixtures.py`` with ``EasyPredictModelWrapper``
(unknown levels and invalid numbers -> NA); a few extra cases ask genmodel directly through JPype.
No H2O cluster is started here.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract
from forestflow.errors import CreateServableRequestInvalidError, InvalidInput, ServableNotReady
from forestflow.runtime import inline_probe, jvm
from forestflow.runtime.h2o_inputs import parse_number
from forestflow.runtime.h2o_mojo import H2OMojoServable

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "h2o"
INFOS = {p.stem: json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))}
SCORED = sorted(name for name, info in INFOS.items() if info.get("golden"))
FQ = FQRV(Contract("tests", "h2o", 1), "r1")
RTOL = 1e-9


def make(mojo: str, directory: Path = FIXTURES, key: str = "mojoPath") -> H2OMojoServable:
    """An unloaded servable for a MOJO file in ``directory``, scored by genmodel in the JVM.

    (The native scorer of GBM/DRF models is tested in test_h2o_native.py.)
    """
    return H2OMojoServable(FQ, directory, {key: mojo, "version": "3.46.0.11", "scorer": "jvm"})


@pytest.fixture(scope="module")
def servables() -> dict[str, H2OMojoServable]:
    loaded = {}
    for name in SCORED:
        servable = make(INFOS[name]["mojo"])
        servable.load()
        loaded[name] = servable
    return loaded


def golden(name: str) -> list[dict[str, str]]:
    with (FIXTURES / INFOS[name]["golden"]).open(newline="") as fh:
        return list(csv.DictReader(fh))


def text_frame(name: str, rows: list[dict[str, str]]) -> Frame:
    """Every input as text, exactly as genmodel got it (blank = missing = None)."""
    return Frame({c["name"]: np.array([r[c["name"]] or None for r in rows], dtype=object) for c in INFOS[name]["inputs"]})


def typed_frame(name: str, rows: list[dict[str, str]]) -> Frame:
    """Numeric inputs as float64 arrays (NaN = missing), categoricals as strings."""
    columns = {}
    for c in INFOS[name]["inputs"]:
        cells = [r[c["name"]] for r in rows]
        if c["type"] == "numeric":
            columns[c["name"]] = np.array([_py_float(v) for v in cells], dtype=np.float64)
        else:
            columns[c["name"]] = np.array([v or None for v in cells], dtype=object)
    return Frame(columns)


def _py_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def assert_matches_golden(name: str, out: Frame, rows: list[dict[str, str]]) -> None:
    """Labels exactly, numbers within 1e-9 relative, for every golden output column."""
    for key in [k for k in rows[0] if k.startswith("out:")]:
        column = key[4:]
        expected = [r[key] for r in rows]
        if column.endswith("]"):
            base, idx = column[:-1].split("[")
            got = out[base][:, int(idx)]
        else:
            got = out[column]
        if got.dtype == object:
            assert list(got) == expected, f"{name} {column}"
        else:
            want = np.array([float(v) for v in expected])
            np.testing.assert_allclose(got.astype(np.float64), want, rtol=RTOL, atol=0, err_msg=f"{name} {column}")


def genmodel_predict(servable: H2OMojoServable, row: dict[str, Any]) -> Any:
    """genmodel's EasyPredict prediction for one row (values given to RowData as they are)."""
    from forestflow.runtime import jvm

    config = jvm.jclass("hex.genmodel.easy.EasyPredictModelWrapper$Config")().setModel(servable._model)
    config.setConvertUnknownCategoricalLevelsToNa(True).setConvertInvalidNumbersToNa(True)
    wrapper = jvm.jclass("hex.genmodel.easy.EasyPredictModelWrapper")(config)
    data = jvm.jclass("hex.genmodel.easy.RowData")()
    for key, value in row.items():
        data.put(key, value)
    return wrapper.predict(data)


# -- goldens -----------------------------------------------------------------------------------


def test_fixtures_cover_the_categories() -> None:
    categories = {INFOS[n]["category"] for n in SCORED}
    assert categories == {
        "Regression",
        "Binomial",
        "Multinomial",
        "Clustering",
        "AnomalyDetection",
        "AutoEncoder",
        "DimReduction",
    }
    for name in SCORED:
        kinds = {r["kind"] for r in golden(name)}
        assert {"data", "missing", "unseen", "numstr", "allna"} <= kinds, name


@pytest.mark.parametrize("name", SCORED)
def test_golden_rows_given_as_text(servables: dict[str, H2OMojoServable], name: str) -> None:
    rows = golden(name)
    out = servables[name].predict(text_frame(name, rows))
    assert out.num_rows == len(rows)
    assert out.parameters["unknown_inputs"] == []
    assert_matches_golden(name, out, rows)


@pytest.mark.parametrize("name", SCORED)
def test_golden_rows_given_typed(servables: dict[str, H2OMojoServable], name: str) -> None:
    rows = golden(name)
    assert_matches_golden(name, servables[name].predict(typed_frame(name, rows)), rows)


@pytest.mark.parametrize("name", ["prostate_gbm_binomial", "prostate_gbm_onehot", "prostate_kmeans", "prostate_pca"])
def test_categoricals_given_as_numbers(servables: dict[str, H2OMojoServable], name: str) -> None:
    """RACE/DPROS/DCAPS levels are "0".."4": 1.0 (or int 1) must mean level "1"."""
    rows = [r for r in golden(name) if r["kind"] in ("data", "missing", "allna")]
    frame = typed_frame(name, rows)
    for c in INFOS[name]["inputs"]:
        if c["type"] == "categorical":
            frame.columns[c["name"]] = np.array([_py_float(v) for v in (r[c["name"]] for r in rows)])
    assert_matches_golden(name, servables[name].predict(frame), rows)
    data = [r for r in rows if r["kind"] == "data"]
    as_ints = typed_frame(name, data)
    for c in INFOS[name]["inputs"]:
        if c["type"] == "categorical":
            as_ints.columns[c["name"]] = np.array([int(r[c["name"]]) for r in data], dtype=np.int16)
    assert_matches_golden(name, servables[name].predict(as_ints), data)


def test_numbers_for_categoricals_in_object_columns(servables: dict[str, H2OMojoServable]) -> None:
    s = servables["prostate_gbm_binomial"]
    base = {"AGE": 68.0, "PSA": 6.7, "VOL": 16.7, "GLEASON": 6.0, "RACE": "1", "DCAPS": "1"}
    mixed = np.array([3.0, 3, np.int64(3), "3", b"3", np.float32(3.0), None, 3.5, "x"], dtype=object)
    n = len(mixed)
    frame = Frame({**{k: np.array([v] * n, dtype=object) for k, v in base.items()}, "DPROS": mixed})
    out = s.predict(frame)
    one = genmodel_predict(s, {**base, "DPROS": "3"})
    na = genmodel_predict(s, base)
    want = [float(one.classProbabilities[1])] * 6 + [float(na.classProbabilities[1])] * 3
    np.testing.assert_allclose(out["1"], want, rtol=RTOL, atol=0)
    assert float(one.classProbabilities[1]) != float(na.classProbabilities[1])


def test_unseen_level_scores_like_missing(servables: dict[str, H2OMojoServable]) -> None:
    s = servables["iris_gbm_multinomial"]
    row = {"Sepal.Length": [5.9], "Sepal.Width": [3.0], "Petal.Length": [4.2], "Petal.Width": [1.5]}
    unseen = s.predict(Frame.from_columns({**row, "SepalSize": np.array(["gigantic"], dtype=object)}))
    missing = s.predict(Frame.from_columns({**row, "SepalSize": np.array([None], dtype=object)}))
    absent = s.predict(Frame.from_columns(row))
    for label in ("Iris-setosa", "Iris-versicolor", "Iris-virginica"):
        assert unseen[label][0] == missing[label][0] == absent[label][0]
    p = genmodel_predict(s, {k: v[0] for k, v in row.items()})
    assert unseen["predict"][0] == str(p.label)
    assert unseen["Iris-versicolor"][0] == pytest.approx(float(p.classProbabilities[1]), rel=RTOL)


def test_numeric_strings_follow_java_parsing() -> None:
    assert parse_number(" 7.5\t") == 7.5
    assert parse_number("1e3") == 1000.0
    assert parse_number("+2") == 2.0
    assert parse_number("2.5d") == 2.5
    assert parse_number("0x1.8p1") == 3.0
    assert parse_number("-Infinity") == -math.inf
    for bad in ("", "abc", "1_000", "inf", "nan", "1,5", "."):
        assert math.isnan(parse_number(bad)), bad


# -- inputs ------------------------------------------------------------------------------------


def test_unknown_inputs_are_listed_and_ignored(servables: dict[str, H2OMojoServable]) -> None:
    s = servables["prostate_gbm_regression"]
    rows = golden("prostate_gbm_regression")[:5]
    frame = text_frame("prostate_gbm_regression", rows)
    frame.columns["AGEE"] = np.array(["1"] * 5, dtype=object)
    frame.columns["ID"] = np.arange(5)
    frame.columns["PSA"] = np.ones(5)  # the response: sent along, not a typo, not used
    out = s.predict(frame)
    assert out.parameters["unknown_inputs"] == ["AGEE", "ID"]
    assert_matches_golden("prostate_gbm_regression", out, rows)


def test_missing_columns_are_na(servables: dict[str, H2OMojoServable]) -> None:
    s = servables["prostate_drf_regression"]
    out = s.predict(Frame.from_columns({"AGE": [68.0], "GLEASON": np.array([6], dtype=np.int8)}))
    p = genmodel_predict(s, {"AGE": 68.0, "GLEASON": 6.0})
    assert out["predict"][0] == pytest.approx(float(p.value), rel=RTOL)


def test_dtypes_and_shapes(servables: dict[str, H2OMojoServable]) -> None:
    s = servables["prostate_gbm_binomial"]
    rows = [r for r in golden("prostate_gbm_binomial") if r["kind"] == "data"]
    base = typed_frame("prostate_gbm_binomial", rows)
    expected = s.predict(base)["1"]
    variants = {
        "AGE": base["AGE"].astype(np.int32),
        "GLEASON": base["GLEASON"].astype(np.uint8).reshape(-1, 1),
        "RACE": np.array([r["RACE"] for r in rows]),  # a numpy unicode array
        "DPROS": np.array([r["DPROS"].encode() for r in rows], dtype=object),
        "VOL": np.array([r["VOL"] for r in rows], dtype=object),
    }
    for name, column in variants.items():
        frame = Frame({**base.columns, name: column})
        np.testing.assert_array_equal(s.predict(frame)["1"], expected, err_msg=name)
    with pytest.raises(InvalidInput, match="AGE"):
        s.predict(Frame({**base.columns, "AGE": np.ones((len(rows), 2))}))


def test_empty_batch(servables: dict[str, H2OMojoServable]) -> None:
    out = servables["prostate_gbm_binomial"].predict(Frame({"AGE": np.zeros(0)}))
    assert list(out.columns) == ["predict", "0", "1"] and out.num_rows == 0
    out = servables["prostate_autoencoder"].predict(Frame({}))
    assert out["reconstruction"].shape == (0, 16)


def test_batch_equals_single_rows(servables: dict[str, H2OMojoServable]) -> None:
    s = servables["prostate_gbm_binomial"]
    rng = np.random.default_rng(3)
    n = 300
    frame = Frame(
        {
            "AGE": rng.uniform(40, 90, n),
            "PSA": rng.uniform(0, 100, n),
            "VOL": rng.uniform(0, 80, n),
            "GLEASON": rng.integers(0, 10, n).astype(np.float64),
            "RACE": rng.choice(np.array(["0", "1", "2", None, "9"], dtype=object), n),
            "DPROS": rng.choice(np.array(["1", "2", "3", "4"], dtype=object), n),
            "DCAPS": rng.choice(np.array(["1", "2", None], dtype=object), n),
        }
    )
    frame.columns["AGE"][::7] = np.nan
    as_numbers = Frame(
        {
            **frame.columns,
            "DPROS": rng.choice(np.array([1.0, 2.0, 3.0, 4.0, 5.0, np.nan]), n).astype(np.float32),
            "PSA": np.array([f" {v:.3f}" if i % 5 else "n/a" for i, v in enumerate(frame["PSA"])], dtype=object),
        }
    )
    for f in (frame, as_numbers):
        batch = s.predict(f)
        singles = [s.predict(f.slice(i, i + 1)) for i in range(n)]
        assert list(batch["predict"]) == [o["predict"][0] for o in singles]
        np.testing.assert_array_equal(batch["1"], [o["1"][0] for o in singles])


# Models scored in batches (genmodel encodes the others' categoricals, row by row).
BATCHED = [name for name in SCORED if INFOS[name]["categorical_encoding"] == "AUTO"]


@pytest.mark.parametrize("name", BATCHED)
def test_java_batch_scorer_equals_score0_row_by_row(servables: dict[str, H2OMojoServable], name: str) -> None:
    """jvm.score_batch (one call to our BatchScorer) against genmodel's score0 called per row from here."""
    import jpype

    s = servables[name]
    assert s._batch
    rng = np.random.default_rng(11)
    n = 97
    X = np.empty((n, len(s._columns)))
    for j, col in enumerate(s._columns):
        X[:, j] = rng.integers(0, len(col.domain), n) if col.domain is not None else rng.normal(30.0, 20.0, n)
    X[::5, 0] = np.nan
    offsets = rng.normal(0.0, 1.0, n) if s._offset is not None else None
    got = jvm.score_batch(s._model, X, offsets, s._preds_size)
    doubles = jpype.JArray(jpype.JDouble)
    for i in range(n):
        out = doubles(s._preds_size)
        if offsets is None:
            s._model.score0(doubles(X[i]), out)
        else:
            s._model.score0(doubles(X[i]), float(offsets[i]), out)
        np.testing.assert_array_equal(got[i], np.array(out))


def test_java_helper_class_is_built_from_its_source() -> None:
    # scripts/gen_java.py compiles the class and records its source's hash: an edited source with
    # a stale class fails here.
    for name in jvm.JAVA_SOURCES:
        source = jvm.JAVA_DIR / name
        recorded = source.with_name(name + ".sha256").read_text().strip()
        assert hashlib.sha256(source.read_bytes()).hexdigest() == recorded, f"run scripts/gen_java.py after editing {name}"
    assert (jvm.JAVA_DIR / "forestflow" / "h2o" / "BatchScorer.class").is_file()


def test_offset_column(servables: dict[str, H2OMojoServable]) -> None:
    s = servables["prostate_glm_offset"]
    row = {
        "AGE": [65.0],
        "RACE": np.array(["1"], dtype=object),
        "DPROS": np.array(["2"], dtype=object),
        "VOL": [10.0],
        "GLEASON": [6.0],
    }
    without = s.predict(Frame.from_columns(row))["predict"][0]
    with_offset = s.predict(Frame.from_columns({**row, "OFFSET": [0.5]}))["predict"][0]
    assert with_offset - without == pytest.approx(0.5, rel=1e-12)  # gaussian GLM: identity link


# -- outputs and metadata ----------------------------------------------------------------------


@pytest.mark.parametrize("name", SCORED)
def test_output_types_and_metadata(servables: dict[str, H2OMojoServable], name: str) -> None:
    info, s = INFOS[name], servables[name]
    meta = s.metadata()
    assert meta.name == "prediction" and meta.platform == "h2o_mojo"
    assert [(t.name, t.datatype, t.domain) for t in meta.inputs] == [
        (c["name"], "BYTES" if c["type"] == "categorical" else "FP64", tuple(c["domain"]) if c["domain"] is not None else None)
        for c in info["inputs"]
    ]
    assert [(t.name, t.datatype, tuple(t.shape)) for t in meta.outputs] == [
        (o["name"], o["datatype"], tuple(o["shape"])) for o in info["outputs"]
    ]
    assert meta.extra["category"] == info["category"]
    out = s.predict(text_frame(name, golden(name)[:4]))
    assert list(out.columns) == [t.name for t in meta.outputs]
    dtypes = {"FP64": np.float64, "INT32": np.int32, "BYTES": object}
    for spec in meta.outputs:
        assert out[spec.name].dtype == dtypes[spec.datatype], spec.name
        assert out[spec.name].shape[1:] == tuple(spec.shape[1:]), spec.name


def test_servable_state(servables: dict[str, H2OMojoServable]) -> None:
    assert H2OMojoServable.max_concurrency == 2
    s = make("prostate_kmeans.zip", key="mojo_path")
    assert not s.ready
    with pytest.raises(ServableNotReady):
        s.metadata()
    s.load()
    assert s.ready and s.metadata().extra["scoring"] == "batch"
    assert servables["prostate_gbm_onehot"].metadata().extra["scoring"].startswith("per-row")
    s.unload()
    assert not s.ready
    with pytest.raises(ServableNotReady):
        s.predict(Frame({"AGE": np.ones(1)}))


def test_two_threads_score_at_once(servables: dict[str, H2OMojoServable]) -> None:
    s = servables["iris_gbm_multinomial"]
    rows = golden("iris_gbm_multinomial")
    frame = text_frame("iris_gbm_multinomial", rows)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(40):
                assert_matches_golden("iris_gbm_multinomial", s.predict(frame), rows)
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# -- load errors -------------------------------------------------------------------------------


def _load_error(directory: Path, mojo: str, key: str = "mojoPath") -> str:
    with pytest.raises(CreateServableRequestInvalidError) as info:
        make(mojo, directory, key).load()
    return str(info.value)


def test_bad_artifacts_are_refused_at_load(tmp_path: Path) -> None:
    good = (FIXTURES / "prostate_gbm_binomial.zip").read_bytes()
    (tmp_path / "truncated.zip").write_bytes(good[: len(good) // 2])
    assert "not a valid zip" in _load_error(tmp_path, "truncated.zip")
    garbled = bytearray(good)
    with zipfile.ZipFile(FIXTURES / "prostate_gbm_binomial.zip") as zf:
        start = zf.getinfo("model.ini").header_offset + 60
    garbled[start : start + 200] = bytes(200)
    (tmp_path / "garbled.zip").write_bytes(bytes(garbled))
    assert "garbled.zip" in _load_error(tmp_path, "garbled.zip")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as zf:
        zf.writestr("readme.txt", "not a model")
    assert "not an H2O MOJO" in _load_error(tmp_path, "other.zip")
    (tmp_path / "notes.zip").write_text("plain text")
    assert "not a valid zip" in _load_error(tmp_path, "notes.zip")
    assert "not found" in _load_error(tmp_path, "absent.zip")
    (tmp_path / "dir.zip").mkdir()
    assert "not a regular file" in _load_error(tmp_path, "dir.zip")
    assert "outside" in _load_error(tmp_path, "../prostate_gbm_binomial.zip")
    assert "relative" in _load_error(tmp_path, str(FIXTURES / "prostate_gbm_binomial.zip"))
    assert "mojoPath" in _load_error(tmp_path, "x.zip", key="file")


def test_unsupported_category_is_refused_at_load(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "prostate_glm_ordinal.zip", tmp_path / "model.zip")
    message = _load_error(tmp_path, "model.zip")
    assert "Ordinal" in message and "not supported" in message


def test_import_does_not_start_the_jvm() -> None:
    code = (
        "import forestflow.runtime.base, forestflow.runtime.h2o_mojo, forestflow.runtime.jvm as j, jpype\n"
        "assert not jpype.isJVMStarted() and not j.is_started()\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_forked_child_refuses_the_parents_jvm() -> None:
    code = (
        "import os\n"
        "from forestflow.runtime import jvm\n"
        "jvm.ensure_jvm()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n"
        "        jvm.ensure_jvm()\n"
        "    except jvm.JVMError as exc:\n"
        "        os._exit(3 if 'spawn' in str(exc) else 4)\n"
        "    os._exit(5)\n"
        "print(os.waitpid(pid, 0)[1] >> 8)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert done.stdout.strip() == "3", done.stderr


@pytest.mark.parametrize(("budget_s", "rows"), [(0.0, 0), (10.0, inline_probe.INLINE_ROWS)])
def test_jvm_models_decide_inline_scoring_by_a_timed_probe(monkeypatch: pytest.MonkeyPatch, budget_s: float, rows: int) -> None:
    """A genmodel-scored model only scores on the event loop when its probe batch is fast enough
    (issue 33 item 6): too slow for the budget -> 0, always on a thread."""
    monkeypatch.setattr(inline_probe, "INLINE_BUDGET_S", budget_s)
    s = make("prostate_glm_binomial.zip")
    s.load()
    try:
        assert s.inline_max_rows == rows
        assert s.metadata().extra["inlineMaxRows"] == rows
    finally:
        s.unload()
    native = H2OMojoServable(FQ, FIXTURES, {"mojoPath": "prostate_gbm_binomial.zip", "scorer": "native"})
    native.load()
    assert native.inline_max_rows == 128  # native trees keep their measured default
    native.unload()
