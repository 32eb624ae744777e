"""The H2O MOJO flavor: scores GBM/DRF MOJOs natively, everything else with genmodel in a JVM.

Which scorer serves a model is chosen at load (``h2o_scorer``: auto, jvm, native; a servable's
flavor object may say ``"scorer"``): GBM and DRF models go to the native scorer
(``h2o_native``: the trees read from the zip and walked in compiled code, exactly genmodel's
``score0``, no Java at all) unless it cannot score them; the rest uses genmodel through JPype.

On the JVM path a batch crosses into Java in one call: the frame becomes one flat ``double[]`` of rows
(categoricals as domain indices, NA as NaN, mapped here in numpy) and our small
``forestflow.h2o.BatchScorer`` class (``runtime/java``) runs ``GenModel.score0`` over every row on
the Java side. Models whose categoricals are encoded by genmodel
itself (one-hot, binary, ... encodings, GAM) are scored row by row through
``EasyPredictModelWrapper``, like ForestFlow did. Either way unseen levels and unparsable numbers
are NA (ForestFlow's ``convertUnknownCategoricalLevelsToNa`` / ``convertInvalidNumbersToNa``).
"""

from __future__ import annotations

import logging
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from forestflow.core.frame import Frame, TensorSpec
from forestflow.errors import CreateServableRequestInvalidError, PredictionFailed, ServableNotReady
from forestflow.runtime import inline_probe, jvm
from forestflow.runtime.base import Servable, ServableMetadata
from forestflow.runtime.h2o_inputs import NA, UNSEEN, ModelColumn, build_matrix, missing_columns
from forestflow.runtime.h2o_tree_reader import InvalidMojo, NativeUnsupported, parse_model_ini

if TYPE_CHECKING:
    from forestflow.runtime.h2o_native import NativeTreeScorer
    from forestflow.runtime.treeshap import ShapForest

log = logging.getLogger(__name__)

#: Model categories this flavor scores; anything else is refused at load.
SUPPORTED_CATEGORIES = (
    "Regression",
    "Binomial",
    "Multinomial",
    "Clustering",
    "AutoEncoder",
    "DimReduction",
    "AnomalyDetection",
)
_WARM_ROWS = 256
_WARM_SMALL_CALLS = 600
#: Values of the ``h2o_scorer`` setting and of a servable's ``"scorer"``.
SCORERS = ("auto", "jvm", "native")


def _java_message(exc: BaseException) -> str:
    """A one-line description of a (Java or Python) exception."""
    name = type(exc).__name__
    try:
        name = str(exc.getClass().getName())  # type: ignore[attr-defined]  # a Java exception (JPype) has getClass
    except Exception:
        pass
    text = str(exc).strip().splitlines()
    return f"{name}: {text[0]}" if text else name


def _describe_mojo(path: Path) -> str:
    """ "<algo> <category>" from the MOJO's model.ini, for error messages (never raises)."""
    try:
        with zipfile.ZipFile(path) as zf:
            info, _, _ = parse_model_ini(zf.read("model.ini").decode("utf-8", "replace"))
        return f"{info.get('algo', '?')} {info.get('category', '?')}"
    except Exception:
        return "an H2O model"


