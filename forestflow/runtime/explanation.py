"""How a release explains a batch: exact TreeSHAP for tree servables, KernelSHAP for declared explainers.

The Gateway asks :func:`explain_call` for the call that replaces ``predict`` for one explanation
request (run by the servable's scheduler like any scoring job: same queue, slots and deadline,
never on the event loop). The call answers the usual output frame with an :class:`Explanation`
in its parameters under :data:`EXPLANATION`; front-ends put it in their protocol's shape.
Only the ``TreeExplainable`` protocol is used for trees: any flavor that implements it explains.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from forestflow.core.frame import Frame
from forestflow.errors import CannotExplain
from forestflow.runtime.base import Servable
from forestflow.runtime.kernel_shap import KernelExplainer
from forestflow.runtime.treeshap import ShapForest, TreeExplainable, contributions

#: The output frame's parameter that holds the :class:`Explanation`.
EXPLANATION = "forestflow.explanation"
#: The name of the last value of each group (H2O's, for a familiar answer).
BIAS = "BiasTerm"


@dataclass(frozen=True, slots=True)
class Explanation:
    """Contributions of a batch: ``values[row, group, column]``, the bias last."""

    method: str  # "TreeSHAP" or "KernelSHAP"
    values: np.ndarray  # float64 [rows, groups, features + 1]
    features: list[str]
    groups: list[str]

    @property
    def names(self) -> list[str]:
        """Column names of the last axis: the features, then the bias."""
        return [*self.features, BIAS]

    def per_row(self) -> list[Any]:
        """JSON-ready: per row, ``{name: value}`` (one group) or ``{group: {name: value}}``."""
        names = self.names
        out: list[Any] = []
        for row in self.values.tolist():
            if len(row) == 1:
                out.append(dict(zip(names, row[0])))
            else:
                out.append({g: dict(zip(names, values)) for g, values in zip(self.groups, row)})
        return out


def describe(servable: Servable, explainer: KernelExplainer | None) -> dict[str, Any] | None:
    """What ``/metadata`` says of how the release explains (None: it cannot)."""
    if servable.tree_explainable and isinstance(servable, TreeExplainable):
        return {"method": "TreeSHAP", "space": "margin"}
    if explainer is not None:
        return {**explainer.describe(), "space": "output"}
    return None


def explain_call(servable: Servable, explainer: KernelExplainer | None) -> Callable[..., Any]:
    """The scheduler job that explains a batch on this release; CannotExplain (422) if it cannot."""
    if servable.tree_explainable and isinstance(servable, TreeExplainable):
        return lambda frame: _explain_trees(servable, frame)
    if explainer is not None:
        if servable.runs_on_loop:
            return lambda frame, timeout_s: _explain_kernel_on_loop(servable, explainer, frame, timeout_s)
        return lambda frame: _explain_kernel(servable, explainer, frame)
    raise CannotExplain(
        f"release {servable.fqrv} cannot explain: its model has no trees explained exactly (TreeSHAP) and its "
        'definition declares no explainer ("explainer": {"KernelShap": {"background": ..., "samples": ...}})'
    )


def _explain_trees(servable: Any, frame: Frame) -> Frame:
    out: Frame = servable.predict(frame)
    forest, decisions = servable.shap_inputs(frame)
    out.parameters[EXPLANATION] = Explanation(
        "TreeSHAP", contributions(forest, decisions), forest.feature_names, _groups(out, forest)
    )
    return out


def _groups(out: Frame, forest: ShapForest) -> list[str]:
    """Names of a forest's output groups: the answer's per-class outputs when there is one per group
    (a classifier's probability columns), else the group indices ("margin" for a single group)."""
    if forest.n_groups == 1:
        return ["margin"]
    numeric = [name for name, column in out.columns.items() if column.ndim == 1 and column.dtype.kind == "f"]
    return numeric if len(numeric) == forest.n_groups else [str(g) for g in range(forest.n_groups)]


def _explain_kernel(servable: Servable, explainer: KernelExplainer, frame: Frame) -> Frame:
    own, values, groups = explainer.explain(frame, servable.predict)
    own.parameters[EXPLANATION] = Explanation("KernelSHAP", values, explainer.features, groups)
    return own


async def _explain_kernel_on_loop(servable: Servable, explainer: KernelExplainer, frame: Frame, timeout_s: float) -> Frame:
    """A servable that scores on the loop (a remote backend): the design and the fit run in a thread."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    design, masks, weights = await asyncio.to_thread(explainer.design, frame)
    answer = await servable.apredict(design, max(0.0, deadline - loop.time()))

    own, values, groups = await asyncio.to_thread(explainer.finish, frame.num_rows, answer, masks, weights)
    own.parameters[EXPLANATION] = Explanation("KernelSHAP", values, explainer.features, groups)
    return own
