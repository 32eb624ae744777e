"""Explanation jobs through the scheduler (runtime/explanation.py): on threads, on the loop (RemoteV2-like
servables), never combined with scores; and the H2O kernel's decisions agree with its scores on fuzzed rows."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV, Contract
from forestflow.errors import CannotExplain
from forestflow.runtime.base import Servable, ServableMetadata
from forestflow.runtime.explanation import EXPLANATION, Explanation, describe, explain_call
from forestflow.runtime.h2o_mojo import H2OMojoServable
from forestflow.runtime.h2o_native import NativeTreeScorer
from forestflow.runtime.h2o_shap import shap_forest
from forestflow.runtime.h2o_tree_reader import read_tree_model
from forestflow.runtime.kernel_shap import KernelExplainer
from forestflow.runtime.scheduler import Priority, ServableScheduler
from tests.runtime.shap_oracle import margin
from tests.runtime.test_h2o_mojo import FIXTURES, FQ

W = np.array([2.0, -1.0, 0.5])


class Linear(Servable):
    """y = x @ W, on a thread or (``on_loop``) as a coroutine; records the threads and batch sizes it saw."""

    batchable = True
    inline_max_rows = 64

    def __init__(self, on_loop: bool = False) -> None:
        super().__init__(FQRV(Contract("t", "explain", 1), "r"), Path("."), {})
        self.runs_on_loop = on_loop
        self.threads: set[int] = set()
        self.calls: list[int] = []

    def load(self) -> None:
        self.ready = True

    def metadata(self) -> ServableMetadata:
        return ServableMetadata("linear", "test", (), ())

    def predict(self, frame: Frame) -> Frame:
        self.threads.add(threading.get_ident())
        self.calls.append(frame.num_rows)
        x = np.stack([frame[n] for n in "abc"], axis=1)
        return Frame({"y": x @ W})

    async def apredict(self, frame: Frame, timeout_s: float) -> Frame:
        await asyncio.sleep(0)
        return self.predict(frame)


def rows(*values: list[float]) -> Frame:
    return Frame({n: np.array([v[i] for v in values], dtype=np.float64) for i, n in enumerate("abc")})


def explainer(model: Linear) -> KernelExplainer:
    background = rows([0.0, 0.0, 0.0], [2.0, 4.0, -2.0])
    out = KernelExplainer(background, 50)
    out.prepare(model.predict)
    return out


@pytest.mark.parametrize("on_loop", [False, True])
async def test_kernel_explanations_run_as_scheduler_jobs(on_loop: bool) -> None:
    model = Linear(on_loop)
    kernel = explainer(model)
    scheduler = ServableScheduler(model, None, slots=1, live_queue=10, shadow_queue=10, max_batch_rows=100, coalesce_rows=100)
    try:
        work = explain_call(model, kernel)
        frame = rows([1.0, 1.0, 1.0])
        explained, scored = await asyncio.gather(
            scheduler.submit(frame, Priority.LIVE, 5.0, None, work), scheduler.submit(rows([3.0, 0.0, 0.0]), Priority.LIVE, 5.0)
        )
        explanation = explained.parameters[EXPLANATION]
        assert isinstance(explanation, Explanation) and explanation.method == "KernelSHAP"
        np.testing.assert_allclose(explanation.values[0, 0, :-1], W * (np.array([1.0, 1.0, 1.0]) - [1.0, 2.0, -1.0]), atol=1e-12)
        assert explained["y"].tolist() == [1.5] and scored["y"].tolist() == [6.0]
        assert EXPLANATION not in scored.parameters
        # The design (1 + 6 coalitions x 2 background rows) was scored in one call of its own.
        assert 13 in model.calls
    finally:
        await scheduler.close()


async def test_explanations_are_never_scored_on_the_loop() -> None:
    model = Linear()
    kernel = explainer(model)
    model.threads.clear()
    scheduler = ServableScheduler(model, None, slots=1, live_queue=10, shadow_queue=10)
    try:
        await scheduler.submit(rows([1.0, 1.0, 1.0]), Priority.LIVE, 5.0, None, explain_call(model, kernel))
        assert threading.get_ident() not in model.threads  # a tiny batch, still off the event loop
        await scheduler.submit(rows([1.0, 1.0, 1.0]), Priority.LIVE, 5.0)
        assert threading.get_ident() in model.threads  # a score of the same size is inlined
    finally:
        await scheduler.close()


def test_tree_groups_are_named_by_the_classes_they_explain() -> None:
    servable = H2OMojoServable(FQ, FIXTURES, {"mojoPath": "iris_gbm_multinomial.zip", "scorer": "native"})
    servable.load()
    frame = Frame({"Petal.Length": np.array([1.4, 5.1]), "Petal.Width": np.array([0.2, 2.0])})
    out = explain_call(servable, None)(frame)
    explanation = out.parameters[EXPLANATION]
    assert explanation.groups == ["Iris-setosa", "Iris-versicolor", "Iris-virginica"]
    assert explanation.values.shape == (2, 3, 6) and out["predict"].tolist() == ["Iris-setosa", "Iris-virginica"]
    assert describe(servable, None) == {"method": "TreeSHAP", "space": "margin"}


def test_a_servable_without_trees_or_explainer_cannot_explain() -> None:
    model = Linear()
    assert describe(model, None) is None
    with pytest.raises(CannotExplain, match="t.explain.1.r cannot explain"):
        explain_call(model, None)
    assert describe(model, explainer(model)) == {"method": "KernelSHAP", "backgroundRows": 2, "samples": 50, "space": "output"}


_MODEL = read_tree_model(FIXTURES / "prostate_gbm_highcard.zip")
HIGHCARD = (NativeTreeScorer(_MODEL), shap_forest(_MODEL))


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(
            st.one_of(
                st.floats(allow_nan=True, allow_infinity=True),
                st.integers(-(2**40), 2**40).map(float),
                st.integers(-3, 40).map(float),
            ),
            min_size=7,
            max_size=7,
        ),
        min_size=1,
        max_size=5,
    )
)
def test_the_h2o_kernels_decisions_lead_to_the_leaves_it_scores(values: list[list[float]]) -> None:
    """Any encoded row (levels out of range, huge, negative, NaN): decisions() and score() walk alike."""
    scorer, forest = HIGHCARD
    X = np.array(values)
    decisions = scorer.decisions(X)
    logit = margin(forest, decisions)[:, 0]
    p1 = scorer.score(X)[:, 2]
    np.testing.assert_allclose(1 / (1 + np.exp(-logit)), p1, rtol=1e-12, atol=1e-300)
