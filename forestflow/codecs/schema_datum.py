"""ForestFlow's BASIC tensors (schema + datum, row-major typed groups) <-> Frame.

A request's schema lists, per tensor type, the ordered field names; each datum (record) carries
one tensor per schema entry whose values fill those fields positionally. The Frame has one column
per field. Outputs go back grouped by type in column order, one datum per row; a column with
more than one value per row (a vector) contributes all of its values to its row's tensor.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
from collections.abc import Iterable, Sequence
from functools import partial
from itertools import chain
from typing import Any

import numpy as np
import orjson

from forestflow._proto import forestflow_pb2 as pb
from forestflow.codecs import _ffjson
from forestflow.codecs.ff_settings import fqrv_to_json
from forestflow.core.declared import NotRepresentable, numbers_as
from forestflow.core.frame import DATATYPES, Frame, datatype_of
from forestflow.core.ids import FQRV
from forestflow.errors import InvalidInput

#: ForestFlow tensor type (schema name) -> numpy dtype of the column.
FF_DTYPES: dict[str, Any] = {
    "Float16": np.float16,
    "Float32": np.float32,
    "Float64": np.float64,
    "Int8": np.int8,
    "Int16": np.int16,
    "Int32": np.int32,
    "Int64": np.int64,
    "String": object,
    "Bool": np.bool_,
    "Bytes": object,
}
#: Tensor oneof key -> schema type name (the oneof calls bytes "Byte").
_KEY_TO_TYPE = {name: name for name in FF_DTYPES} | {"Byte": "Bytes"}
#: Schema type name -> Tensor oneof key (the oneof calls bytes "Byte").
TENSOR_KEY = {name: name for name in FF_DTYPES} | {"Bytes": "Byte"}
#: V2 datatype of an output column -> ForestFlow type.
_V2_TO_FF = {
    "FP16": "Float16",
    "FP32": "Float32",
    "FP64": "Float64",
    "INT8": "Int8",
    "INT16": "Int16",
    "INT32": "Int32",
    "INT64": "Int64",
    "UINT8": "Int32",
    "UINT16": "Int32",
    "UINT32": "Int64",
    "UINT64": "Int64",
    "BOOL": "Bool",
}
#: Numeric ForestFlow type -> the V2 datatype of its column (the inverse of the signed part above).
_FF_TO_V2 = {ff: v2 for v2, ff in _V2_TO_FF.items() if v2[0] in "IF"}


def _column(ff_type: str, values: list[Any], field: str) -> np.ndarray:
    """Convert one field's values to a typed column, with a 400 naming the field on failure."""
    if ff_type == "String":
        # null is a missing value (NA), an addition to ForestFlow: JSON has no other way to say it.
        if not all(isinstance(v, str) or v is None for v in values):
            raise InvalidInput(f"field {field!r}: String tensors take strings (or null for a missing value)")
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        return arr
    if ff_type == "Bytes":
        arr = np.empty(len(values), dtype=object)
        try:
            arr[:] = [v if isinstance(v, bytes) else base64.b64decode(v, validate=True) for v in values]
        except (binascii.Error, TypeError, ValueError):
            raise InvalidInput(f"field {field!r}: Byte tensors take base64 strings") from None
        return arr
    if ff_type == "Bool":
        if not all(isinstance(v, bool) for v in values):
            raise InvalidInput(f"field {field!r}: Bool tensors take true/false")
        return np.array(values, dtype=np.bool_)
    if any(isinstance(v, bool) for v in values):
        raise InvalidInput(f"field {field!r}: {ff_type} tensors take numbers")
    if None in values:
        if ff_type not in ("Float64", "Float32", "Float16"):
            raise InvalidInput(f"field {field!r}: {ff_type} tensors take numbers (null only in Float tensors)")
        values = [math.nan if v is None else v for v in values]
    try:
        if any(type(v) is str for v in values):  # protobuf's JSON mapping: numbers in strings ("NaN" too)
            values = [_number_text(v, ff_type) if type(v) is str else v for v in values]
        raw = np.array(values)
        if raw.dtype.kind not in "iuf" or raw.ndim != 1:
            raise ValueError
        return numbers_as(raw, _FF_TO_V2[ff_type], ff_type)
    except NotRepresentable as exc:
        raise InvalidInput(f"field {field!r}: {exc}") from None
    except (ValueError, TypeError, OverflowError):
        raise InvalidInput(f"field {field!r}: values are not valid {ff_type} numbers") from None


