"""Frame columns -> onnxruntime feeds, and session results -> Frame columns, for the ONNX flavor.

Each ONNX input is fed from the Frame column of the same name (a ``[N]`` column fills an
``[N, 1]`` input), or, for a 2-D input with known feature names, assembled from one column per
feature in that order (BASIC schema/datum and V2 "pd" requests carry one column per feature).
Values are coerced to the input's element type when no value changes meaning (integers to
floats, integral floats to integers, numeric text to numbers); anything else is an
:class:`InvalidInput` naming the input, the feature and the value, answered with a 400.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from forestflow.core.frame import Frame, TensorSpec
from forestflow.errors import InvalidInput

#: ONNX tensor element type (as onnxruntime names it) -> (numpy dtype, V2 datatype). None = strings.
ELEMENT_TYPES: dict[str, tuple[np.dtype[Any] | None, str]] = {
    "float": (np.dtype(np.float32), "FP32"),
    "double": (np.dtype(np.float64), "FP64"),
    "float16": (np.dtype(np.float16), "FP16"),
    "int8": (np.dtype(np.int8), "INT8"),
    "int16": (np.dtype(np.int16), "INT16"),
    "int32": (np.dtype(np.int32), "INT32"),
    "int64": (np.dtype(np.int64), "INT64"),
    "uint8": (np.dtype(np.uint8), "UINT8"),
    "uint16": (np.dtype(np.uint16), "UINT16"),
    "uint32": (np.dtype(np.uint32), "UINT32"),
    "uint64": (np.dtype(np.uint64), "UINT64"),
    "bool": (np.dtype(np.bool_), "BOOL"),
    "string": (None, "BYTES"),
}
_TENSOR_TYPE = re.compile(r"^tensor\((\w+)\)$")


def element_type(onnx_type: str) -> tuple[np.dtype[Any] | None, str] | None:
    """``tensor(float)`` -> (float32, "FP32"); None for a type the flavor cannot exchange."""
    match = _TENSOR_TYPE.match(onnx_type)
    return ELEMENT_TYPES.get(match.group(1)) if match else None


def dims(shape: list[Any]) -> tuple[int, ...]:
    """An onnxruntime shape with every symbolic or unknown dimension as -1."""
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)


@dataclass(frozen=True, slots=True)
class InputPlan:
    """How one ONNX input is fed."""

    name: str
    dtype: np.dtype[Any] | None  # None: strings
    datatype: str  # V2 name
    shape: tuple[int, ...]  # -1 for symbolic dimensions
    features: tuple[str, ...] | None = None  # the columns an [N, F] input is assembled from

    def spec(self) -> TensorSpec:
        """The input as every protocol's metadata shows it."""
        described = f"features: {', '.join(self.features)}" if self.features else ""
        return TensorSpec(self.name, self.datatype, self.shape, described)

    def takes(self) -> str:
        """The input's type and shape, for error messages."""
        return f"{self.datatype} [{', '.join('N' if i == 0 and d == -1 else str(d) for i, d in enumerate(self.shape))}]"


# ---- coercion -------------------------------------------------------------------------------------
def _where(plan: InputPlan, feature: str | None) -> str:
    return f"input {plan.name!r}" + (f" (feature {feature!r})" if feature is not None else "")


def _texts(values: np.ndarray, plan: InputPlan, feature: str | None) -> np.ndarray:
    if values.dtype.kind not in "OUST":
        raise InvalidInput(f"{_where(plan, feature)} takes strings (BYTES), got numbers ({values.dtype})")
    if values.dtype.kind != "O":
        return values.astype(object)
    flat = values.reshape(-1)
    if all(type(v) is str for v in flat):
        return values
    out = np.empty(len(flat), dtype=object)
    for i, v in enumerate(flat):
        if isinstance(v, str):
            out[i] = v
        elif isinstance(v, bytes):
            try:
                out[i] = v.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidInput(f"{_where(plan, feature)}: element {i} is not UTF-8 text") from None
        elif v is None:
            raise InvalidInput(f"{_where(plan, feature)}: element {i} is missing (null); the model takes strings")
        else:
            raise InvalidInput(f"{_where(plan, feature)} takes strings, got {type(v).__name__} {v!r}")
    return out.reshape(values.shape)


def _numbers_from_objects(values: np.ndarray, plan: InputPlan, feature: str | None) -> np.ndarray:
    """Text and None elements (BYTES columns) as float64; 400 for what is not a number."""
    flat = values.reshape(-1)
    out = np.empty(len(flat), dtype=np.float64)
    for i, v in enumerate(flat):
        if v is None:
            out[i] = np.nan
            continue
        try:
            if isinstance(v, bool):
                raise ValueError
            out[i] = float(v.decode("utf-8") if isinstance(v, bytes) else v)
        except (ValueError, TypeError, UnicodeDecodeError):
            raise InvalidInput(f"{_where(plan, feature)}: {v!r} is not a number; the model takes {plan.datatype}") from None
    return out.reshape(values.shape)


