"""Exact TreeSHAP of natively scored H2O GBM/DRF MOJOs (runtime/h2o_shap.py, _h2o_trees.decisions).

GBM binomial and regression against genmodel's own contributions (EasyPredictModelWrapper with
contributions enabled, float32: equal within float32 rounding) on the fixtures' golden rows, which
hold missing values, unseen levels and numeric strings. Every tree fixture: the values add up to the
margin the native scorer links to its prediction. Multinomial GBM and DRF (genmodel refuses or is
unreliable there): brute-force Shapley values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from forestflow.core.frame import Frame
from forestflow.errors import ServableNotReady
from forestflow.runtime import jvm
from forestflow.runtime.h2o_mojo import H2OMojoServable
from forestflow.runtime.h2o_shap import NotExplainable, node_covers, shap_forest
from forestflow.runtime.h2o_tree_reader import read_tree_model
from forestflow.runtime.treeshap import TreeExplainable, contributions
from tests.runtime.shap_oracle import brute_force_tree_shap
from tests.runtime.test_h2o_mojo import FIXTURES, FQ, INFOS, golden, text_frame

TREES = sorted(
    name
    for name, info in INFOS.items()
    if info.get("golden") and info["algo"] in ("gbm", "drf") and info["categorical_encoding"] == "AUTO"
)


def load(name: str, scorer: str = "native") -> H2OMojoServable:
    servable = H2OMojoServable(FQ, FIXTURES, {"mojoPath": INFOS[name]["mojo"], "scorer": scorer})
    servable.load()
    return servable


def features_only(name: str, rows: list[dict[str, str]]) -> Frame:
    """The golden rows without an offset column (the explained margin has no offset)."""
    frame = text_frame(name, rows)
    offset = INFOS[name].get("offset")
    return Frame({k: v for k, v in frame.columns.items() if k != offset})


def genmodel_contributions(name: str, rows: list[dict[str, str]]) -> np.ndarray:
    """genmodel's predictContributions for each row (text values exactly as the goldens hold them)."""
    jvm.ensure_jvm()
    model = jvm.jclass("hex.genmodel.MojoModel").load(str(FIXTURES / INFOS[name]["mojo"]))
    config = jvm.jclass("hex.genmodel.easy.EasyPredictModelWrapper$Config")().setModel(model).setEnableContributions(True)
    config.setConvertUnknownCategoricalLevelsToNa(True).setConvertInvalidNumbersToNa(True)
    wrapper = jvm.jclass("hex.genmodel.easy.EasyPredictModelWrapper")(config)
    row_data = jvm.jclass("hex.genmodel.easy.RowData")
    names = [str(n) for n in wrapper.getContributionNames()]
    out = []
    for row in rows:
        data = row_data()
        for column in INFOS[name]["inputs"]:
            if column.get("role") != "offset" and row[column["name"]]:
                data.put(column["name"], row[column["name"]])
        out.append(np.array(wrapper.predictContributions(data), dtype=np.float64))
    assert names[-1] == "BiasTerm"
    return np.array(out)


@pytest.mark.parametrize("name", ["prostate_gbm_binomial", "prostate_gbm_regression", "prostate_gbm_na_vs_rest"])
def test_gbm_contributions_equal_genmodels(name: str) -> None:
    servable = load(name)
    rows = golden(name)
    assert {r["kind"] for r in rows} >= {"data", "missing", "unseen"}
    forest, decisions = servable.shap_inputs(features_only(name, rows))
    ours = contributions(forest, decisions)[:, 0]
    reference = genmodel_contributions(name, rows)
    assert forest.feature_names == [c["name"] for c in INFOS[name]["inputs"] if c.get("role") != "offset"]
    # genmodel adds float32s: equal within float32 rounding of the row's largest terms.
    scale = np.abs(reference).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1, err_msg=name)  # same shape, same order
    assert (np.abs(ours - reference) <= 4 * np.finfo(np.float32).eps * scale).all(), np.abs(ours - reference).max()