def _number_text(text: str, ff_type: str) -> int | float:
    """A number given as a string: an integer for the Int types when it is written as one."""
    if "_" in text:  # Python's digit grouping: not a JSON number
        raise ValueError(text)
    if ff_type.startswith("Int"):
        try:
            return int(text)
        except ValueError:
            pass
    return float(text)


def _frame(schema: Sequence[tuple[str, list[str]]], datums: Iterable[Sequence[tuple[str, Sequence[Any]]]]) -> Frame:
    """Assemble columns from parsed schema entries and per-record (type key, values) tensors."""
    if not schema:
        raise InvalidInput("schema: at least one entry is required")
    by_type: dict[str, list[str]] = {}
    names: set[str] = set()
    for i, (ff_type, fields) in enumerate(schema):
        if ff_type in by_type:
            raise InvalidInput(f"schema[{i}]: a second {ff_type} entry; list all {ff_type} fields in one entry")
        if not fields:
            raise InvalidInput(f"schema[{i}]: fields must not be empty")
        dupes = names.intersection(fields)
        if dupes or len(set(fields)) != len(fields):
            raise InvalidInput(f"schema[{i}]: duplicate field name(s) {sorted(dupes) or fields}")
        names.update(fields)
        by_type[ff_type] = fields
    values: dict[str, list[list[Any]]] = {t: [[] for _ in f] for t, f in by_type.items()}
    rows = 0
    for r, tensors in enumerate(datums):
        seen: set[str] = set()
        for key, data in tensors:
            group = _KEY_TO_TYPE.get(key)
            if group is None:
                raise InvalidInput(f"datum[{r}]: unknown tensor type {key!r}; expected one of {', '.join(TENSOR_KEY.values())}")
            group_fields = by_type.get(group)
            if group_fields is None:
                raise InvalidInput(f"datum[{r}]: a {group} tensor but the schema has no {group} entry")
            if group in seen:
                raise InvalidInput(f"datum[{r}]: two {group} tensors")
            if len(data) != len(group_fields):
                raise InvalidInput(
                    f"datum[{r}]: the {group} tensor has {len(data)} value(s) for {len(group_fields)} schema field(s)"
                )
            seen.add(group)
            for column, value in zip(values[group], data):
                column.append(value)
        if len(seen) != len(by_type):
            missing = ", ".join(t for t in by_type if t not in seen)
            raise InvalidInput(f"datum[{r}]: no tensor for schema type(s) {missing}")
        rows += 1
    if rows == 0:
        raise InvalidInput("datum: at least one record is required")
    columns = {
        field: _column(ff_type, column, field)
        for ff_type, fields in by_type.items()
        for field, column in zip(fields, values[ff_type])
    }
    return Frame(columns)


def _schema_entry(entry: Any, i: int) -> tuple[str, list[str]]:
    if not isinstance(entry, dict):
        raise InvalidInput(f"schema[{i}]: expected an object with type and fields")
    ff_type = entry.get("type")
    if not isinstance(ff_type, str) or ff_type not in FF_DTYPES:
        raise InvalidInput(f"schema[{i}].type: unknown tensor type {ff_type!r}; expected one of {', '.join(FF_DTYPES)}")
    fields = entry.get("fields")
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise InvalidInput(f"schema[{i}].fields: expected an array of names")
    return ff_type, fields