def coerce(values: np.ndarray, plan: InputPlan, feature: str | None = None) -> np.ndarray:
    """``values`` as the input's element type, or a 400 saying why they cannot be."""
    target = plan.dtype
    if target is None:
        return _texts(values, plan, feature)
    if values.dtype == target:
        return values
    if values.dtype.kind in "OUST":
        values = _numbers_from_objects(values, plan, feature)
    kind = values.dtype.kind
    if kind not in "biuf":
        raise InvalidInput(f"{_where(plan, feature)}: cannot use {values.dtype} values; the model takes {plan.datatype}")
    if target.kind == "b":
        if kind != "b" and not np.all((values == 0) | (values == 1)):
            raise InvalidInput(f"{_where(plan, feature)} takes BOOL: only true/false (or 0/1)")
        return values.astype(np.bool_)
    if target.kind in "iu":
        if kind == "f" and not np.all(np.isfinite(values) & (values == np.trunc(values))):
            raise InvalidInput(f"{_where(plan, feature)} takes {plan.datatype}: the values must be whole numbers (no NaN)")
        if values.size and kind != "b":
            info = np.iinfo(target)
            low, high = values.min(), values.max()
            if (int(low) if kind != "f" else float(low)) < info.min or (int(high) if kind != "f" else float(high)) > info.max:
                raise InvalidInput(f"{_where(plan, feature)}: a value is out of range for {plan.datatype}")
        return values.astype(target)
    if kind == "f" and target.itemsize < values.dtype.itemsize:
        big = np.abs(values) > np.finfo(target).max  # checked before the cast: no overflow warning
        if big.any() and (big & np.isfinite(values)).any():
            raise InvalidInput(f"{_where(plan, feature)}: a value is out of range for {plan.datatype}")
    return values.astype(target)


# ---- feeds ----------------------------------------------------------------------------------------
def _fit_shape(values: np.ndarray, plan: InputPlan) -> np.ndarray:
    """A column shaped for the input: ``[N]`` fills ``[N, 1]``; fixed dimensions must match."""
    shape = plan.shape
    if values.ndim == 1 and len(shape) == 2 and shape[1] in (1, -1):
        values = values.reshape(len(values), 1)
    elif values.ndim == 2 and len(shape) == 1 and values.shape[1] == 1:
        values = values[:, 0]
    ok = values.ndim == len(shape) and all(d in (-1, got) for d, got in zip(shape[1:], values.shape[1:]))
    if not ok:
        hint = f", or one column per feature ({', '.join(plan.features)})" if plan.features else ""
        raise InvalidInput(f"input {plan.name!r} takes {plan.takes()}{hint}; got shape {list(values.shape)}")
    return values


def _assemble(frame: Frame, plan: InputPlan, n: int) -> np.ndarray:
    """The ``[N, F]`` matrix of an input from its feature columns, in feature order."""
    assert plan.features is not None
    missing = [f for f in plan.features if f not in frame.columns]
    if missing:
        raise InvalidInput(
            f"missing input {plan.name!r} ({plan.takes()}): send it as one tensor, or every feature as a column; "
            f"missing feature(s): {', '.join(missing)}"
        )
    columns = []
    for feature in plan.features:
        column = frame.columns[feature]
        if column.ndim == 2 and column.shape[1] == 1:
            column = column[:, 0]
        if column.ndim != 1:
            raise InvalidInput(
                f"feature {feature!r} of input {plan.name!r} takes one value per row, got shape {list(column.shape)}"
            )
        columns.append(column)
    try:  # one conversion for the whole matrix: per column it costs several times more on small batches
        return coerce(np.stack(columns, axis=1), plan)
    except InvalidInput:
        pass
    out = np.empty((n, len(plan.features)), dtype=object if plan.dtype is None else plan.dtype)
    for j, (feature, column) in enumerate(zip(plan.features, columns)):  # again, to name the feature at fault
        out[:, j] = coerce(column, plan, feature)
    return out


def build_feeds(frame: Frame, plans: list[InputPlan]) -> tuple[dict[str, np.ndarray], list[str]]:
    """The session feeds for ``frame``, and the names of the columns no input used."""
    n = frame.num_rows
    feeds: dict[str, np.ndarray] = {}
    used: set[str] = set()
    missing: list[InputPlan] = []
    for plan in plans:
        column = frame.columns.get(plan.name)
        if column is not None:
            feeds[plan.name] = _fit_shape(coerce(column, plan), plan)
            used.add(plan.name)
        elif plan.features is not None and any(f in frame.columns for f in plan.features):
            feeds[plan.name] = _assemble(frame, plan, n)
            used.update(plan.features)
        else:
            missing.append(plan)
    if missing:
        what = "; ".join(
            f"{p.name!r} ({p.takes()}" + (f", or its features {', '.join(p.features)}" if p.features else "") + ")"
            for p in missing
        )
        raise InvalidInput(f"missing model input(s): {what}")
    return feeds, [name for name in frame.columns if name not in used]
