"""KServe V1 / TF Serving JSON <-> Frames.

Row form, ``{"instances": [...]}`` (KServe also accepts the key ``"inputs"``), one instance per
record:

- objects keyed by input name, for any model;
- lists: for a model with ONE input that takes a vector per record (declared shape ``[-1, k]``,
  or any rank above one) each instance is one row of that input, as KServe and TF Serving mean it;
  otherwise the list holds the values in the model's input order (ForestFlow's tabular rows), a
  vector input taking a nested list;
- plain values: the rows of a one-input model.

Columnar form (TF Serving), ``{"inputs": {name: [one entry per record]}}``.

Answers: the row form gets ``predictions``, one per record: the value of a one-output model (a list
when the output is a vector), else an object ``{output: value}``. The columnar form gets TF
Serving's ``outputs``: the batch of a one-output model, else ``{output: batch}``.
Every malformed request raises :class:`InvalidInput` naming the instance and input at fault.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from forestflow.core.declared import NotRepresentable, numbers_as
from forestflow.core.frame import DATATYPES, NUMERIC_DATATYPES, Frame, TensorSpec
from forestflow.errors import InvalidInput

#: Where record ``i`` of an input came from, for error messages (``instances[3]``).
Where = Callable[[int], str]


def per_row_dims(spec: TensorSpec | None) -> tuple[int, ...]:
    """The dimensions of one record of an input: ``()`` for a scalar column (or an unknown input)."""
    return tuple(spec.shape[1:]) if spec is not None else ()


def _fits(shape: Sequence[int], dims: Sequence[int]) -> bool:
    return len(shape) == len(dims) and all(d == -1 or d == s for s, d in zip(shape, dims))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _scalar_column(name: str, values: list[Any], spec: TensorSpec | None) -> np.ndarray:
    """One scalar input's values across records, typed as the model declares it."""
    datatype = spec.datatype if spec is not None else None
    if spec is not None and any(isinstance(v, (list, dict)) for v in values):
        culprit = next(v for v in values if isinstance(v, (list, dict)))
        raise InvalidInput(f"input {name!r}: takes one value per instance, got {_short(culprit)}")
    if datatype in NUMERIC_DATATYPES:
        if any(isinstance(v, (bool, str)) for v in values):
            raise InvalidInput(
                f"input {name!r}: expected numbers ({datatype}), got {next(v for v in values if isinstance(v, (bool, str)))!r}"
            )
        if datatype.startswith("FP"):
            values = [np.nan if v is None else v for v in values]
        try:
            raw = np.array(values)
        except ValueError:  # ragged
            raw = np.array([None])
        if raw.dtype.kind not in "iuf" or raw.ndim != 1:
            raise InvalidInput(f"input {name!r}: values do not fit {datatype}")
        return _fitted(name, raw, datatype)
    if datatype == "BOOL" and all(isinstance(v, bool) for v in values):
        return np.array(values, dtype=np.bool_)
    try:
        arr = np.array(values)
    except ValueError:
        raise InvalidInput(f"input {name!r}: values of different shapes across instances") from None
    if arr.dtype.kind in "USO" or arr.ndim == 0:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    return arr


def _fitted(name: str, raw: np.ndarray, datatype: str) -> np.ndarray:
    """Numbers as the numeric ``datatype``; a 400 naming the input for one it cannot hold (a fraction
    or out of range for an integer type, past a float type's range), never truncated or wrapped."""
    try:
        return numbers_as(raw, datatype)
    except NotRepresentable as exc:
        raise InvalidInput(f"input {name!r}: {exc}") from None


def _typed_rows(name: str, raw: np.ndarray, datatype: str) -> np.ndarray | None:
    """``raw`` (as JSON gave it) in the input's datatype; None when its values are of the wrong kind."""
    if datatype in NUMERIC_DATATYPES:
        target = DATATYPES[datatype]
        if raw.dtype.kind not in "iuf" or (raw.dtype.kind == "f" and target.kind in "iu"):
            return None  # strings, booleans, or fractions for an integer input
        return _fitted(name, raw, datatype)
    if datatype == "BOOL":
        return raw if raw.dtype.kind == "b" else None
    if datatype == "BYTES":
        if raw.dtype.kind not in "US":
            return None
        return raw.astype(object)
    return raw