def _json_tensors(datum: Any, r: int) -> list[tuple[str, Sequence[Any]]]:
    tensors = datum.get("tensors") if isinstance(datum, dict) else None
    if not isinstance(tensors, list) or not tensors:
        raise InvalidInput(f"datum[{r}].tensors: expected a non-empty array")
    out: list[tuple[str, Sequence[Any]]] = []
    for t, tensor in enumerate(tensors):
        if not isinstance(tensor, dict) or len(tensor) != 1:
            raise InvalidInput(
                f'datum[{r}].tensors[{t}]: expected an object with one type key, e.g. {{"Float64": {{"data": [...]}}}}'
            )
        ((key, body),) = tensor.items()
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise InvalidInput(f"datum[{r}].tensors[{t}].{key}.data: expected an array")
        out.append((key, data))
    return out


def frame_from_json(body: Any) -> tuple[Frame, dict[str, str]]:
    """Parse an InferenceRequest JSON body into a Frame and its configs."""
    if not isinstance(body, dict):
        raise InvalidInput("body: expected an InferenceRequest object with schema and datum")
    schema = body.get("schema")
    datum = body.get("datum")
    if not isinstance(schema, list):
        raise InvalidInput("schema: required, an array of {type, fields}")
    if not isinstance(datum, list):
        raise InvalidInput("datum: required, an array of records")
    configs = body.get("configs") or {}
    if not isinstance(configs, dict) or not all(isinstance(v, str) for v in configs.values()):
        raise InvalidInput("configs: expected an object of string values")
    entries = [_schema_entry(e, i) for i, e in enumerate(schema)]
    frame = _frame(entries, (_json_tensors(d, r) for r, d in enumerate(datum)))
    frame.parameters = dict(configs)
    return frame, dict(configs)


def frame_from_json_body(body: bytes) -> tuple[Frame, dict[str, str]] | None:
    """An InferenceRequest JSON body read in C straight into the Frame :func:`frame_from_json` makes of it.

    None when the body is not the regular shape (see ``_ffjson.score_request``): then
    ``frame_from_json`` of the parsed body decodes it, or says what is wrong.
    """
    parsed = _ffjson.score_request(body)
    if parsed is None:
        return None
    columns, configs = parsed
    configs = configs or {}
    return Frame(columns, dict(configs)), dict(configs)


def frame_from_proto(payload: bytes) -> tuple[Frame, dict[str, str]]:
    """Parse a binary InferenceRequest protobuf."""
    request = pb.InferenceRequest()
    try:
        request.ParseFromString(payload)
    except Exception:  # protobuf raises DecodeError or RuntimeWarning-ish errors by backend
        raise InvalidInput("body: not a valid InferenceRequest protobuf") from None
    schema = []
    for i, entry in enumerate(request.schema):
        if not entry.HasField("type"):
            raise InvalidInput(f"schema[{i}].type: required")
        schema.append((pb.TensorType.Name(entry.type), _proto_text(list(entry.fields), f"schema[{i}].fields")))
    datums = ([(t.WhichOneof("sealed_value") or "?", _proto_values(t)) for t in d.tensors] for d in request.datum)
    frame = _frame(schema, datums)
    configs = dict(
        zip(_proto_text(list(request.configs.keys()), "configs"), _proto_text(list(request.configs.values()), "configs"))
    )
    frame.parameters = configs
    return frame, configs


def _proto_values(tensor: Any) -> list[Any]:
    kind = tensor.WhichOneof("sealed_value") or "String"
    values = list(getattr(tensor, kind).data)
    return _proto_text(values, f"{kind} data") if kind == "String" else values


def _proto_text(values: list[Any], where: str) -> list[Any]:
    """Strings of a proto2 message: protobuf hands invalid UTF-8 over as bytes, which is a 400 here."""
    if any(type(v) is bytes for v in values):
        try:
            return [v.decode("utf-8") if type(v) is bytes else v for v in values]
        except UnicodeDecodeError:
            raise InvalidInput(f"{where}: not valid UTF-8") from None
    return values


# ---- output -----------------------------------------------------------------------------------
def ff_type_name(datatype: str) -> str:
    """The ForestFlow TensorType name for a V2 datatype (BYTES -> String)."""
    return "String" if datatype == "BYTES" else _V2_TO_FF[datatype]


