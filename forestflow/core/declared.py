"""A request's columns checked against the inputs its model declares, before model code runs.

Triton's rule, which the tritonclient and kserve conformance checks expect: a declared input sent
with a datatype of another kind (text for a number), or with a shape its declared shape (``-1`` =
any size, the first dimension being the batch) does not admit, is a 400 / INVALID_ARGUMENT naming
the input, what it takes and what it got. Numbers of another numeric datatype are converted to the
declared one when every value is exactly representable (else the same 400): the GraphPipe and
BASIC clients send the numeric type of their own data. The check runs on the Frame the codec
made, so every front-end's layout rules (the V2
np and pd layouts, V1 rows, BASIC fields, GraphPipe tensors) apply first; and a column of one value
per row fits an input declared ``[-1, 1]`` (and ``[N, 1]`` one declared ``[-1]``), the one reshape
the codecs and the flavors make themselves. Columns the model does not declare are not checked
(flavors that match by name report them), nor is a model that declares no inputs, nor the datatype
of an input a flavor converts itself (``converts_inputs``: H2O reads numbers given for a categorical)
or that the request could not choose (``Frame.loose_datatypes``: one V2 np tensor holds every feature).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from forestflow.core.frame import DATATYPES, Frame, TensorSpec, datatype_of
from forestflow.errors import InvalidInput

_INTEGER = frozenset({"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"})
_NUMBERS = _INTEGER | {"FP16", "FP32", "FP64"}
#: The usual declaration: one value per row, any number of rows (admits every 1-D column).
_PER_ROW = (-1,)


def admits(declared: Sequence[int], shape: Sequence[int]) -> bool:
    """Whether a column of ``shape`` (batch first) is what an input declared ``declared`` takes."""
    if not declared:
        return True
    if len(shape) == 1 and len(declared) == 2 and declared[1] in (1, -1):
        declared = declared[:1]  # one value per row for an [N, 1] input: the codecs read it so
    elif len(shape) == 2 and shape[1] == 1 and len(declared) == 1:
        shape = shape[:1]
    return len(shape) == len(declared) and all(d == -1 or d == s for d, s in zip(declared, shape))


def shape_text(shape: Sequence[int]) -> str:
    """``[-1, 4]``."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def fit_inputs(frame: Frame, specs: Sequence[TensorSpec], datatypes: bool = True) -> Frame:
    """``frame`` with its declared inputs checked: InvalidInput naming the first whose shape the
    declaration does not admit or (when ``datatypes``) whose datatype is of another kind (text for
    a number, a number for text or a boolean). Numbers of another numeric datatype are converted to
    the declared one exactly (a fraction for an integer input, or a value out of its range, is
    InvalidInput), as every client of a tabular model sends numbers of its own choosing."""
    if not specs:
        return frame
    columns = frame.columns
    converted: dict[str, np.ndarray] = {}
    for spec in specs:
        column = columns.get(spec.name)
        if column is None:
            continue
        shape = column.shape
        if not (len(shape) == 1 and spec.shape == _PER_ROW) and not admits(spec.shape, shape):
            raise InvalidInput(f"input {spec.name!r}: expected shape {shape_text(spec.shape)}, got {shape_text(column.shape)}")
        if not datatypes or spec.name in frame.loose_datatypes:
            continue
        got = datatype_of(column)
        if got == spec.datatype:
            continue
        if got not in _NUMBERS or spec.datatype not in _NUMBERS:
            raise InvalidInput(f"input {spec.name!r}: expected datatype {spec.datatype}, got {got}")
        try:
            converted[spec.name] = numbers_as(column, spec.datatype)
        except NotRepresentable as exc:
            raise InvalidInput(f"input {spec.name!r}: {got} values sent for {spec.datatype}: {exc}") from None
    if not converted:
        return frame
    return Frame({name: converted.get(name, column) for name, column in columns.items()}, frame.parameters, frame.loose_datatypes)


class NotRepresentable(ValueError):
    """A number the datatype cannot hold; the message says how (for the caller to name the input)."""


def numbers_as(raw: np.ndarray, datatype: str, label: str | None = None) -> np.ndarray:
    """Numbers (an array of booleans, integers or floats) as the numeric ``datatype``, exactly:
    :class:`NotRepresentable` (its message naming ``label``, else the datatype) for a fraction, NaN or
    a value out of range for an integer type, and a finite value past a float type's range, rather
    than numpy's silent truncation, wrap-around or infinity."""
    dtype, kind, label = DATATYPES[datatype], raw.dtype.kind, label or datatype
    if raw.size == 0:
        return raw.astype(dtype)
    if datatype in _INTEGER:
        if kind == "f" and not np.all(np.isfinite(raw) & (raw == np.trunc(raw))):
            raise NotRepresentable(f"{label} data must be integers")
        info = np.iinfo(dtype)
        low, high = raw.min(), raw.max()  # compared as Python numbers: uint64 vs int64 bounds
        if (int(low) if kind in "biu" else float(low)) < info.min or (int(high) if kind in "biu" else float(high)) > info.max:
            raise NotRepresentable(f"value out of range for {label}")
        return raw.astype(dtype)
    if datatype == "FP64":
        return raw.astype(dtype, copy=False)
    with np.errstate(over="ignore"):
        out = raw.astype(dtype)
    if np.any(np.isinf(out) & np.isfinite(raw)) if kind == "f" else np.any(np.isinf(out)):
        raise NotRepresentable(f"value out of range for {label}")
    return out
