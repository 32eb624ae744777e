"""KernelSHAP (runtime/kernel_shap.py): exact on a linear model, brute-force Shapley on a nonlinear one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from forestflow.core.frame import Frame
from forestflow.errors import CreateServableRequestInvalidError, InvalidInput
from forestflow.runtime.kernel_shap import KernelExplainer, coalitions, read_background
from tests.runtime.shap_oracle import shapley

W = np.array([1.5, -2.0, 0.5, 3.0, -1.0])


def linear(frame: Frame) -> Frame:
    x = np.stack([frame[f"x{i}"] for i in range(len(W))], axis=1)
    return Frame({"y": x @ W + 0.25})


def nonlinear(frame: Frame) -> Frame:
    a, b, c, d = (frame[n].astype(np.float64) for n in "abcd")
    k = frame["kind"]
    bonus = np.where(k == "red", 1.0, 0.0)
    return Frame({"p": np.tanh(a * b) + np.maximum(c, 0.3) * d + bonus * a, "label": np.array(["z"] * len(a), dtype=object)})


def random_frame(rng: np.random.Generator, rows: int, names: list[str]) -> Frame:
    return Frame({n: rng.normal(size=rows) for n in names})


@pytest.mark.parametrize("samples", [2048, 40])  # 2^5 - 2 = 30 coalitions: enumerated, then sampled
def test_linear_model_gets_w_times_x_minus_mean(samples: int) -> None:
    rng = np.random.default_rng(1)
    names = [f"x{i}" for i in range(len(W))]
    background = random_frame(rng, 25, names)
    explainer = KernelExplainer(background, samples)
    explainer.prepare(linear)
    rows = random_frame(rng, 4, names)
    own, values, groups = explainer.explain(rows, linear)
    means = np.array([background[n].mean() for n in names])
    x = np.stack([rows[n] for n in names], axis=1)
    np.testing.assert_allclose(values[:, 0, :-1], W * (x - means), atol=1e-9)
    np.testing.assert_allclose(values[:, 0, -1], means @ W + 0.25, atol=1e-12)
    np.testing.assert_allclose(own["y"], linear(rows)["y"])
    assert groups == ["y"]


def test_nonlinear_model_equals_brute_force_shapley() -> None:
    rng = np.random.default_rng(2)
    background = Frame(
        {
            **{n: rng.normal(size=7) for n in "abcd"},
            "kind": np.array(["red", "blue", "red", "green", "blue", "red", "blue"], dtype=object),
        }
    )
    explainer = KernelExplainer(background, 1000)  # 2^5 - 2 = 30: every coalition
    explainer.prepare(nonlinear)
    rows = Frame({**{n: rng.normal(size=3) for n in "abcd"}, "kind": np.array(["red", "green", None], dtype=object)})
    _, values, groups = explainer.explain(rows, nonlinear)
    names = list(background.columns)
    for r in range(rows.num_rows):

        def value(known: frozenset[int], r: int = r) -> np.ndarray:
            mixed = {n: np.where(j in known, rows[n][r], background[n]) for j, n in enumerate(names)}
            return np.array([nonlinear(Frame(mixed))["p"].mean()])

        np.testing.assert_allclose(values[r], shapley(len(names), value), atol=1e-10)
    assert groups == ["p"]  # the string output is not explained


def test_sampled_coalitions_stay_additive() -> None:
    rng = np.random.default_rng(3)
    names = [f"f{i}" for i in range(9)]

    def model(frame: Frame) -> Frame:
        x = np.stack([frame[n] for n in names], axis=1)
        return Frame({"out": np.sin(x).prod(axis=1) + x[:, 0] * x[:, 1], "two": np.stack([x[:, 2], x[:, 3] ** 2], axis=1)})

    explainer = KernelExplainer(random_frame(rng, 10, names), 64)  # 510 coalitions: sampled
    explainer.prepare(model)
    rows = random_frame(rng, 3, names)
    own, values, groups = explainer.explain(rows, model)
    answer = model(rows)
    full = np.concatenate([answer["out"][:, None], answer["two"]], axis=1)
    np.testing.assert_allclose(values.sum(axis=2), full, atol=1e-9)
    assert groups == ["out", "two[0]", "two[1]"]
    assert values.shape == (3, 3, 10)


def test_coalitions_enumerate_or_pair() -> None:
    masks, weights = coalitions(4, 100, np.random.default_rng(0))
    assert len(masks) == 14 and len({m.tobytes() for m in masks}) == 14 and (weights > 0).all()
    masks, weights = coalitions(12, 50, np.random.default_rng(0))
    assert len(masks) == 50 and (masks[0::2] == ~masks[1::2]).all()
    assert ((masks.sum(axis=1) > 0) & (masks.sum(axis=1) < 12)).all()


def test_a_request_lacking_an_explained_column_is_refused() -> None:
    explainer = KernelExplainer(Frame({"a": np.zeros(2), "b": np.ones(2)}), 10)
    with pytest.raises(InvalidInput, match="lacks \\['b'\\]"):
        explainer.design(Frame({"a": np.zeros(1)}))


def test_an_explanation_scoring_too_many_rows_is_refused() -> None:
    explainer = KernelExplainer(Frame({"a": np.zeros(10), "b": np.ones(10)}), 10, max_rows=50)
    explainer.design(Frame({"a": np.zeros(2), "b": np.zeros(2)}))  # 2 x (1 + 2 x 10) = 42 rows
    with pytest.raises(InvalidInput, match="takes 63 model rows .* over the limit of 50"):
        explainer.design(Frame({"a": np.zeros(3), "b": np.zeros(3)}))


def test_background_from_csv_and_records(tmp_path: Path) -> None:
    (tmp_path / "bg.csv").write_text("a,kind\n1.5,red\n,blue\n2,\n")
    frame = read_background("bg.csv", tmp_path, 10)
    assert frame["a"][0] == 1.5 and np.isnan(frame["a"][1]) and frame["kind"].tolist() == ["red", "blue", None]
    assert read_background([{"a": 1}, {"a": 2}], tmp_path, 10)["a"].tolist() == [1.0, 2.0]
    with pytest.raises(CreateServableRequestInvalidError, match="not a file"):
        read_background("../bg.csv", tmp_path / "sub", 10)
    with pytest.raises(CreateServableRequestInvalidError, match="over kernel_shap_max_background"):
        read_background("bg.csv", tmp_path, 2)
