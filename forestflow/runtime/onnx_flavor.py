"""The ONNX flavor: models from any framework that exports ONNX, scored with onnxruntime (CPU).

Definition: ``{"flavor": {"ONNX": {"modelPath": "model.onnx", ...}}}``. Settings, all optional:

- ``intraOpThreads`` / ``interOpThreads`` (default 1 / 1: one gateway process per core, whose
  scheduler already runs two calls at once), ``allowSpinning`` (default false: idle pool threads
  sleep instead of spinning on a shared machine), ``graphOptimizationLevel``
  (``disable`` | ``basic`` | ``extended`` | ``all``, default ``all``);
- ``featureOrder``: the feature names of a 2-D input, as a list (the model's one 2-D input) or
  ``{"input": [names]}``; without it the model's ``feature_names`` metadata prop is used;
- ``inlineMaxRows``: live batches up to this many rows are scored on the event loop (0 = never);
  by default 64 when a 64-row batch runs within 200 us at load, else 0;
- ``maxBatchRows`` / ``maxBatchWaitUs``: micro-batching of concurrent requests (runtime/batching.py).

Inputs and outputs keep their ONNX names, element types and shapes (symbolic dimensions as -1).
A scikit-learn classifier's ZipMap probability output becomes one FP64 column per class, named
after the class, next to the label output: the same shape of answer as the H2O flavor's.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument

from forestflow.core.frame import DATATYPES, Frame, TensorSpec
from forestflow.core.ids import FQRV
from forestflow.errors import CreateServableRequestInvalidError, InvalidInput, PredictionFailed, ServableNotReady
from forestflow.runtime import inline_probe
from forestflow.runtime.base import Servable, ServableMetadata
from forestflow.runtime.batching import BATCH_SETTINGS
from forestflow.runtime.model_file import model_path
from forestflow.runtime.onnx_graph import GraphInfo, ZipMapOutput, read_graph
from forestflow.runtime.onnx_io import InputPlan, build_feeds, dims, element_type

log = logging.getLogger(__name__)

_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_SETTINGS = (
    "modelPath",
    "intraOpThreads",
    "interOpThreads",
    "allowSpinning",
    "graphOptimizationLevel",
    "featureOrder",
    "inlineMaxRows",
    *BATCH_SETTINGS,
)
_WARM_BATCHES = (1, 8, 100)
_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")


@dataclass(frozen=True, slots=True)
class _Output:
    """One session output and the Frame column(s) it becomes."""

    name: str  # the session's output name
    columns: tuple[str, ...]  # one column, or one per class for a ZipMap
    zipmap: ZipMapOutput | None = None


def _one_line(exc: BaseException, path: Path, shown: str) -> str:
    """onnxruntime's message without the artifact cache's absolute path."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__).replace(str(path), shown)


