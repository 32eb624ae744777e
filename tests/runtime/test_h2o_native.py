"""The native scorer of H2O GBM/DRF MOJOs against genmodel: goldens, score0 itself, scorer choice, no Java.

The goldens (tests/fixtures/h2o, written by scripts/make_h2o_fixtures.py) are genmodel's own
predictions; here the native scorer must give the same labels and numbers within 1e-12
relative. It is also compared with genmodel's ``score0`` (through JPype) on random rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from forestflow.core.frame import Frame
from forestflow.errors import CreateServableRequestInvalidError
from forestflow.runtime import jvm
from forestflow.runtime.h2o_mojo import H2OMojoServable
from forestflow.runtime.h2o_native import _JavaRandom, break_tie
from forestflow.runtime.h2o_tree_reader import BITSET, NA_VS_REST, read_tree_model
from forestflow.settings import Settings, SettingsError
from tests.runtime.test_h2o_mojo import FIXTURES, FQ, INFOS, golden, text_frame, typed_frame

RTOL = 1e-12
TREES = sorted(
    name
    for name, info in INFOS.items()
    if info.get("golden") and info["algo"] in ("gbm", "drf") and info["categorical_encoding"] == "AUTO"
)
ROOT = Path(__file__).resolve().parents[2]


def make(mojo: str, scorer: str | None = None, gateway: str | None = None) -> H2OMojoServable:
    settings: dict[str, str] = {"mojoPath": mojo}
    if scorer is not None:
        settings["scorer"] = scorer
    if gateway is not None:
        settings["gatewayScorer"] = gateway
    return H2OMojoServable(FQ, FIXTURES, settings)


@pytest.fixture(scope="module")
def native() -> dict[str, H2OMojoServable]:
    loaded = {}
    for name in TREES:
        loaded[name] = make(INFOS[name]["mojo"], "native")
        loaded[name].load()
    return loaded


def assert_golden(name: str, out: Frame, rows: list[dict[str, str]]) -> None:
    """Labels exactly, numbers within 1e-12 relative."""
    for key in [k for k in rows[0] if k.startswith("out:")]:
        column, expected = key[4:], [r[key] for r in rows]
        got = out[column]
        if got.dtype == object:
            assert list(got) == expected, f"{name} {column}"
        else:
            want = np.array([float(v) for v in expected])
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=0, err_msg=f"{name} {column}")


def test_fixtures_cover_the_tree_cases() -> None:
    models = {name: read_tree_model(FIXTURES / INFOS[name]["mojo"]) for name in TREES}
    assert {m.distribution for m in models.values() if m.algo == "gbm"} >= {
        "bernoulli",
        "multinomial",
        "gaussian",
        "poisson",
        "gamma",
        "tweedie",
        "laplace",
        "quantile",
        "huber",
    }
    assert any(m.algo == "gbm" and m.n_classes >= 4 for m in models.values())
    assert any(m.algo == "drf" and m.category == "Binomial" and not m.binomial_double_trees for m in models.values())
    assert any(m.algo == "drf" and m.binomial_double_trees for m in models.values())
    assert any(m.algo == "drf" and m.category == "Multinomial" for m in models.values())
    assert sum(m.offset_column is not None for m in models.values()) >= 3
    assert any(m.balance_classes for m in models.values())
    high = models["prostate_gbm_highcard"]
    assert max(len(d) for d in high.domains[:-1] if d) > 32
    t = high.trees
    assert ((t.kind == BITSET) & ((t.bits_count > 32) | (t.bits_offset > 0))).sum() > 0  # the large bitset form
    assert (models["prostate_gbm_na_vs_rest"].trees.kind == NA_VS_REST).sum() > 0
    for name in TREES:  # missing values in every input column among the goldens
        rows = golden(name)
        for c in INFOS[name]["inputs"]:
            assert any(r[c["name"]] == "" for r in rows), (name, c["name"])


@pytest.mark.parametrize("name", TREES)
def test_golden_rows(native: dict[str, H2OMojoServable], name: str) -> None:
    rows = golden(name)
    s = native[name]
    assert s.metadata().extra["scorer"] == "native"
    assert_golden(name, s.predict(text_frame(name, rows)), rows)
    assert_golden(name, s.predict(typed_frame(name, rows)), rows)
    one = s.predict(text_frame(name, rows[:1]))  # the one-row input path
    assert_golden(name, one, rows[:1])


def _random_rows(s: H2OMojoServable, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = np.empty((n, len(s._columns)))
    for j, col in enumerate(s._columns):
        if col.domain is not None:
            X[:, j] = rng.integers(-1, len(col.domain) + 2, n)  # out-of-domain codes too
        else:
            X[:, j] = rng.normal(30.0, 30.0, n).round(rng.integers(0, 3))
    X[rng.random(X.shape) < 0.15] = np.nan
    return X


@pytest.mark.parametrize("name", TREES)
def test_native_equals_genmodel_score0(native: dict[str, H2OMojoServable], name: str) -> None:
    """On random rows (NAs, levels outside the domain, offsets) the native scorer is genmodel's score0."""
    s = native[name]
    model = jvm.jclass("hex.genmodel.MojoModel").load(str(FIXTURES / INFOS[name]["mojo"]))
    X = _random_rows(s, 300, seed=len(name))
    offsets = np.random.default_rng(5).normal(0.0, 0.5, len(X)) if s._offset is not None else None
    want = jvm.score_batch(model, X, offsets, s._preds_size)
    got = s._native.score(X, offsets)
    np.testing.assert_array_equal(got[:, 0] if s._classes is not None else 0, want[:, 0] if s._classes is not None else 0)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=0)


