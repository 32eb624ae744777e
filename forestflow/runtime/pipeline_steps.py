"""Built-in pipeline steps: ``map`` (Konduit's MappingStep) and the ``classifier`` and ``regressor``
output adapters. They are flavors like any other (registered in ``runtime/base.py``), configured
by the keys of their ``[[models]]`` table and by their declared ``pipelineInputs``/``pipelineOutputs``.

``map``: each declared output is built from an input of the same name, or the input ``rename``
names (``rename = {AGE = "age"}``, output <- input), or a constant (``constants = {SOURCE = "web"}``),
then passed through a value map if one is given (``values = {RACE = {white = "1", black = "2"}}``,
unmapped values kept), then cast to the output's declared datatype.

``classifier``: class probabilities in, from one ``[-1, K]`` input or one 1-D input per class
(named after the class), or a single 1-D positive-class probability (binomial). Options:
``labels`` (default: the input names, or "0".."K-1"), ``top_k`` (default 1; a request overrides it
with the parameter/config ``top_k``) and ``threshold`` (binomial: the second label when its
probability reaches it). Outputs, as declared: ``label``, ``score`` (probability of the label),
``probabilities`` ``[-1, K]``, ``top_labels`` and ``top_scores`` ``[-1, k]``.

``regressor``: one numeric input, output ``value`` (FP64), optionally clamped (``clamp = [lo, hi]``)
and rounded (``round = digits``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from forestflow.core.frame import DATATYPES, Frame, TensorSpec
from forestflow.errors import CreateServableRequestInvalidError, InvalidInput
from forestflow.runtime.base import Servable, ServableMetadata
from forestflow.runtime.h2o_inputs import parse_number

#: The parameter (BASIC config, V2 request parameter) that sets a classifier's k per request.
TOP_K = "top_k"


def internal_frame(columns: dict[str, np.ndarray], parameters: dict[str, Any]) -> Frame:
    """A Frame between pipeline steps, built without re-checking column lengths (the steps give
    equal lengths; on one row the check costs more than a built-in step)."""
    frame = object.__new__(Frame)
    frame.columns = columns
    frame.parameters = parameters
    return frame


def _ports(settings: dict[str, Any], key: str) -> list[dict[str, Any]]:
    ports = settings.get(key, [])
    return ports if isinstance(ports, list) else []


def _spec(port: dict[str, Any], description: str = "") -> TensorSpec:
    return TensorSpec(port["name"], port["datatype"], tuple(port["shape"]), description)


class _BuiltinStep(Servable):
    """What the built-in steps share: cheap enough to run on the event loop, ports from settings."""

    inline_max_rows = 4096
    batchable = True  # row by row: a combined batch gives every request its own rows
    platform = ""

    def __init__(self, fqrv: Any, artifact_dir: Path, settings: dict[str, Any]) -> None:
        super().__init__(fqrv, artifact_dir, settings)
        self.inputs = _ports(settings, "pipelineInputs")
        self.outputs = _ports(settings, "pipelineOutputs")
        self.step = str(settings.get("stepName", self.platform))
        self._meta: ServableMetadata | None = None

    def _invalid(self, message: str) -> CreateServableRequestInvalidError:
        return CreateServableRequestInvalidError(f"{self.platform} step: {message}")

    def metadata(self) -> ServableMetadata:
        assert self._meta is not None, "metadata before load"
        return self._meta


# ---- map -----------------------------------------------------------------------------------------
def _text(value: Any) -> str | None:
    """A value as a category name: integral floats without ".0" (1.0 -> "1"), NaN as None (missing)."""
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return None
        if math.isfinite(value) and float(value).is_integer():
            return str(int(value))
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def cast_column(column: np.ndarray, datatype: str, where: str) -> np.ndarray:
    """``column`` as ``datatype``: missing or unparsable numbers become NaN for floats; 400 if impossible."""
    if datatype == "BYTES":
        if column.dtype == object:
            return column
        out = np.empty(len(column), dtype=object) if column.ndim == 1 else np.empty(column.shape, dtype=object)
        out[...] = [_text(v) for v in column.tolist()] if column.ndim == 1 else np.vectorize(_text, otypes=[object])(column)
        return out
    target = DATATYPES[datatype]
    if column.dtype != object and column.dtype.kind not in "US":
        return column.astype(target, copy=False)
    if target.kind == "f":
        # Text is read as the H2O flavor reads it (Java's number grammar); missing or unparsable
        # values are NaN (NA), never a failed request.
        values = []
        for v in column.reshape(-1).tolist():
            if v is None:
                values.append(math.nan)
            elif isinstance(v, (str, bytes)):
                values.append(parse_number(v.decode("utf-8", "replace") if isinstance(v, bytes) else v))
            else:
                try:
                    values.append(float(v))
                except (TypeError, ValueError):
                    values.append(math.nan)
        return np.asarray(values, dtype=target).reshape(column.shape)
    try:
        return column.astype(target)
    except (TypeError, ValueError, OverflowError):
        raise InvalidInput(f"{where}: values cannot be read as {datatype}") from None


class MapStep(_BuiltinStep):
    """Select, rename, value-map, add constants and cast columns (Konduit's MappingStep)."""

    platform = "map"
    reads_parameters = False

    def load(self) -> None:
        rename = self.settings.get("rename", {})
        constants = self.settings.get("constants", {})
        values = self.settings.get("values", {})
        for key, value in (("rename", rename), ("constants", constants), ("values", values)):
            if not isinstance(value, dict):
                raise self._invalid(f"{key} must be a table")
        inputs = {p["name"] for p in self.inputs}
        plan = []
        for port in self.outputs:
            name = port["name"]
            source = rename.get(name, name)
            if name in constants:
                kind, what = "constant", constants[name]
            elif source in inputs:
                kind, what = "input", source
            else:
                raise self._invalid(
                    f"output {name!r}: no input named {source!r} and no constant (declare it in [[models.inputs]])"
                )
            mapping = values.get(name)
            if mapping is not None and not isinstance(mapping, dict):
                raise self._invalid(f"values.{name} must be a table of value = replacement")
            lookup = {str(k): v for k, v in mapping.items()} if mapping else None
            plan.append((name, kind, what, lookup, port["datatype"], f"map output {name!r}"))
        self._plan = plan
        self._meta = ServableMetadata(
            name="map",
            platform="map",
            inputs=tuple(_spec(p) for p in self.inputs),
            outputs=tuple(_spec(p) for p in self.outputs),
            description="selects, renames, maps and casts columns",
        )
        self.ready = True

    def predict(self, frame: Frame) -> Frame:
        columns = frame.columns
        n = frame.num_rows
        out: dict[str, np.ndarray] = {}
        for name, kind, what, lookup, datatype, where in self._plan:
            if kind == "constant":
                column = np.full(n, what, dtype=object if isinstance(what, str) else None)
            else:
                try:
                    column = columns[what]
                except KeyError:
                    raise InvalidInput(f"the request has no column {what!r} (input of the map step)") from None
            if lookup is not None:
                mapped = np.empty(len(column), dtype=object)
                # numpy's stubs take no list for an object array's slice assignment, which numpy does
                mapped[:] = [lookup.get(_text(v), v) for v in column.tolist()]  # type: ignore[arg-type]
                column = mapped
            out[name] = cast_column(column, datatype, where)
        return internal_frame(out, {})


# ---- classifier ----------------------------------------------------------------------------------
#: Every output a classifier step can give, with its datatype and shape.
CLASSIFIER_OUTPUTS = {
    "label": ("BYTES", (-1,)),
    "score": ("FP64", (-1,)),
    "probabilities": ("FP64", (-1, -1)),
    "top_labels": ("BYTES", (-1, -1)),
    "top_scores": ("FP64", (-1, -1)),
}


def _positive_int(value: Any, where: str) -> int:
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"{where}: expected a positive integer, got {value!r}") from None
    if isinstance(value, bool) or k < 1 or (isinstance(value, float) and not value.is_integer()):
        raise InvalidInput(f"{where}: expected a positive integer, got {value!r}")
    return k