class H2OMojoServable(Servable):
    """A servable that scores an H2O MOJO (``flavor: {"H2OMojo": {"mojoPath": "model.zip"}}``)."""

    #: Two scoring threads on a 2-core machine; JPype releases the GIL during Java calls.
    max_concurrency = 2
    #: Natively scored trees: up to a hundred-odd rows score in well under a millisecond: on the
    #: event loop that costs less than the hop to a thread and the GIL handed back and forth with it
    #: (measured with bench/run.py, one core: 100-row /score 1365 -> 1164 us of CPU per request, V2
    #: 1000 -> 774). A genmodel-scored (JVM) model sets its own at load from a timed probe.
    inline_max_rows = 128
    reads_parameters = False
    #: A batch crosses into Java (or the native scorer) in one call: concurrent requests may share it.
    batchable = True
    #: Numbers for a categorical (as their text) and numeric strings for a number are read as genmodel reads them.
    converts_inputs = True

    def __init__(self, fqrv: Any, artifact_dir: Path, settings: dict[str, Any]) -> None:
        super().__init__(fqrv, artifact_dir, settings)
        self._model: Any = None
        self._wrapper: Any = None
        self._category = ""
        self._columns: list[ModelColumn] = []
        self._index: dict[str, int] = {}
        self._offset: str | None = None
        self._requires_offset = False
        self._response: str | None = None
        self._classes: np.ndarray | None = None
        #: The probability columns' names (``str`` of each class), made once: iterating the object
        #: array per request went through numpy's sequence protocol and its IndexError at the end.
        self._class_names: tuple[str, ...] = ()
        self._preds_size = 0
        self._batch = True
        self._meta: ServableMetadata | None = None
        self._native: NativeTreeScorer | None = None
        self._shap_forest: ShapForest | None = None

    # -- loading -----------------------------------------------------------------------------

    def _mojo_path(self) -> Path:
        body = self.settings
        if isinstance(body.get("H2OMojo"), dict):  # tolerate the whole flavor object
            body = body["H2OMojo"]
        raw = body.get("mojoPath", body.get("mojo_path"))
        if not isinstance(raw, str) or not raw.strip():
            raise CreateServableRequestInvalidError(
                'the H2OMojo flavor needs "mojoPath": the MOJO file name inside the servable directory'
            )
        if Path(raw).is_absolute():
            raise CreateServableRequestInvalidError(f"mojoPath {raw!r} must be relative to the servable directory")
        base = Path(self.artifact_dir).resolve()
        path = (base / raw).resolve()
        if not path.is_relative_to(base):
            raise CreateServableRequestInvalidError(f"mojoPath {raw!r} points outside the servable directory")
        if not path.exists():
            raise CreateServableRequestInvalidError(f"MOJO file {raw!r} not found in the servable directory")
        if not path.is_file():
            raise CreateServableRequestInvalidError(f"mojoPath {raw!r} is not a regular file")
        if not zipfile.is_zipfile(path):
            raise CreateServableRequestInvalidError(f"MOJO file {raw!r} is not a valid zip archive (corrupt or not a MOJO)")
        try:
            with zipfile.ZipFile(path) as zf:
                if "model.ini" not in zf.namelist():
                    raise CreateServableRequestInvalidError(f"{raw!r} is a zip archive but not an H2O MOJO (it has no model.ini)")
        except zipfile.BadZipFile as exc:
            raise CreateServableRequestInvalidError(f"MOJO file {raw!r} is a corrupt zip archive: {exc}") from None
        return path

    def _scorer_choice(self) -> str:
        """auto, jvm or native: the servable's own ``"scorer"``, else the gateway's ``h2o_scorer``."""
        nested = self.settings.get("H2OMojo")
        body: dict[str, Any] = nested if isinstance(nested, dict) else self.settings
        choice = body.get("scorer", self.settings.get("gatewayScorer", "auto"))
        if choice not in SCORERS:
            raise CreateServableRequestInvalidError(f"scorer {choice!r} is not one of {', '.join(SCORERS)}")
        return str(choice)

    def load(self) -> None:
        """Load the MOJO with the scorer chosen for it, check its category, warm it up, mark it ready."""
        path = self._mojo_path()
        choice = self._scorer_choice()
        why_not_native = "the jvm scorer was asked for"
        if choice != "jvm":
            try:
                self._load_native(path)
                return
            except NativeUnsupported as exc:
                why_not_native = str(exc)
            except InvalidMojo as exc:  # malformed: not handed to genmodel either
                raise CreateServableRequestInvalidError(f"MOJO file {path.name!r} is invalid: {exc}") from None
            except CreateServableRequestInvalidError:
                raise
            except Exception as exc:  # a MOJO the reader does not understand: genmodel may
                why_not_native = f"the native reader failed: {type(exc).__name__}: {exc}"
                log.warning("native H2O scorer cannot read %s (%s)", path.name, why_not_native)
            if choice == "native":
                raise CreateServableRequestInvalidError(
                    f"{path.name!r} cannot be scored natively (h2o_scorer = native): {why_not_native}"
                )
        self._load_jvm(path, why_not_native)

    def _load_native(self, path: Path) -> None:
        """Read a GBM/DRF MOJO into the native scorer (no JVM); NativeUnsupported if it cannot."""
        from forestflow.runtime.h2o_native import NativeTreeScorer
        from forestflow.runtime.h2o_tree_reader import read_tree_model

        started = time.perf_counter()
        model = read_tree_model(path)
        scorer = NativeTreeScorer(model)
        self._category = model.category
        features = model.columns[: model.n_features]
        self._columns = [ModelColumn.make(n, d) for n, d in zip(features, model.domains)]
        self._index = {c.name: j for j, c in enumerate(self._columns)}
        self._offset = model.offset_column
        self._requires_offset = False  # a missing offset is 0 in the native scorer
        self._response = model.response
        self._preds_size = model.preds_size
        if model.category in ("Binomial", "Multinomial"):
            domain = model.domains[-1] if model.response is not None else None
            self._set_classes(list(domain) if domain is not None else ["0", "1"])
        self._batch = True
        self._native = scorer
        explains = self._load_shap_forest(model)
        try:
            scorer.warm()
            self._warm()
        except Exception as exc:
            self._native = None
            raise CreateServableRequestInvalidError(f"{path.name!r} failed to score a warm-up row natively: {exc}") from None
        facts = {
            "category": model.category,
            "algorithm": model.algo,
            "h2oVersion": model.h2o_version,
            "mojoVersion": model.mojo_version,
            "uuid": model.uuid,
            "mojoPath": path.name,
            "categoricalEncoding": "AUTO",
            "response": self._response,
            "offsetColumn": self._offset,
            "scoring": "batch",
            "scorer": "native",
            "trees": int(len(model.trees.roots)),
            "explanations": explains,
            "loadSeconds": round(time.perf_counter() - started, 3),
        }
        self._meta = self._build_metadata(facts)
        self.ready = True

    def _load_shap_forest(self, model: Any) -> str:
        """Prepare exact TreeSHAP (node weights from the MOJO's aux files); says how the model explains."""
        from forestflow.runtime.h2o_shap import NotExplainable, shap_forest

        try:
            self._shap_forest = shap_forest(model)
        except (NotExplainable, ValueError) as exc:
            self._shap_forest = None
            self.tree_explainable = False
            return f"none: {exc}"
        self.tree_explainable = True
        return "TreeSHAP"

    def shap_inputs(self, frame: Frame) -> tuple[ShapForest, np.ndarray]:
        """The forest and the decisions of this batch's rows (``runtime.treeshap.TreeExplainable``)."""
        if self._native is None or self._shap_forest is None:
            raise ServableNotReady(f"servable {self.fqrv} cannot explain its trees")
        X, _, _ = build_matrix(frame, self._columns, self._offset, NA, self._index)
        return self._shap_forest, self._native.decisions(X)

    def _load_jvm(self, path: Path, why_not_native: str) -> None:
        """Load the MOJO with genmodel in the in-process JVM."""
        name = path.name
        try:
            jvm.ensure_jvm()
        except jvm.JVMError as exc:
            raise CreateServableRequestInvalidError(
                f"{name!r} ({_describe_mojo(path)}) needs Java: only GBM and DRF MOJOs are scored without it "
                f"({why_not_native}); {exc}"
            ) from exc
        try:
            model = jvm.jclass("hex.genmodel.MojoModel").load(str(path))
        except Exception as exc:
            raise CreateServableRequestInvalidError(f"cannot load {name!r} as an H2O MOJO: {_java_message(exc)}") from None
        category = str(model.getModelCategory().name())
        if category not in SUPPORTED_CATEGORIES:
            raise CreateServableRequestInvalidError(
                f"H2O model category {category} ({model._algoName}) is not supported; "
                f"supported: {', '.join(SUPPORTED_CATEGORIES)}"
            )
        config = jvm.jclass("hex.genmodel.easy.EasyPredictModelWrapper$Config")().setModel(model)
        config.setConvertUnknownCategoricalLevelsToNa(True).setConvertInvalidNumbersToNa(True)
        try:
            wrapper = jvm.jclass("hex.genmodel.easy.EasyPredictModelWrapper")(config)
        except Exception as exc:
            raise CreateServableRequestInvalidError(f"cannot prepare {name!r} for scoring: {_java_message(exc)}") from None

        self._model, self._wrapper, self._category = model, wrapper, category
        provider = jvm.jclass("hex.genmodel.ConverterFactoryProvidingModel")
        encoding = str(model.getCategoricalEncoding().name())
        self._batch = encoding == "AUTO" and not isinstance(model, provider)
        self._columns = self._input_columns(model)
        self._index = {c.name: j for j, c in enumerate(self._columns)}
        offset = model.getOffsetName()
        self._offset = str(offset) if offset is not None else None
        self._response = str(model.getResponseName()) if model.isSupervised() else None
        self._requires_offset = bool(model.requiresOffset())
        self._preds_size = int(model.getPredsSize(model.getModelCategory()))
        if category in ("Binomial", "Multinomial"):
            domain = model.getDomainValues(model.getResponseIdx())
            labels = [str(d) for d in domain] if domain is not None else ["0", "1"]  # quasibinomial: no domain
            self._set_classes(labels)
        facts = {
            "category": category,
            "algorithm": str(model._algoName),
            "h2oVersion": str(model._h2oVersion),
            "mojoVersion": float(model._mojo_version),
            "uuid": str(model.getUUID()) if model.getUUID() is not None else None,
            "mojoPath": name,
            "categoricalEncoding": encoding,
            "response": self._response,
            "offsetColumn": self._offset,
            "scoring": "batch" if self._batch else "per-row EasyPredictModelWrapper",
            "scorer": "jvm",
            "nativeUnavailable": why_not_native,
        }
        self._meta = self._build_metadata(facts)
        try:
            self._warm()
            self.inline_max_rows = self._inline_rows()
        except Exception as exc:
            self._model = self._wrapper = None
            raise CreateServableRequestInvalidError(f"{name!r} failed to score a warm-up row: {_java_message(exc)}") from None
        assert self._meta is not None
        self._meta.extra["inlineMaxRows"] = self.inline_max_rows
        self.ready = True

    def _input_columns(self, model: Any) -> list[ModelColumn]:
        """The columns a row may carry: the model's own features, or the original ones when genmodel encodes."""
        if not self._batch and model.getOrigNames() is not None:
            names = [str(n) for n in model.getOrigNames()][: int(model.getOrigNumCols())]
            domains = list(model.getOrigDomainValues())[: len(names)]
        else:
            names = [str(n) for n in model.getNames()][: int(model.nfeatures())]
            domains = [model.getDomainValues(i) for i in range(len(names))]
        return [ModelColumn.make(n, None if d is None else tuple(str(level) for level in d)) for n, d in zip(names, domains)]

    def _dummy_rows(self, rows: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Synthetic encoded rows (and offsets) covering the model's levels and missing values."""
        rng = np.random.default_rng(0)
        X = np.empty((rows, len(self._columns)))
        for j, col in enumerate(self._columns):
            if col.domain is not None:
                X[:, j] = rng.integers(0, max(len(col.domain), 1), rows)
            else:
                X[:, j] = rng.normal(0.0, 50.0, rows)
        X[::17] = np.nan  # the missing-value paths too
        return X, np.zeros(rows) if self._offset is not None else None

    def _inline_rows(self) -> int:
        """Rows a live batch may have to score on the event loop, for a genmodel-scored (JVM) model.

        GLM, deep learning and the other JVM models differ by orders of magnitude in cost: like the
        ONNX flavor, a timed probe of a dummy batch at load decides (``inline_probe``).
        """
        X, offsets = self._dummy_rows(inline_probe.INLINE_ROWS)
        return inline_probe.inline_rows(lambda: self._score(X, offsets))

    def _warm(self) -> None:
        """Score a few hundred synthetic rows so the JIT has compiled the model before traffic."""
        X, offsets = self._dummy_rows(_WARM_ROWS)
        for _ in range(3):
            self._score(X, offsets)
        # Live traffic is mostly single rows and the small batches of coalesced requests: their
        # calls reach steady speed after some 500 of them (measured), so that many happen here
        # (fewer for models scored row by row, whose calls cost far more).
        for i in range(_WARM_SMALL_CALLS if self._batch else 64):
            size = 1 + i % 8
            start = (7 * i) % (_WARM_ROWS - size)
            self._score(X[start : start + size], None if offsets is None else offsets[start : start + size])

    def health_problem(self) -> str | None:
        """A MOJO scored by genmodel lives in the JVM: once that JVM is gone, nothing can be scored.

        A natively scored model needs no JVM (none is started for it).
        """
        if self.ready and self._native is None and not jvm.is_started():
            return "the JVM that scores this H2O MOJO is not running"
        return None

    def unload(self) -> None:
        """Drop the model (the Java one can then be collected)."""
        self._model = self._wrapper = self._native = self._shap_forest = None
        self.tree_explainable = False
        super().unload()

    # -- scoring -----------------------------------------------------------------------------

    def predict(self, frame: Frame) -> Frame:
        """Score every row of ``frame``: one output row per input row, in order."""
        if self._model is None and self._native is None:
            raise ServableNotReady(f"servable {self.fqrv} is not loaded")
        n = frame.num_rows
        # Per-row scoring hands unseen levels to genmodel as such: its encoders tell them from NA.
        unseen = NA if self._batch else UNSEEN
        X, offsets, unknown = build_matrix(frame, self._columns, self._offset, unseen, self._index)
        unknown = [u for u in unknown if u != self._response]  # a label column sent along is no typo
        if offsets is None and self._requires_offset:
            offsets = np.zeros(n)
        if n == 0:
            preds = np.empty((0, self._preds_size))
        else:
            try:
                preds = self._score(X, offsets)
            except Exception as exc:
                log.exception("H2O MOJO %s failed to score a batch of %d rows", self.fqrv, n)
                raise PredictionFailed(self.fqrv) from exc
        return Frame(self._outputs(preds), {"unknown_inputs": unknown, "missing_inputs": missing_columns(frame, self._columns)})

    def _score(self, X: np.ndarray, offsets: np.ndarray | None) -> np.ndarray:
        """Raw genmodel predictions ``(n, preds_size)`` for the encoded rows ``X``."""
        if self._native is not None:
            return self._native.score(X, offsets)
        if self._batch:
            return jvm.score_batch(self._model, X, offsets, self._preds_size)
        return self._score_rows(X, offsets)

    def _score_rows(self, X: np.ndarray, offsets: np.ndarray | None) -> np.ndarray:
        """Row-by-row scoring through EasyPredictModelWrapper (models that encode categoricals themselves)."""
        row_data = jvm.jclass("hex.genmodel.easy.RowData")
        cat = self._category
        with_offset = offsets is not None and cat in ("Regression", "Binomial", "Multinomial")
        typed = getattr(self._wrapper, f"predict{cat}") if with_offset else None
        preds = np.empty((len(X), self._preds_size))
        for i, values in enumerate(X.tolist()):
            data = row_data()
            for col, v in zip(self._columns, values):
                if v == v:  # not NaN
                    if col.domain is None:
                        data.put(col.name, float(v))
                    else:
                        data.put(col.name, col.domain[int(v)] if v >= 0 else "\x00unseen level")
            p = typed(data, float(offsets[i])) if typed is not None else self._wrapper.predict(data)  # type: ignore[index]  # JPype's Java objects are untyped
            if cat == "Regression":
                preds[i, 0] = p.value
            elif cat in ("Binomial", "Multinomial"):
                preds[i, 0] = p.labelIndex
                preds[i, 1:] = np.asarray(p.classProbabilities)
            elif cat == "Clustering":
                preds[i, 0] = p.cluster
            elif cat == "AutoEncoder":
                preds[i] = np.asarray(p.reconstructed)
            elif cat == "DimReduction":
                preds[i] = np.asarray(p.dimensions)
            else:  # AnomalyDetection
                preds[i] = np.asarray(p.toPreds())
        return preds

    def _set_classes(self, labels: list[Any]) -> None:
        self._classes = np.array(labels, dtype=object)
        self._class_names = tuple(str(label) for label in self._classes)

    def _outputs(self, preds: np.ndarray) -> dict[str, np.ndarray]:
        """Output columns, like H2O's prediction frame, from raw genmodel predictions."""
        cat = self._category
        if cat == "Regression":
            return {"predict": preds[:, 0].copy()}
        if cat in ("Binomial", "Multinomial"):
            assert self._classes is not None
            out = {"predict": self._classes[preds[:, 0].astype(np.intp)]}
            for k, name in enumerate(self._class_names):
                out[name] = preds[:, 1 + k].copy()
            return out
        if cat == "Clustering":
            return {"cluster": preds[:, 0].astype(np.int32)}
        if cat == "AutoEncoder":
            return {"reconstruction": np.array(preds, dtype=np.float64)}
        if cat == "DimReduction":
            return {"dimensions": np.array(preds, dtype=np.float64)}
        if preds.shape[1] == 3:  # AnomalyDetection with a contamination threshold: [isAnomaly, normalized, score]
            return {"score": preds[:, 2].copy(), "normalizedScore": preds[:, 1].copy(), "isAnomaly": preds[:, 0] == 1}
        return {"score": preds[:, 1].copy(), "normalizedScore": preds[:, 0].copy()}

    # -- metadata ----------------------------------------------------------------------------

    def metadata(self) -> ServableMetadata:
        """Inputs (one per model column, in model order) and outputs of the loaded MOJO."""
        if self._meta is None:
            raise ServableNotReady(f"servable {self.fqrv} is not loaded")
        return self._meta

    def _build_metadata(self, extra: dict[str, Any]) -> ServableMetadata:
        inputs = [
            TensorSpec(c.name, "BYTES", (-1,), "categorical", c.domain)
            if c.domain is not None
            else TensorSpec(c.name, "FP64", (-1,), "numeric")
            for c in self._columns
        ]
        if self._offset is not None:
            inputs.append(TensorSpec(self._offset, "FP64", (-1,), "offset (optional; missing = 0)"))
        cat, k = self._category, self._preds_size
        if cat == "Regression":
            outputs = [TensorSpec("predict", "FP64", (-1,), "predicted value")]
        elif cat in ("Binomial", "Multinomial"):
            assert self._classes is not None
            outputs = [TensorSpec("predict", "BYTES", (-1,), "predicted label", tuple(self._classes))]
            outputs += [TensorSpec(str(c), "FP64", (-1,), f"probability of class {c}") for c in self._classes]
        elif cat == "Clustering":
            outputs = [TensorSpec("cluster", "INT32", (-1,), "cluster index")]
        elif cat == "AutoEncoder":
            outputs = [TensorSpec("reconstruction", "FP64", (-1, k), "reconstructed (one-hot expanded) row")]
        elif cat == "DimReduction":
            outputs = [TensorSpec("dimensions", "FP64", (-1, k), "projection on the model's dimensions")]
        else:
            outputs = [
                TensorSpec("score", "FP64", (-1,), "mean path length (smaller = more anomalous)"),
                TensorSpec("normalizedScore", "FP64", (-1,), "normalized anomaly score (higher = more anomalous)"),
            ]
            if k == 3:
                outputs.append(TensorSpec("isAnomaly", "BOOL", (-1,), "score above the contamination threshold"))
        return ServableMetadata(
            name="prediction",
            platform="h2o_mojo",
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            description=(
                f"H2O {cat} model ({extra['algorithm']}, H2O {extra['h2oVersion']}), "
                + ("scored natively (no JVM)" if extra["scorer"] == "native" else "scored by genmodel in the JVM")
            ),
            extra=extra,
        )