def test_ties_are_broken_as_genmodel_does() -> None:
    """Tie-breaking against genmodel's own GenModel.getPredictionMultinomial and java.util.Random."""
    random = jvm.jclass("java.util.Random")
    for seed in (0, 1, -7, 2**40 + 3, -(2**62)):
        ours, theirs = _JavaRandom(seed), random(seed)
        assert [ours.next_double() for _ in range(3)] == [float(theirs.nextDouble()) for _ in range(3)]
    gen_model = jvm.jclass("hex.genmodel.GenModel")
    import jpype

    doubles = jpype.JArray(jpype.JDouble)
    rng = np.random.default_rng(1)
    for case in range(200):
        k = int(rng.integers(3, 6))
        p = np.concatenate([[0.0], rng.choice([0.1, 0.2, 0.25, 0.4], k)])
        row = rng.normal(0, 10, 4)
        row[case % 4] = np.nan
        prior = list(rng.dirichlet(np.ones(k))) if case % 2 else None
        want = int(gen_model.getPredictionMultinomial(doubles(p), None if prior is None else doubles(prior), doubles(row)))
        assert break_tie(p, row, prior) == want, (p, row, prior)


def test_auto_picks_native_for_trees_and_the_jvm_for_the_rest() -> None:
    gbm = make("prostate_gbm_binomial.zip", gateway="auto")
    gbm.load()
    meta = gbm.metadata()
    assert meta.extra["scorer"] == "native" and "natively" in meta.description
    assert meta.extra["loadSeconds"] >= 0 and "compileSeconds" not in meta.extra
    glm = make("prostate_glm_binomial.zip")  # no setting at all = auto
    glm.load()
    assert glm.metadata().extra["scorer"] == "jvm" and "JVM" in glm.metadata().description
    assert "GBM and DRF" in glm.metadata().extra["nativeUnavailable"]
    onehot = make("prostate_gbm_onehot.zip")
    onehot.load()
    assert onehot.metadata().extra["scorer"] == "jvm"  # genmodel encodes its categoricals
    forced = make("prostate_gbm_binomial.zip", gateway="jvm")
    forced.load()
    assert forced.metadata().extra["scorer"] == "jvm"
    own = make("prostate_gbm_binomial.zip", scorer="native", gateway="jvm")  # the servable's own choice wins
    own.load()
    assert own.metadata().extra["scorer"] == "native"
    rows = golden("prostate_gbm_binomial")
    a, b = own.predict(text_frame("prostate_gbm_binomial", rows)), forced.predict(text_frame("prostate_gbm_binomial", rows))
    assert list(a["predict"]) == list(b["predict"])
    np.testing.assert_allclose(a["1"], b["1"], rtol=RTOL, atol=0)
    # The same outputs and inputs in the metadata whichever scorer serves the model.
    for field in ("inputs", "outputs", "name", "platform"):
        assert getattr(own.metadata(), field) == getattr(forced.metadata(), field)


def test_native_refuses_what_it_cannot_score() -> None:
    with pytest.raises(CreateServableRequestInvalidError, match="cannot be scored natively.*GBM and DRF"):
        make("prostate_glm_binomial.zip", gateway="native").load()
    with pytest.raises(CreateServableRequestInvalidError, match="cannot be scored natively.*encoding"):
        make("prostate_gbm_onehot.zip", scorer="native").load()
    with pytest.raises(CreateServableRequestInvalidError, match="scorer 'fast'"):
        make("prostate_gbm_binomial.zip", scorer="fast").load()