class ClassifierStep(_BuiltinStep):
    """Class probabilities -> label, score, probabilities and top-k labels/scores."""

    platform = "classifier"

    def load(self) -> None:
        if not self.inputs:
            raise self._invalid("needs an input: a [-1, K] probability tensor or one column per class")
        matrix = len(self.inputs) == 1 and len(self.inputs[0]["shape"]) == 2
        binary = len(self.inputs) == 1 and not matrix
        labels = self.settings.get("labels")
        if labels is None:
            if matrix:
                k = self.inputs[0]["shape"][1]
                if k < 1:
                    raise self._invalid("labels required (the input's class count is not declared)")
                labels = [str(i) for i in range(k)]
            elif binary:
                labels = ["0", "1"]
            else:
                labels = [p["name"] for p in self.inputs]
        if not isinstance(labels, list) or len(labels) < 2:
            raise self._invalid("labels must be a list of at least two class names")
        if matrix and self.inputs[0]["shape"][1] not in (-1, len(labels)):
            raise self._invalid(f"{len(labels)} labels for a probability input of shape {self.inputs[0]['shape']}")
        if not matrix and not binary and len(labels) != len(self.inputs):
            raise self._invalid(f"{len(labels)} labels for {len(self.inputs)} class inputs")
        if binary and len(labels) != 2:
            raise self._invalid("a single probability column is binomial: give two labels")
        try:
            self._top_k = _positive_int(self.settings.get(TOP_K, 1), "top_k")
        except InvalidInput as exc:
            raise self._invalid(exc.message) from None
        threshold = self.settings.get("threshold")
        if threshold is not None and (len(labels) != 2 or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1):
            raise self._invalid("threshold is for two classes only, a probability 0..1")
        for port in self.outputs:
            if port["name"] not in CLASSIFIER_OUTPUTS:
                raise self._invalid(f"unknown output {port['name']!r}; a classifier gives {', '.join(CLASSIFIER_OUTPUTS)}")
        self._threshold = threshold
        self._labels = np.array([str(label) for label in labels], dtype=object)
        self._names = [p["name"] for p in self.inputs]
        self._matrix, self._binary = matrix, binary
        self._wanted = frozenset(p["name"] for p in self.outputs)
        domain = tuple(str(label) for label in labels)
        self._meta = ServableMetadata(
            name="classifier",
            platform="classifier",
            inputs=tuple(_spec(p) for p in self.inputs),
            outputs=tuple(
                TensorSpec(name, dt, shape, "class label" if name == "label" else "", domain if name == "label" else None)
                for name, (dt, shape) in CLASSIFIER_OUTPUTS.items()
                if name in self._wanted
            ),
            description=f"classifier over {len(labels)} classes",
            extra={"classification": {"scores": "probabilities", "labels": list(domain)}},
        )
        self.ready = True

    def probabilities(self, frame: Frame) -> np.ndarray:
        """The ``[N, K]`` class probabilities of a batch."""
        columns = frame.columns
        try:
            if self._matrix:
                return np.asarray(columns[self._names[0]], dtype=np.float64)
            if self._binary:
                p = np.asarray(columns[self._names[0]], dtype=np.float64).reshape(-1)
                return np.column_stack([1.0 - p, p])
            first = columns[self._names[0]]
            probs = np.empty((len(first), len(self._names)))
            for j, name in enumerate(self._names):
                probs[:, j] = columns[name]
            return probs
        except KeyError as exc:
            raise InvalidInput(f"classifier step: missing input {exc.args[0]!r}") from None
        except (TypeError, ValueError):
            raise InvalidInput("classifier step: probabilities must be numbers") from None

    def predict(self, frame: Frame) -> Frame:
        probs = self.probabilities(frame)
        if probs.ndim != 2 or probs.shape[1] != len(self._labels):
            raise InvalidInput(
                f"classifier step: expected {len(self._labels)} class probabilities per row, got shape {list(probs.shape)}"
            )
        wanted = self._wanted
        out: dict[str, np.ndarray] = {}
        if "label" in wanted or "score" in wanted:
            if self._threshold is not None:
                index = (probs[:, 1] >= self._threshold).astype(np.intp)
            else:
                index = probs.argmax(axis=1)
            if "label" in wanted:
                out["label"] = self._labels[index]
            if "score" in wanted:
                out["score"] = probs[np.arange(len(probs)), index]
        if "probabilities" in wanted:
            out["probabilities"] = probs
        if "top_labels" in wanted or "top_scores" in wanted:
            asked = frame.parameters.get(TOP_K)
            k = self._top_k if asked is None else _positive_int(asked, "parameter top_k")
            k = min(k, probs.shape[1])
            order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
            if "top_labels" in wanted:
                out["top_labels"] = self._labels[order]
            if "top_scores" in wanted:
                out["top_scores"] = probs[np.arange(len(probs))[:, None], order]
        return internal_frame(out, {})