def _vector_column(name: str, values: list[Any], spec: TensorSpec, where: Where) -> np.ndarray:
    """A vector (or N-D) input's rows across records: ``[N, *per_row]`` in the declared datatype."""
    dims = per_row_dims(spec)
    try:
        raw = np.array(values)
        if raw.dtype.kind != "O" and _fits(raw.shape[1:], dims):
            typed = _typed_rows(name, raw, spec.datatype)
            if typed is not None:
                return typed
    except (ValueError, OverflowError):
        pass  # ragged, or too large: find the instance at fault below
    declared = f"shape {list(spec.shape)}"
    for i, value in enumerate(values):
        try:
            row = np.array(value)
        except (ValueError, OverflowError):
            row = None
        if row is None or row.dtype.kind == "O" or not _fits(row.shape, dims):
            got = f"shape {list(row.shape)}" if row is not None and row.dtype.kind != "O" else "a ragged or mixed value"
            raise InvalidInput(f"{where(i)}: input {name!r} ({declared}) takes shape {list(dims)} per instance, got {got}")
        if _typed_rows(name, row, spec.datatype) is None:
            raise InvalidInput(f"{where(i)}: input {name!r} expects {spec.datatype} values, got {_short(value)}")
    try:  # every row is right on its own: the values themselves do not fit the datatype
        return np.array(values, dtype=DATATYPES.get(spec.datatype))
    except (ValueError, TypeError, OverflowError):
        raise InvalidInput(f"input {name!r}: values do not fit {spec.datatype}") from None


def column(name: str, values: list[Any], spec: TensorSpec | None, where: Where) -> np.ndarray:
    """One input's values across records as a batch-first column."""
    if per_row_dims(spec):
        assert spec is not None
        return _vector_column(name, values, spec, where)
    return _scalar_column(name, values, spec)


def frame_from_instances(instances: Any, specs: Sequence[TensorSpec], parameters: dict[str, Any]) -> Frame:
    """The Frame of a V1 ``instances`` list (objects by input name, lists, or a one-input model's values)."""
    if not isinstance(instances, list) or not instances:
        raise InvalidInput("instances: required, a non-empty list")
    by_name = {s.name: s for s in specs}
    names = [s.name for s in specs]
    if all(isinstance(row, dict) for row in instances):
        order = list(names)
        for row in instances:
            order.extend(k for k in row if k not in by_name and k not in order)
        present = [n for n in order if any(map(operator.contains, instances, repeat(n)))]
        table = {n: list(map(dict.get, instances, repeat(n))) for n in present}
    elif all(isinstance(row, list) for row in instances):
        if not names:
            raise InvalidInput("instances: this model does not describe its inputs; send objects keyed by input name")
        if len(specs) == 1 and per_row_dims(specs[0]):
            table = {names[0]: instances}  # each instance is one row of the only input
        else:
            if set(map(len, instances)) != {len(names)}:
                i, row = next((i, row) for i, row in enumerate(instances) if len(row) != len(names))
                raise InvalidInput(f"instances[{i}]: expected {len(names)} values ({', '.join(names)}), got {len(row)}")
            table = dict(zip(names, map(list, zip(*instances))))  # transposed by zip, not a step per value
    elif len(names) == 1 and not any(isinstance(row, (dict, list)) for row in instances):
        table = {names[0]: list(instances)}
    else:
        raise InvalidInput("instances: every instance must be a list (values in input order) or an object (by input name)")

    def where(i: int) -> str:
        return f"instances[{i}]"

    return Frame({n: column(n, values, by_name.get(n), where) for n, values in table.items()}, dict(parameters))


def frame_from_columnar(inputs: dict[str, Any], specs: Sequence[TensorSpec], parameters: dict[str, Any]) -> Frame:
    """The Frame of TF Serving's columnar ``{"inputs": {name: [one entry per record]}}``."""
    if not inputs:
        raise InvalidInput("inputs: an object with at least one input")
    by_name = {s.name: s for s in specs}
    for name, batch in inputs.items():
        if not isinstance(batch, list) or not batch:
            raise InvalidInput(f"inputs.{name}: expected a non-empty list with one entry per record")
    counts = {name: len(batch) for name, batch in inputs.items()}
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"{name}={n}" for name, n in counts.items())
        raise InvalidInput(f"inputs: every input needs one entry per record, got {detail}")
    order = [s.name for s in specs if s.name in inputs] + [n for n in inputs if n not in by_name]
    return Frame({n: column(n, inputs[n], by_name.get(n), _columnar_where(n)) for n in order}, dict(parameters))


def _columnar_where(name: str) -> Where:
    return lambda i: f"inputs.{name}[{i}]"


def _plain(v: Any) -> Any:
    if type(v) is list and set(map(type, v)) <= _PLAIN_TYPES:  # the usual column: as it is
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


_PLAIN_TYPES = frozenset({str, int, float, bool, type(None)})


def _json_columns(frame: Frame) -> dict[str, list[Any]]:
    return {name: _plain(col.tolist()) if col.dtype == object else col.tolist() for name, col in frame.columns.items()}


def predictions(frame: Frame) -> list[Any]:
    """One prediction per row: the value of a single output (a list for a vector), else ``{output: value}``."""
    columns = _json_columns(frame)
    if len(columns) == 1:
        return next(iter(columns.values()))
    names = list(columns)
    return [dict(zip(names, values)) for values in zip(*columns.values())]


def columnar_outputs(frame: Frame) -> Any:
    """TF Serving's columnar ``outputs``: the batch of a single output, else ``{output: batch}``."""
    columns = _json_columns(frame)
    return next(iter(columns.values())) if len(columns) == 1 else columns