def edited_mojo(
    tmp_path: Path,
    source: str,
    edit: Callable[[str], str] | None = None,
    files: dict[str, Callable[[bytes], bytes]] | None = None,
    name: str | None = None,
) -> str:
    """A copy of a fixture MOJO whose model.ini went through ``edit`` and whose other files went through
    ``files[file name]``; returns its file name."""
    target = tmp_path / (name or f"edited_{source}")
    with zipfile.ZipFile(FIXTURES / source) as src, zipfile.ZipFile(target, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "model.ini" and edit is not None:
                data = edit(data.decode()).encode()
            if files and item.filename in files:
                data = files[item.filename](data)
            dst.writestr(item, data)
    return target.name


def test_calibrated_and_unknown_mojos_go_to_genmodel(tmp_path: Path) -> None:
    """A MOJO carrying calibration, or a newer tree format, is refused natively; auto hands it to the JVM."""
    calibrated = edited_mojo(
        tmp_path,
        "prostate_gbm_binomial.zip",
        lambda ini: ini.replace("[columns]", "calib_method = platt\ncalib_glm_beta = [1.5, -0.5]\n\n[columns]"),
    )
    newer = edited_mojo(
        tmp_path, "prostate_drf_regression.zip", lambda ini: ini.replace("mojo_version = 1.40", "mojo_version = 1.50")
    )
    for mojo, reason in ((calibrated, "calibrated"), (newer, "newer")):
        with pytest.raises(CreateServableRequestInvalidError, match=reason):
            H2OMojoServable(FQ, tmp_path, {"mojoPath": mojo, "scorer": "native"}).load()
    auto = H2OMojoServable(FQ, tmp_path, {"mojoPath": calibrated})
    auto.load()
    assert auto.metadata().extra["scorer"] == "jvm" and "calibrated" in auto.metadata().extra["nativeUnavailable"]


def test_a_tree_pointing_outside_the_model_is_refused(tmp_path: Path) -> None:
    """The compiled walk checks no bounds: a tree naming a column the model lacks never reaches it."""
    target = tmp_path / "bad_tree.zip"
    with zipfile.ZipFile(FIXTURES / "prostate_gbm_binomial.zip") as src, zipfile.ZipFile(target, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "trees/t00_000.bin":
                data = data[:1] + (999).to_bytes(2, "little") + data[3:]  # the root's column
            dst.writestr(item, data)
    with pytest.raises(CreateServableRequestInvalidError, match="column 999"):
        H2OMojoServable(FQ, tmp_path, {"mojoPath": target.name, "scorer": "native"}).load()


def test_the_c_kernel_checks_its_arguments() -> None:
    """Wrong types or shapes reach the C kernel only as a clear TypeError/ValueError, never a crash."""
    from forestflow.runtime import _h2o_trees
    from forestflow.runtime.h2o_native import NativeTreeScorer

    scorer = NativeTreeScorer(read_tree_model(FIXTURES / "prostate_gbm_binomial.zip"))
    n, f, w = 2, scorer.n_features, scorer.preds_size
    tables = (
        scorer._nodes,
        scorer._values,
        scorer._bits,
        scorer._roots,
        scorer._target,
        scorer._dom_len,
        scorer._params,
        scorer._prior,
        scorer._model_distrib,
    )

    def call(X: object = None, offsets: object = None, preds: object = None, ties: object = None, **swap: object) -> None:
        named = dict(zip(("nodes", "values", "bits", "roots", "target", "dom_len", "params", "prior", "model_distrib"), tables))
        named.update(swap)
        _h2o_trees.score(
            np.zeros((n, f)) if X is None else X,
            np.zeros(n) if offsets is None else offsets,
            *named.values(),
            np.zeros((n, w)) if preds is None else preds,
            np.zeros(n, dtype=np.uint8) if ties is None else ties,
        )

    call()  # the arguments as the scorer passes them
    with pytest.raises(TypeError, match="X must be a 2-D array of 'd'"):
        call(X=np.zeros((n, f), dtype=np.float32))
    with pytest.raises(TypeError, match="X must be a C-contiguous"):
        call(X=np.zeros((f, n)).T)
    with pytest.raises(TypeError, match="preds must be a C-contiguous writable"):
        readonly = np.zeros((n, w))
        readonly.flags.writeable = False
        call(preds=readonly)
    with pytest.raises(ValueError, match="shapes do not fit"):
        call(X=np.zeros((n, f + 1)))
    with pytest.raises(ValueError, match="shapes do not fit"):
        call(offsets=np.zeros(n + 1))
    with pytest.raises(TypeError, match="nodes must be a 2-D array of 'i'"):
        call(nodes=scorer._nodes.astype(np.int64))
    with pytest.raises(TypeError):
        _h2o_trees.score(1, 2, 3)
    bad = scorer._nodes.copy()
    bad[0, 3] = len(bad)  # the root's left child past the table
    with pytest.raises(ValueError, match="a node refers outside the tables"):
        _h2o_trees.check_tables(bad, scorer._values, scorer._bits, scorer._roots, scorer._target, f, w)
    with pytest.raises(ValueError, match="root or target is out of range"):
        _h2o_trees.check_tables(scorer._nodes, scorer._values, scorer._bits, scorer._roots, scorer._target, f, 1)


def test_gateway_setting() -> None:
    assert Settings().h2o_scorer == "auto"
    assert Settings.load(environ={"FORESTFLOW_H2O_SCORER": "native"}).h2o_scorer == "native"
    with pytest.raises(SettingsError, match="h2o_scorer"):
        Settings.load(environ={"FORESTFLOW_H2O_SCORER": "java"})


def test_two_threads_score_at_once(native: dict[str, H2OMojoServable]) -> None:
    name = "prostate_gbm_multinomial4"
    rows = golden(name)
    frame = text_frame(name, rows)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(50):
                assert_golden(name, native[name].predict(frame), rows)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


_NO_JAVA = r"""
import json, sys
from pathlib import Path
import numpy as np
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract
from forestflow.errors import CreateServableRequestInvalidError
from forestflow.runtime import jvm
from forestflow.runtime.h2o_mojo import H2OMojoServable
fixtures = Path(sys.argv[1])
fq = FQRV(Contract("t", "h2o", 1), "r1")
out = {}
s = H2OMojoServable(fq, fixtures, {"mojoPath": "prostate_gbm_multinomial4.zip"})
s.load()
frame = Frame({"AGE": np.array([65.0, np.nan]), "PSA": np.array([1.4, 20.0]), "VOL": np.array([0.0, 30.0]),
               "GLEASON": np.array([6.0, 7.0]), "RACE": np.array(["1", None], dtype=object),
               "DCAPS": np.array(["1", "2"], dtype=object)})
pred = s.predict(frame)
out["scorer"] = s.metadata().extra["scorer"]
out["labels"] = [str(v) for v in pred["predict"]]
out["probs"] = [float(pred[c][0]) for c in ("1", "2", "3", "4")]
out["jvm_started"] = jvm.is_started()
out["jpype_imported"] = "jpype" in sys.modules
import jpype._jvmfinder as finder
# This machine has Java; make JPype's own search find none (no JAVA_HOME, nothing on PATH,
# no /usr/bin/java, no /usr/lib/jvm), as on a machine without it.
finder.LinuxJVMFinder._java = "/nonexistent/bin/java"
finder.LinuxJVMFinder._locations = ()
try:
    H2OMojoServable(fq, fixtures, {"mojoPath": "prostate_glm_binomial.zip"}).load()
    out["glm"] = "loaded"
except CreateServableRequestInvalidError as exc:
    out["glm"] = str(exc)
print(json.dumps(out))
"""


def test_native_path_needs_no_java(native: dict[str, H2OMojoServable]) -> None:
    """With no java on PATH, no JAVA_HOME and no JVM to be found: trees score, other models get a clear 422."""
    path = os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not os.path.exists(os.path.join(d, "java"))
    )
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "JDK_HOME", "JRE_HOME")}
    env.update(PATH=path, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", _NO_JAVA, str(FIXTURES)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["scorer"] == "native" and out["jvm_started"] is False and out["jpype_imported"] is False
    # Same numbers as in this process (where genmodel is around).
    here = native["prostate_gbm_multinomial4"]
    frame = Frame(
        {
            "AGE": np.array([65.0]),
            "PSA": np.array([1.4]),
            "VOL": np.array([0.0]),
            "GLEASON": np.array([6.0]),
            "RACE": np.array(["1"], dtype=object),
            "DCAPS": np.array(["1"], dtype=object),
        }
    )
    expected = here.predict(frame)
    assert out["probs"] == [float(expected[c][0]) for c in ("1", "2", "3", "4")]
    assert out["labels"][0] == expected["predict"][0]
    assert "needs Java" in out["glm"] and "only GBM and DRF" in out["glm"] and "JVM" in out["glm"], out["glm"]