def _ort_reason(exc: BaseException) -> str:
    """onnxruntime's message without its ``[ONNXRuntimeError] : 1 : FAIL :`` prefix."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _ORT_PREFIX.sub("", text)


class OnnxServable(Servable):
    """A servable that scores an ONNX model with onnxruntime's CPU execution provider."""

    #: Two calls at once (onnxruntime releases the GIL while it runs): one per core of the gateway.
    max_concurrency = 2
    reads_parameters = False
    #: One session call scores a whole batch: its fixed cost (feeds, the call, outputs) is paid once.
    batchable = True
    #: Values are converted to each input's element type (onnx_io.coerce, with its own 400s).
    converts_inputs = True

    def __init__(self, fqrv: FQRV, artifact_dir: Path, settings: dict[str, Any]) -> None:
        super().__init__(fqrv, artifact_dir, settings)
        self._session: ort.InferenceSession | None = None
        self._inputs: list[InputPlan] = []
        self._outputs: list[_Output] = []
        self._batch_of_one = False
        self._meta: ServableMetadata | None = None

    # -- settings ----------------------------------------------------------------------------

    def _setting_int(self, key: str, default: int, zero: str) -> int:
        value = self.settings.get(key, default)
        if type(value) is not int or value < 0:
            raise CreateServableRequestInvalidError(f"flavor.ONNX.{key}: expected an integer >= 0 (0 = {zero}), got {value!r}")
        return value

    def _model_path(self) -> Path:
        """The model file named by ``modelPath`` (unknown settings are refused first: a typo is no default)."""
        return model_path(self, "ONNX", _SETTINGS, "the .onnx file")[0]

    def _session_options(self) -> ort.SessionOptions:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self._setting_int("intraOpThreads", 1, "onnxruntime's choice")
        options.inter_op_num_threads = self._setting_int("interOpThreads", 1, "onnxruntime's choice")
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        level = self.settings.get("graphOptimizationLevel", "all")
        if level not in _OPT_LEVELS:
            raise CreateServableRequestInvalidError(
                f"flavor.ONNX.graphOptimizationLevel: expected one of {', '.join(_OPT_LEVELS)}, got {level!r}"
            )
        options.graph_optimization_level = _OPT_LEVELS[level]
        spinning = self.settings.get("allowSpinning", False)
        if not isinstance(spinning, bool):
            raise CreateServableRequestInvalidError(f"flavor.ONNX.allowSpinning: expected true or false, got {spinning!r}")
        for key in ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning"):
            options.add_session_config_entry(key, "1" if spinning else "0")
        options.log_severity_level = 3  # errors only: onnxruntime's warnings go to stderr, not our log
        return options

    def _feature_orders(self, plans: list[InputPlan], info: GraphInfo) -> dict[str, tuple[str, ...]]:
        """Feature names per 2-D input: ``featureOrder`` first, else the ``feature_names`` metadata prop."""
        matrices = [p for p in plans if len(p.shape) == 2]
        raw: Any = self.settings.get("featureOrder")
        source = "flavor.ONNX.featureOrder"
        if raw is None:
            raw, source = info.feature_names(), "the model's feature_names metadata"
            if raw is None or len(matrices) != 1:
                return {}
        if isinstance(raw, list):
            if len(matrices) != 1:
                raise CreateServableRequestInvalidError(
                    f"{source}: a list names the features of the model's one 2-D input, but the model has "
                    f'{len(matrices)} ({", ".join(p.name for p in matrices) or "none"}); give {{"input": [names]}}'
                )
            raw = {matrices[0].name: raw}
        if not isinstance(raw, dict):
            raise CreateServableRequestInvalidError(f'{source}: expected a list of feature names or {{"input": [names]}}')
        by_name = {p.name: p for p in matrices}
        orders: dict[str, tuple[str, ...]] = {}
        for name, features in raw.items():
            plan = by_name.get(name)
            if plan is None:
                raise CreateServableRequestInvalidError(
                    f"{source}: {name!r} is not a 2-D input of the model; its 2-D inputs: {', '.join(by_name) or 'none'}"
                )
            if not isinstance(features, list) or not features or not all(isinstance(f, str) and f for f in features):
                raise CreateServableRequestInvalidError(f"{source}[{name!r}]: expected a non-empty list of feature names")
            if len(set(features)) != len(features):
                raise CreateServableRequestInvalidError(f"{source}[{name!r}]: feature names repeat")
            if plan.shape[1] not in (-1, len(features)):
                raise CreateServableRequestInvalidError(
                    f"{source}[{name!r}]: {len(features)} feature name(s) for an input of {plan.shape[1]} columns"
                )
            orders[name] = tuple(features)
        return orders

    # -- loading -----------------------------------------------------------------------------

    def load(self) -> None:
        """Read the model, create the session, map inputs and outputs, warm up, mark ready."""
        path = self._model_path()
        shown = str(self.settings["modelPath"])
        options = self._session_options()
        info = read_graph(path, shown)
        try:
            session = ort.InferenceSession(
                info.model_bytes if info.model_bytes is not None else str(path),
                sess_options=options,
                providers=["CPUExecutionProvider"],
            )
        except Exception as exc:
            raise CreateServableRequestInvalidError(f"onnxruntime cannot load {shown!r}: {_one_line(exc, path, shown)}") from None
        plans = self._input_plans(session)
        orders = self._feature_orders(plans, info)
        self._inputs = [replace(p, features=orders.get(p.name)) for p in plans]
        self._outputs, output_specs = self._output_plans(session, info)
        self._batch_of_one = all(p.shape[0] == 1 for p in self._inputs)
        self._session = session
        warmed = self._warm()
        self.inline_max_rows = self._inline_rows(warmed)
        self._meta = self._build_metadata(shown, info, output_specs, warmed)
        self.ready = True

    def _input_plans(self, session: ort.InferenceSession) -> list[InputPlan]:
        plans = []
        for node in session.get_inputs():
            typed = element_type(node.type)
            if typed is None:
                raise CreateServableRequestInvalidError(
                    f"input {node.name!r} has type {node.type}, which the ONNX flavor cannot feed"
                )
            shape = dims(node.shape)
            if not shape:
                raise CreateServableRequestInvalidError(
                    f"input {node.name!r} is a scalar (no batch dimension); the ONNX flavor feeds batches"
                )
            plans.append(InputPlan(node.name, typed[0], typed[1], shape))
        return plans

    def _output_plans(self, session: ort.InferenceSession, info: GraphInfo) -> tuple[list[_Output], list[TensorSpec]]:
        zipmaps = {z.tensor: z for z in info.zipmaps}
        plain = [o.name for o in session.get_outputs() if o.name not in zipmaps]
        outputs: list[_Output] = []
        specs: list[TensorSpec] = []
        for node in session.get_outputs():
            zipmap = zipmaps.get(node.name)
            if zipmap is not None:
                clash = set(zipmap.labels) & set(plain) or set(zipmap.labels) & {i.name for i in session.get_inputs()}
                columns = tuple(f"{zipmap.name}.{c}" if clash else c for c in zipmap.labels)
                outputs.append(_Output(node.name, columns, zipmap))
                specs += [
                    TensorSpec(c, "FP64", (-1,), f"probability of class {label}") for c, label in zip(columns, zipmap.labels)
                ]
                continue
            typed = element_type(node.type)
            if typed is None:
                raise CreateServableRequestInvalidError(
                    f"output {node.name!r} has type {node.type}, which the ONNX flavor cannot return as a tensor"
                )
            outputs.append(_Output(node.name, (node.name,)))
            specs.append(TensorSpec(node.name, typed[1], dims(node.shape) or (-1,)))
        if len(info.zipmaps) == 1:  # the classifier's label output: the one 1-D output of the labels' type
            zipmap = info.zipmaps[0]
            want = "INT64" if zipmap.int_labels else "BYTES"
            labels = [i for i, s in enumerate(specs) if s.name in plain and s.datatype == want and len(s.shape) == 1]
            if len(labels) == 1:
                s = specs[labels[0]]
                specs[labels[0]] = TensorSpec(s.name, s.datatype, s.shape, "predicted label", zipmap.labels)
        return outputs, specs

    def _dummy_feeds(self, rows: int) -> dict[str, np.ndarray]:
        """Zeros and empty strings for every input, ``rows`` deep (symbolic inner dimensions as 1)."""
        feeds = {}
        for plan in self._inputs:
            shape = (rows, *(d if d > 0 else 1 for d in plan.shape[1:]))
            feeds[plan.name] = np.full(shape, "", dtype=object) if plan.dtype is None else np.zeros(shape, plan.dtype)
        return feeds

    def _warm(self) -> bool:
        """Score dummy batches (zeros, empty strings) so the first requests do not pay for lazy setup.

        A model that refuses the dummy values (e.g. an encoder that rejects unknown categories)
        still loads: warm-up only makes the first calls faster.
        """
        for rows in (1,) if self._batch_of_one else _WARM_BATCHES:
            try:
                assert self._session is not None
                self._session.run(None, self._dummy_feeds(rows))
            except Exception as exc:
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                log.warning("ONNX servable %s: warm-up with dummy values failed (%s); it loads all the same", self.fqrv, reason)
                return False
        return True

    def _inline_rows(self, warmed: bool) -> int:
        """How many rows a live batch may have to be scored on the event loop, without a thread hop.

        Measured with bench/run.py on the prostate GBM twin: 1-row requests cost ~30% less gateway
        CPU on the loop (c16: ~450 -> ~300 us), 100-row ones about the same. Models are arbitrary,
        though: only one whose 64-row dummy batch runs within the budget is scored inline, unless
        ``inlineMaxRows`` says otherwise (0 = never).
        """
        if "inlineMaxRows" in self.settings:
            return self._setting_int("inlineMaxRows", 0, "never")
        if not warmed or self._batch_of_one:
            return 0
        feeds = self._dummy_feeds(inline_probe.INLINE_ROWS)
        session = self._session
        assert session is not None
        return inline_probe.inline_rows(lambda: session.run(None, feeds))

    def unload(self) -> None:
        """Drop the session (onnxruntime frees its memory with it)."""
        self._session = None
        super().unload()

    # -- scoring -----------------------------------------------------------------------------

    def predict(self, frame: Frame) -> Frame:
        """Score every row of ``frame``: one output row per input row, in order."""
        session = self._session
        if session is None:
            raise ServableNotReady(f"servable {self.fqrv} is not loaded")
        feeds, unknown = build_feeds(frame, self._inputs)
        n = frame.num_rows
        if n == 0:
            return Frame(self._empty_outputs(), {"unknown_inputs": unknown})
        names = [o.name for o in self._outputs]
        if self._batch_of_one and n > 1:  # exported with a fixed batch of 1: one call per row
            parts = [self._run(session, names, {k: v[i : i + 1] for k, v in feeds.items()}, 1) for i in range(n)]
            results = [np.concatenate([p[j] for p in parts]) for j in range(len(names))]
        else:
            results = self._run(session, names, feeds, n)
        columns: dict[str, np.ndarray] = {}
        for output, result in zip(self._outputs, results):
            if output.zipmap is not None:
                probabilities = np.asarray(result, dtype=np.float64)
                for j, column in enumerate(output.columns):
                    columns[column] = np.ascontiguousarray(probabilities[:, j])
            else:
                columns[output.name] = result
        return Frame(columns, {"unknown_inputs": unknown})

    def _run(self, session: ort.InferenceSession, names: list[str], feeds: dict[str, np.ndarray], n: int) -> list[np.ndarray]:
        try:
            results: list[np.ndarray] = session.run(names, feeds)
        except (InvalidArgument, Fail) as exc:
            # Shapes and types are checked before the call: what is left is the model's own rule on
            # the values (an unknown category, say), which onnxruntime reports as a failed node.
            log.info("ONNX servable %s refused a batch of %d rows: %s", self.fqrv, n, exc)
            raise InvalidInput(f"the model refused the input: {_ort_reason(exc)}") from None
        except Exception as exc:
            log.exception("ONNX servable %s failed to score a batch of %d rows", self.fqrv, n)
            raise PredictionFailed(self.fqrv) from exc
        for name, result in zip(names, results):
            if not isinstance(result, np.ndarray) or result.ndim == 0 or len(result) != n:
                shape = getattr(result, "shape", type(result).__name__)
                log.error("ONNX servable %s: output %s has shape %s for %d rows", self.fqrv, name, shape, n)
                raise PredictionFailed(self.fqrv, f"output {name!r} has no row per input row (shape {shape} for {n} rows)")
        return results

    def _empty_outputs(self) -> dict[str, np.ndarray]:
        assert self._meta is not None
        out = {}
        for spec in self._meta.outputs:
            out[spec.name] = np.empty((0, *(max(d, 0) for d in spec.shape[1:])), dtype=DATATYPES[spec.datatype])
        return out

    # -- metadata ----------------------------------------------------------------------------

    def metadata(self) -> ServableMetadata:
        """Inputs and outputs of the loaded model, with ONNX names and symbolic dimensions as -1."""
        if self._meta is None:
            raise ServableNotReady(f"servable {self.fqrv} is not loaded")
        return self._meta

    def _build_metadata(self, shown: str, info: GraphInfo, outputs: list[TensorSpec], warmed: bool) -> ServableMetadata:
        extra = {
            "modelPath": shown,
            "producer": info.producer,
            "irVersion": info.ir_version,
            "opsets": info.opsets,
            "featureOrder": {p.name: list(p.features) for p in self._inputs if p.features},
            "classes": {z.name: list(z.labels) for z in info.zipmaps},
            "onnxruntime": ort.__version__,
            "warmedUp": warmed,
            "batchOfOne": self._batch_of_one,
            "inlineMaxRows": self.inline_max_rows,
        }
        producer = f" from {info.producer}" if info.producer else ""
        opset = info.opsets.get("ai.onnx")
        return ServableMetadata(
            name=info.graph_name or Path(shown).stem,
            platform="onnx_onnxv1",
            inputs=tuple(p.spec() for p in self._inputs),
            outputs=tuple(outputs),
            description=info.doc or f"ONNX model{producer}" + (f" (opset {opset})" if opset else ""),
            extra=extra,
        )
