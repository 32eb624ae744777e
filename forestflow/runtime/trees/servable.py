"""The servable of the tree flavors (XGBoost, LightGBM, SKLearn): a model file read into a Forest,
scored by the C kernel, answered like the H2O flavor (``predict`` plus one probability per class
for classifiers, ``predict`` for regressors).

Definition: ``{"flavor": {"XGBoost": {"modelPath": "model.json"}}}`` (``LightGBM``, ``SKLearn``
alike), plus the micro-batching settings (``maxBatchRows``, ``maxBatchWaitUs``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from forestflow.core.frame import Frame, TensorSpec
from forestflow.core.ids import FQRV
from forestflow.errors import CreateServableRequestInvalidError, ServableNotReady
from forestflow.extras import needed_for
from forestflow.runtime.base import Servable, ServableMetadata
from forestflow.runtime.batching import BATCH_SETTINGS
from forestflow.runtime.model_file import model_path
from forestflow.runtime.trees.forest import ModelFileError
from forestflow.runtime.trees.inputs import InputMap
from forestflow.runtime.trees.model import Feature, TreeModel
from forestflow.runtime.trees.shap_forest import shap_forest, tiled_decisions
from forestflow.runtime.treeshap import ShapForest

_SETTINGS = ("modelPath", *BATCH_SETTINGS)


class TreeServable(Servable):
    """Scores a tree ensemble read by one of the readers; subclasses say how to read the file."""

    #: The flavor's JSON key and its platform name in metadata.
    flavor = ""
    platform = ""
    max_concurrency = 2
    #: A hundred-odd rows score in well under a millisecond: cheaper on the loop than a thread hop.
    inline_max_rows = 128
    reads_parameters = False
    batchable = True
    converts_inputs = True  # strings to category codes, numbers to the matrix: its own 400 names the model and field
    #: Exact TreeSHAP over the scored trees (``shap_inputs``).
    tree_explainable = True

    def __init__(self, fqrv: FQRV, artifact_dir: Path, settings: dict[str, Any]) -> None:
        super().__init__(fqrv, artifact_dir, settings)
        self.model: TreeModel | None = None
        self._inputs: InputMap | None = None
        self._meta: ServableMetadata | None = None
        self._classes: np.ndarray | None = None

    def read(self, path: Path) -> TreeModel:
        """The checked model in ``path`` (ModelFileError when it is not one this flavor scores)."""
        raise NotImplementedError

    def load(self) -> None:
        """Read and check the model file, warm the kernel, build the metadata."""
        path, shown = model_path(self, self.flavor, _SETTINGS)
        started = time.perf_counter()
        try:
            model = self.read(path)
        except _Delegate as exc:
            self._install_estimator(shown, str(exc))
            return
        except ModelFileError as exc:
            raise CreateServableRequestInvalidError(f"{self.flavor} model {shown!r}: {exc}") from None
        except OSError as exc:
            raise CreateServableRequestInvalidError(f"{self.flavor} model {shown!r} cannot be read: {exc.strerror}") from None
        self._install(model, shown, time.perf_counter() - started)

    def _install_estimator(self, shown: str, why: str) -> None:
        """Serve a model the tree engine does not score with its own code (only SKLearn can)."""
        raise CreateServableRequestInvalidError(f"{self.flavor} model {shown!r} cannot be scored natively: {why}")

    def _install(self, model: TreeModel, shown: str, seconds: float) -> None:
        self.model = model
        self._inputs = InputMap(model.features)
        self._classes = None if model.classes is None else np.array(model.classes, dtype=object)
        model.forest.score(self._inputs.dummy(64))  # touches every table once
        facts = {**model.facts, "modelPath": shown, "scorer": "native", "loadSeconds": round(seconds, 3)}
        self._meta = self._build_metadata(model.features, facts)
        self.ready = True

    def unload(self) -> None:
        self.model = None
        super().unload()

    # -- scoring -----------------------------------------------------------------------------

    def predict(self, frame: Frame) -> Frame:
        """Score every row of ``frame``: one output row per input row, in order."""
        model, inputs = self.model, self._inputs
        if model is None or inputs is None:
            raise ServableNotReady(f"servable {self.fqrv} is not loaded")
        X, unknown, missing = inputs.matrix(frame)
        return Frame(self._outputs(model.forest.score(X)), {"unknown_inputs": unknown, "missing_inputs": missing})

    def _outputs(self, out: np.ndarray) -> dict[str, np.ndarray]:
        classes = self._classes
        if classes is None:
            return {"predict": np.ascontiguousarray(out[:, 0])}
        if out.shape[1] == 1:  # binary: the forest gives the second class's probability
            p1 = out[:, 0]
            p0 = 1.0 - p1
            probs = [p0, p1]
            best = (p1 > p0).astype(np.intp)  # argmax: the first class on a tie
        else:
            probs = [np.ascontiguousarray(out[:, k]) for k in range(out.shape[1])]
            best = np.argmax(out, axis=1)
        columns = {"predict": classes[best]}
        for label, p in zip(classes.tolist(), probs):
            columns[label] = p
        return columns

    def shap_inputs(self, frame: Frame) -> tuple[ShapForest, np.ndarray]:
        """The forest and the decisions of this batch's rows (same input checks as predict)."""
        model, inputs = self.model, self._inputs
        if model is None or inputs is None:
            raise ServableNotReady(f"servable {self.fqrv} is not loaded")
        X, _, _ = inputs.matrix(frame)
        forest = model.forest
        return shap_forest(forest, inputs.names), tiled_decisions(forest, forest.decisions(X))

    # -- metadata ----------------------------------------------------------------------------

    def metadata(self) -> ServableMetadata:
        if self._meta is None:
            raise ServableNotReady(f"servable {self.fqrv} is not loaded")
        return self._meta

    def _build_metadata(self, features: list[Feature], facts: dict[str, Any]) -> ServableMetadata:
        inputs = []
        for f in features:
            if f.categories is not None:
                inputs.append(TensorSpec(f.name, "BYTES", (-1,), "categorical", f.categories))
            elif f.categorical:
                inputs.append(TensorSpec(f.name, "FP64", (-1,), "categorical (integer codes)"))
            else:
                inputs.append(TensorSpec(f.name, "FP64", (-1,), "numeric"))
        if self._classes is None:
            outputs = [TensorSpec("predict", "FP64", (-1,), "predicted value")]
            kind = "regressor"
        else:
            labels = tuple(self._classes.tolist())
            outputs = [TensorSpec("predict", "BYTES", (-1,), "predicted label", labels)]
            outputs += [TensorSpec(c, "FP64", (-1,), f"probability of class {c}") for c in labels]
            kind = "classifier"
        return ServableMetadata(
            name="prediction",
            platform=self.platform,
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            description=(
                f"{facts.get('library', self.flavor)} {kind} ({facts.get('objective', '')}, "
                f"{facts.get('trees')} trees), scored natively"
            ),
            extra=facts,
        )