def _margins_from_prediction(name: str, out: Frame) -> np.ndarray:
    """``[rows, groups]``: the margin the model linked to its prediction, recovered from the prediction."""
    model = read_tree_model(FIXTURES / INFOS[name]["mojo"])
    if model.category == "Regression":
        pred = out["predict"]
        return (np.log(pred) if model.link == "log" else pred)[:, None]
    probs = np.stack([v for k, v in out.columns.items() if k != "predict"], axis=1)  # the classes, in order
    if model.algo == "gbm" and model.category == "Binomial":
        return np.log(probs[:, 1] / probs[:, 0])[:, None]
    if model.algo == "drf" and model.category == "Binomial" and not model.binomial_double_trees:
        return probs[:, 1:]
    return probs  # softmax (GBM) or normalised votes (DRF): compared up to that map below


# balance_classes rescales the probabilities after the link: the margin cannot be read back from them.
@pytest.mark.parametrize("name", [n for n in TREES if not read_tree_model(FIXTURES / INFOS[n]["mojo"]).balance_classes])
def test_contributions_add_up_to_the_margin_of_every_tree_fixture(name: str) -> None:
    servable = load(name)
    rows = golden(name)
    frame = features_only(name, rows)
    forest, decisions = servable.shap_inputs(frame)
    values = contributions(forest, decisions)
    margins = values.sum(axis=2)
    expected = _margins_from_prediction(name, servable.predict(frame))
    model = read_tree_model(FIXTURES / INFOS[name]["mojo"])
    if model.category == "Multinomial" or (model.algo == "drf" and model.binomial_double_trees):
        if model.algo == "gbm":
            margins = np.exp(margins - margins.max(axis=1, keepdims=True))
        margins = margins / margins.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(margins, expected, rtol=1e-9, atol=1e-9, err_msg=name)


BRUTE_FORCE = ["iris_gbm_multinomial", "iris_drf_multinomial", "prostate_drf_binomial", "prostate_drf_regression"]


@pytest.mark.parametrize("name", BRUTE_FORCE)
def test_multinomial_and_drf_equal_brute_force_shapley(name: str) -> None:
    servable = load(name)
    rows = [r for r in golden(name) if r["kind"] in ("data", "missing")][::9][:3]
    forest, decisions = servable.shap_inputs(features_only(name, rows))
    np.testing.assert_allclose(contributions(forest, decisions), brute_force_tree_shap(forest, decisions), rtol=1e-9, atol=1e-12)


def test_a_natively_scored_tree_model_declares_it_explains() -> None:
    servable = load("prostate_gbm_binomial")
    assert servable.tree_explainable and isinstance(servable, TreeExplainable)
    assert servable.metadata().extra["explanations"] == "TreeSHAP"
    servable.unload()
    assert not servable.tree_explainable


@pytest.mark.slow
def test_a_genmodel_scored_model_does_not_explain_its_trees() -> None:
    servable = load("prostate_gbm_binomial", scorer="jvm")
    assert not servable.tree_explainable
    with pytest.raises(ServableNotReady):
        servable.shap_inputs(Frame({"AGE": np.array([60.0])}))


def test_covers_are_the_aux_node_weights() -> None:
    model = read_tree_model(FIXTURES / "prostate_gbm_binomial.zip")
    covers, t = node_covers(model), model.trees
    root = int(t.roots[0])
    assert covers[root] > 0
    splits = np.flatnonzero(t.kind != 0)
    # A split's weight is its children's (float32 sums).
    np.testing.assert_allclose(covers[splits], covers[t.left[splits]] + covers[t.right[splits]], rtol=1e-6)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda aux: [None] * len(aux), "no node weights"),
        (lambda aux: [a[:-3] if a else a for a in aux], "whole number"),
        (lambda aux: [a[40:] if a else a for a in aux], "no record for node 0"),
        (lambda aux: aux[:-1], "no node weights"),
    ],
)
def test_missing_or_broken_node_weights_make_a_model_unexplainable(mutate: Any, message: str) -> None:
    model = read_tree_model(FIXTURES / "prostate_gbm_binomial.zip")
    model.aux = mutate(model.aux)
    with pytest.raises(NotExplainable, match=message):
        shap_forest(model)
