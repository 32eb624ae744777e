"""Frames straight to ForestFlow's protobuf wire format (InferenceRequest, Prediction).

Building these messages through the protobuf API costs a Python call per record and tensor,
and even assembled in Python the records cost several times the request they log. Here what
depends only on the frame's layout (type groups, the schema entries) is built in Python and
cached per layout, and every record's Datum is written by one C call (``_ffwire.datums``) that
reads the numpy columns as they are. The output parses to exactly the message the protobuf API
builds (tested)."""

from __future__ import annotations

import functools

import numpy as np

from forestflow._proto import forestflow_pb2 as pb
from forestflow.codecs import _ffwire
from forestflow.codecs.schema_datum import FF_DTYPES, TENSOR_KEY, _ff_type
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV

#: The Tensor oneof field number of each ForestFlow type.
_TENSOR_FIELD = {name: pb.Tensor.DESCRIPTOR.fields_by_name[key].number for name, key in TENSOR_KEY.items()}
#: TensorType enum value of each type name.
_TYPE_NUMBER = {name: pb.TensorType.Value(name) for name in TENSOR_KEY}
#: The ForestFlow types in the order of the C writer's type codes (``_ffwire.kinds``).
_FF_TYPES = tuple(FF_DTYPES)
#: What the C writer requires of a text group's elements: str (String) or bytes (Bytes).
_TEXT = {"String": 1, "Bytes": 2}
#: The dtype a column the C writer cannot read as it is gets converted to, per ForestFlow type.
_READABLE = {"Float64": np.float64, "Float32": np.float32, "Float16": np.float32, "String": object, "Bytes": object}

_SMALL = [bytes((i,)) for i in range(128)]
#: Protobuf base-128 varint of an int (negative numbers as 64-bit two's complement), in C.
varint = _ffwire.varint


def _field(tag: bytes, payload: bytes) -> bytes:
    n = len(payload)
    return tag + (_SMALL[n] if n < 128 else varint(n)) + payload


def key(number: int, wire_type: int) -> bytes:
    """A field's key (tag): its number and wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32)."""
    return varint((number << 3) | wire_type)


@functools.cache
def _tensor_tag(ff_type: str) -> bytes:
    return key(_TENSOR_FIELD[ff_type], 2)


@functools.lru_cache(maxsize=1024)
def _schema(entry_tag: bytes, groups: tuple[tuple[str, tuple[str, ...]], ...]) -> bytes:
    """Every TensorSchema entry of a layout, each as field ``entry_tag``."""
    return b"".join(
        _field(entry_tag, b"\x08" + varint(_TYPE_NUMBER[ff_type]) + b"".join(_field(b"\x12", f.encode()) for f in names))
        for ff_type, names in groups
    )


@functools.lru_cache(maxsize=1024)
def _plan(names: tuple[str, ...], codes: bytes) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], tuple[tuple[bytes, int, tuple[int, ...]], ...]]:
    """A layout's type groups (for its schema) and, per group, its Tensor tag, text flag and column indices."""
    groups: dict[str, list[int]] = {}
    for i, code in enumerate(codes):
        groups.setdefault(_FF_TYPES[code], []).append(i)
    layout = tuple((ff_type, tuple(names[i] for i in indices)) for ff_type, indices in groups.items())
    return layout, tuple((_tensor_tag(ff_type), _TEXT.get(ff_type, 0), tuple(indices)) for ff_type, indices in groups.items())


def _readable(columns: list[np.ndarray]) -> tuple[list[np.ndarray], bytes]:
    """Columns converted to what the C writer reads (contiguous, native order, text as objects), and their type codes."""
    types = [_ff_type(c) for c in columns]
    converted = [np.ascontiguousarray(c, dtype=_READABLE.get(t, np.int64 if t != "Bool" else np.bool_)) for c, t in zip(columns, types)]
    return converted, bytes(_FF_TYPES.index(t) for t in types)


def _schema_and_datums(frame: Frame, schema_tag: bytes, datum_tag: bytes) -> bytes:
    """The schema entries and one Datum per record of a frame, as fields ``schema_tag`` and ``datum_tag``."""
    columns = list(frame.columns.values())
    codes = _ffwire.kinds(columns)
    if 255 in codes:  # e.g. a column sliced with a step, fixed-width text, another byte order
        columns, codes = _readable(columns)
    layout, groups = _plan(tuple(frame.columns), codes)
    schema = _schema(schema_tag, layout)
    rows = frame.num_rows
    if not layout or rows == 0:
        return schema
    return schema + _ffwire.datums(datum_tag, rows, columns, groups)


def inference_request_bytes(frame: Frame, configs: dict[str, str]) -> bytes:
    """A serialized InferenceRequest of an input frame and its configs."""
    out = _schema_and_datums(frame, b"\x0a", b"\x12")
    return out + _ffwire.string_map(b"\x1a", configs) if configs else out


@functools.lru_cache(maxsize=1024)
def fqrv_bytes(fqrv: FQRV) -> bytes:
    """A serialized FQRV."""
    c = fqrv.contract
    contract = _field(b"\x0a", c.organization.encode()) + _field(b"\x12", c.project.encode()) + b"\x18" + varint(c.number)
    return _field(b"\x0a", contract) + _field(b"\x12", fqrv.release.encode())


def prediction_bytes(fqrv: FQRV, frame: Frame) -> bytes:
    """A serialized Prediction of an output frame."""
    return _field(b"\x0a", fqrv_bytes(fqrv)) + _schema_and_datums(frame, b"\x12", b"\x1a")


def embedded(number: int, payload: bytes) -> bytes:
    """``payload`` as length-delimited field ``number`` (to append to a serialized message)."""
    return _field(key(number, 2), payload)