class XGBoostServable(TreeServable):
    """An XGBoost model saved as JSON or UBJSON (``flavor: {"XGBoost": {"modelPath": "model.json"}}``)."""

    flavor = "XGBoost"
    platform = "xgboost"

    def read(self, path: Path) -> TreeModel:
        from forestflow.runtime.trees import xgboost_reader

        return xgboost_reader.read_file(path)


class LightGBMServable(TreeServable):
    """A LightGBM text model (``flavor: {"LightGBM": {"modelPath": "model.txt"}}``)."""

    flavor = "LightGBM"
    platform = "lightgbm"

    def read(self, path: Path) -> TreeModel:
        from forestflow.runtime.trees import lightgbm_reader

        return lightgbm_reader.read_file(path)


class SKLearnServable(TreeServable):
    """A pickled scikit-learn estimator (``flavor: {"SKLearn": {"modelPath": "model.joblib"}}``).

    Unpickling runs code, so the flavor is off unless the gateway allows the Python flavor.
    RandomForest, ExtraTrees, GradientBoosting and (numeric) HistGradientBoosting classifiers and
    regressors are scored by the tree engine; any other estimator by its own ``predict_proba``
    (classifiers) or ``predict``.
    """

    flavor = "SKLearn"
    platform = "sklearn"

    def __init__(self, fqrv: FQRV, artifact_dir: Path, settings: dict[str, Any]) -> None:
        super().__init__(fqrv, artifact_dir, settings)
        self._estimator: Any = None

    def load(self) -> None:
        gate = getattr(self.gateway_settings, "allow_python", None)
        if gate is False:
            raise CreateServableRequestInvalidError(
                "the SKLearn flavor is disabled on this gateway (unpickling a model runs code); "
                "start it with FORESTFLOW_ALLOW_PYTHON=1 to allow it"
            )
        super().load()

    def read(self, path: Path) -> TreeModel:
        from forestflow.runtime.trees import sklearn_reader

        estimator = _unpickle(path)
        try:
            return sklearn_reader.read_estimator(estimator)
        except sklearn_reader.NotNative as exc:
            self._estimator = estimator
            raise _Delegate(str(exc)) from None

    def _install_estimator(self, shown: str, why: str) -> None:
        from forestflow.runtime.trees.sklearn_reader import features_of

        est = self._estimator
        features = features_of(est)
        self._inputs = InputMap(features)
        classes = getattr(est, "classes_", None) if hasattr(est, "predict_proba") else None
        self._classes = None if classes is None else np.array([str(c) for c in classes], dtype=object)
        self.inline_max_rows = 0  # arbitrary estimator code: scored on a thread
        self.tree_explainable = False  # no trees of ours to explain
        facts = {"library": "scikit-learn", "estimator": type(est).__name__, "modelPath": shown, "scorer": "estimator"}
        facts["nativeUnavailable"] = why
        self._meta = self._build_metadata(features, facts)
        self.predict(Frame({f.name: np.zeros(1) for f in features}))
        self.ready = True

    def predict(self, frame: Frame) -> Frame:
        """The tree engine's answer, or the estimator's own for one it does not score natively."""
        if self._estimator is None:
            return super().predict(frame)
        inputs = self._inputs
        if inputs is None:
            raise ServableNotReady(f"servable {self.fqrv} is not loaded")
        X, unknown, missing = inputs.matrix(frame)
        est = self._estimator
        if getattr(est, "feature_names_in_", None) is not None:  # fitted on a DataFrame: give it one
            try:
                import pandas as pd
            except ImportError:
                pass
            else:
                X = pd.DataFrame(X, columns=inputs.names)
        out = est.predict_proba(X) if self._classes is not None else np.asarray(est.predict(X), dtype=np.float64).reshape(-1, 1)
        return Frame(self._outputs(np.asarray(out, dtype=np.float64)), {"unknown_inputs": unknown, "missing_inputs": missing})

    def shap_inputs(self, frame: Frame) -> tuple[ShapForest, np.ndarray]:
        if self._estimator is not None:
            raise NotImplementedError(f"{type(self._estimator).__name__} is scored by its own code: no tree explanations")
        return super().shap_inputs(frame)

    def unload(self) -> None:
        self._estimator = None
        super().unload()


class _Delegate(Exception):
    """The estimator is scored by its own methods (the reason is the message)."""


def _unpickle(path: Path) -> Any:
    with needed_for("an SKLearn model"):  # the estimators' classes are scikit-learn's; joblib comes with it
        import joblib
        import sklearn  # noqa: F401

    try:
        return joblib.load(path)
    except (ModuleNotFoundError, ImportError) as exc:
        raise ModelFileError(f"cannot be unpickled here: {exc}") from None
    except Exception as exc:  # a corrupt, truncated or foreign pickle
        raise ModelFileError(f"not a readable pickle: {type(exc).__name__}: {exc}") from None