# ---- regressor -----------------------------------------------------------------------------------
class RegressorStep(_BuiltinStep):
    """One numeric prediction -> ``value``, optionally clamped and rounded."""

    platform = "regressor"
    reads_parameters = False

    def load(self) -> None:
        if len(self.inputs) != 1:
            raise self._invalid("needs exactly one numeric input")
        clamp = self.settings.get("clamp")
        if clamp is not None and not (
            isinstance(clamp, list)
            and len(clamp) == 2
            and all(isinstance(v, (int, float)) for v in clamp)
            and clamp[0] <= clamp[1]
        ):
            raise self._invalid("clamp must be [low, high]")
        digits = self.settings.get("round")
        if digits is not None and (not isinstance(digits, int) or isinstance(digits, bool)):
            raise self._invalid("round must be a number of decimal digits")
        for port in self.outputs:
            if port["name"] != "value":
                raise self._invalid(f"unknown output {port['name']!r}; a regressor gives 'value'")
        self._clamp, self._round, self._input = clamp, digits, self.inputs[0]["name"]
        self._meta = ServableMetadata(
            name="regressor",
            platform="regressor",
            inputs=tuple(_spec(p) for p in self.inputs),
            outputs=(TensorSpec("value", "FP64", (-1,), "predicted value"),),
            description="regression output",
        )
        self.ready = True

    def predict(self, frame: Frame) -> Frame:
        try:
            value = np.asarray(frame.columns[self._input], dtype=np.float64).reshape(frame.num_rows)
        except KeyError:
            raise InvalidInput(f"regressor step: missing input {self._input!r}") from None
        except (TypeError, ValueError):
            raise InvalidInput("regressor step: expected one number per row") from None
        if self._clamp is not None:
            value = np.clip(value, self._clamp[0], self._clamp[1])
        if self._round is not None:
            value = np.round(value, self._round)
        return internal_frame({"value": value}, {})