#: numpy dtype -> ForestFlow type for the native fixed-width dtypes (a dict lookup per column).
_FF_OF_DTYPE: dict[np.dtype[Any], str] = {dtype: _V2_TO_FF[name] for name, dtype in DATATYPES.items() if name in _V2_TO_FF}


_INT64_MAX = np.iinfo(np.int64).max


def exact_columns(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``columns`` as ForestFlow's types hold them exactly: an unsigned 64-bit column with a value
    past Int64's range goes out as its decimal text (a String column), as no ForestFlow type holds
    it (written as Int64 it read back negative). The same dict when nothing needs that."""
    big = [
        name
        for name, c in columns.items()
        if c.dtype.kind == "u" and c.dtype.itemsize == 8 and c.size and int(c.max()) > _INT64_MAX
    ]
    if not big:
        return columns
    out = dict(columns)
    for name in big:
        text = np.empty(columns[name].shape, dtype=object)
        text.reshape(-1)[:] = [str(v) for v in columns[name].reshape(-1).tolist()]
        out[name] = text
    return out


def _ff_type(column: np.ndarray) -> str:
    ff_type = _FF_OF_DTYPE.get(column.dtype)
    if ff_type is not None:
        return ff_type
    dt = datatype_of(column)  # text and object columns, other byte orders
    if dt == "BYTES":
        first = column.flat[0] if column.size else ""
        return "Bytes" if isinstance(first, (bytes, bytearray)) else "String"
    return _V2_TO_FF[dt]


def type_groups(frame: Frame) -> list[tuple[str, list[str]]]:
    """Output columns grouped by ForestFlow type, in order of first appearance (one schema entry each)."""
    groups: dict[str, list[str]] = {}
    for name, column in frame.columns.items():
        groups.setdefault(_ff_type(column), []).append(name)
    return list(groups.items())


@functools.lru_cache(maxsize=1024)
def _schema_json(groups: tuple[tuple[str, tuple[str, ...]], ...]) -> bytes:
    """The ``schema`` JSON of a layout (outputs of one servable share theirs)."""
    return orjson.dumps([{"type": t, "fields": list(names)} for t, names in groups])


@functools.lru_cache(maxsize=1024)
def _fqrv_json(fqrv: FQRV) -> bytes:
    return orjson.dumps(fqrv_to_json(fqrv))


def _json_values(ff_type: str, values: list[Any]) -> list[Any]:
    if ff_type == "Int64":
        return [str(v) for v in values]
    if ff_type == "Bytes":
        return [base64.b64encode(v).decode() for v in values]
    return values


def row_values(frame: Frame, names: list[str]) -> list[list[Any]]:
    """Per row, the values of the named columns concatenated (vector columns contribute all theirs)."""
    n = frame.num_rows
    cols = [frame.columns[name] for name in names]
    if all(c.ndim == 1 for c in cols):
        if len(cols) == 1:
            return [[v] for v in cols[0].tolist()]
        return [list(row) for row in zip(*(c.tolist() for c in cols))]
    rows: list[list[Any]] = [[] for _ in range(n)]
    for col in cols:
        flat = col.reshape(n, -1).tolist() if col.ndim > 1 else [[v] for v in col.tolist()]
        for row, vals in zip(rows, flat):
            row.extend(vals)
    return rows


_dumps = partial(orjson.dumps, option=orjson.OPT_SERIALIZE_NUMPY)


def _group_json(frame: Frame, ff_type: str, names: list[str]) -> bytes:
    """One typed group's values as the JSON array of its rows, ``[[...], ...]``: one orjson call."""
    cols = [frame.columns[name] for name in names]
    if frame.num_rows == 1:  # the common single record: its values in one list (numpy's stacking costs more)
        return _dumps([_json_values(ff_type, list(chain.from_iterable(c.reshape(-1).tolist() for c in cols)))])
    flat = all(c.ndim == 1 for c in cols)
    if flat and ff_type in ("Float64", "Bool"):
        return _dumps(np.column_stack(cols))
    if flat and ff_type == "String":
        return _dumps(np.column_stack(cols).tolist())  # the rows' lists made by numpy, not per record here
    rows = row_values(frame, names)
    if ff_type in ("Int64", "Bytes"):
        rows = [_json_values(ff_type, r) for r in rows]
    return _dumps(rows)


@functools.lru_cache(maxsize=1024)
def _openings(types: tuple[str, ...]) -> list[bytes]:
    """What comes before each group's row in a datum record (the record's opening before the first)."""
    return [(b'{"tensors":[' if g == 0 else b"}},") + b'{"' + TENSOR_KEY[t].encode() + b'":{"data":' for g, t in enumerate(types)]


def _schema_datum_bytes(frame: Frame) -> tuple[bytes, bytes]:
    """A frame as ForestFlow's ``schema`` and ``datum`` JSON: typed groups in column order, one datum per row.

    Each group's rows are written by one orjson call; ``_ffjson.datum`` interleaves them into the
    records with the constant JSON around them (no Python object per record).
    """
    columns = exact_columns(frame.columns)
    if columns is not frame.columns:
        frame = Frame(columns, frame.parameters)
    groups = type_groups(frame)
    schema = _schema_json(tuple((t, tuple(names)) for t, names in groups))
    if not groups or frame.num_rows == 0:
        return schema, b"[]"
    rows = [_group_json(frame, ff_type, names) for ff_type, names in groups]
    datum = _ffjson.datum(frame.num_rows, _openings(tuple(t for t, _ in groups)), rows, b"}}]}")
    if datum is None:  # a group of another number of rows: cannot happen for a Frame's equally long columns
        raise AssertionError(f"datum: a group's rows do not match the frame's {frame.num_rows} records")
    return schema, datum


def one_name_per_value(frame: Frame) -> Frame:
    """The frame with every vector column (``k > 1`` values a row) as ``k`` columns ``name.0`` ..
    ``name.<k-1>`` (row-major for more dimensions): ForestFlow's schema names one field per value,
    so a Prediction is read without the model's metadata. A frame of 1-D columns is returned as it is."""
    columns = frame.columns
    if all(c.ndim == 1 for c in columns.values()):
        return frame
    out: dict[str, np.ndarray] = {}
    for name, col in columns.items():
        if col.ndim == 1:
            out[name] = col
            continue
        flat = col.reshape(len(col), int(np.prod(col.shape[1:])))  # (not -1: a frame of no rows)
        if flat.shape[1] <= 1:  # one value a row (or none) is named already: the column keeps its name
            out[name] = flat[:, 0] if flat.shape[1] == 1 else col
            continue
        for j in range(flat.shape[1]):
            out[f"{name}.{j}"] = np.ascontiguousarray(flat[:, j])
    return Frame(out, frame.parameters)


def prediction_json(fqrv: FQRV, frame: Frame, unknown_inputs: Sequence[str] = (), missing_inputs: Sequence[str] = ()) -> bytes:
    """The ``Prediction`` body (fqrv, schema, one datum per row, unknown and missing input names if any), without the envelope.

    Vector outputs get one field name per value (:func:`one_name_per_value`)."""
    schema, datum = _schema_datum_bytes(one_name_per_value(frame))
    out = b'{"fqrv":' + _fqrv_json(fqrv) + b',"schema":' + schema + b',"datum":' + datum
    if unknown_inputs:
        out += b',"unknownInputs":' + orjson.dumps(list(unknown_inputs))
    if missing_inputs:
        out += b',"missingInputs":' + orjson.dumps(list(missing_inputs))
    return out + b"}"


def request_json(frame: Frame, configs: dict[str, str]) -> bytes:
    """An InferenceRequest JSON for an input frame (the prediction log's copy of the request)."""
    schema, datum = _schema_datum_bytes(frame)
    out = b'{"schema":' + schema + b',"datum":' + datum
    if configs:
        out += b',"configs":' + orjson.dumps(configs)
    return out + b"}"
