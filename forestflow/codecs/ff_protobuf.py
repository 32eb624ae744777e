"""Frames straight to ForestFlow's protobuf wire format (InferenceRequest, Prediction).

Building these messages through the protobuf API costs a Python call per record and tensor,
and even assembled in Python the records cost several times the request they log. Here one C
call (``_ffwire.message``) writes a whole message: its schema (one entry per type group), one
Datum per record read from the numpy columns as they are, and an InferenceRequest's configs.
The output parses to exactly the message the protobuf API builds (tested)."""

from __future__ import annotations

import functools

import numpy as np

from forestflow._proto import forestflow_pb2 as pb
from forestflow.codecs import _ffwire
from forestflow.codecs.schema_datum import FF_DTYPES, TENSOR_KEY, _ff_type, exact_columns, one_name_per_value
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV

#: The ForestFlow types in the order of the C writer's type codes.
_FF_TYPES = tuple(FF_DTYPES)

_SMALL = [bytes((i,)) for i in range(128)]
#: Protobuf base-128 varint of an int (negative numbers as 64-bit two's complement), in C.
varint = _ffwire.varint
#: The varint at a position of a bytes-like object and the position after it: (value, next_pos), in C.
read_varint = _ffwire.read_varint


def _field(tag: bytes, payload: bytes) -> bytes:
    n = len(payload)
    return tag + (_SMALL[n] if n < 128 else varint(n)) + payload


def key(number: int, wire_type: int) -> bytes:
    """A field's key (tag): its number and wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32)."""
    return varint((number << 3) | wire_type)


_ffwire.set_types(
    tuple((pb.TensorType.Value(name), key(pb.Tensor.DESCRIPTOR.fields_by_name[TENSOR_KEY[name]].number, 2)) for name in _FF_TYPES)
)


def _readable(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Columns converted to what the C writer reads: contiguous, native order, text as objects (each
    to the dtype of its ForestFlow type, so it keeps that type; see ``exact_columns`` for uint64)."""
    return {name: np.ascontiguousarray(c, dtype=FF_DTYPES[_ff_type(c)]) for name, c in exact_columns(columns).items()}


def _converted(
    outer: bytes, prefix: bytes, schema_tag: int, datum_tag: int, frame: Frame, configs: dict[str, str] | None
) -> bytes:
    """The message of a frame whose columns the C writer could not read as they are (e.g. a column
    sliced with a step, fixed-width text, another byte order, a uint64 past Int64's range): written
    from converted copies."""
    out = _ffwire.message(outer, prefix, schema_tag, datum_tag, frame.num_rows, _readable(frame.columns), configs)
    if out is None:  # converted columns are exactly what the writer reads
        raise TypeError(f"the C writer refused converted columns of {', '.join(frame.columns)}")
    return out


def inference_request_bytes(frame: Frame, configs: dict[str, str], field: bytes = b"") -> bytes:
    """A serialized InferenceRequest of an input frame and its configs (as field key ``field`` when given)."""
    # The frame's own column dict goes to C as it is (no tuple of names and list of columns per message).
    # rows -1: C takes the first column's length (Frame.num_rows is a Python property, per message).
    out = _ffwire.message(field, b"", 0x0A, 0x12, -1, frame.columns, configs)
    return out if out is not None else _converted(field, b"", 0x0A, 0x12, frame, configs)


def inference_request_between(before: bytes, frame: Frame, configs: dict[str, str], field: bytes, after: bytes) -> bytes:
    """``before + inference_request_bytes(frame, configs, field) + after``, the three written in one buffer
    (a prediction event's head, its request and its answer: no join copying the request again)."""
    out = _ffwire.message(field, b"", 0x0A, 0x12, -1, frame.columns, configs, False, before, after)
    return out if out is not None else b"".join((before, _converted(field, b"", 0x0A, 0x12, frame, configs), after))


@functools.lru_cache(maxsize=1024)
def fqrv_bytes(fqrv: FQRV) -> bytes:
    """A serialized FQRV."""
    c = fqrv.contract
    contract = _field(b"\x0a", c.organization.encode()) + _field(b"\x12", c.project.encode()) + b"\x18" + varint(c.number)
    return _field(b"\x0a", contract) + _field(b"\x12", fqrv.release.encode())


@functools.lru_cache(maxsize=1024)
def prediction_fqrv_field(fqrv: FQRV) -> bytes:
    """A Prediction's fqrv field (field 1), for callers that keep it (see :func:`prediction_bytes_after`)."""
    return _field(b"\x0a", fqrv_bytes(fqrv))


def prediction_bytes(fqrv: FQRV, frame: Frame, field: bytes = b"") -> bytes:
    """A serialized Prediction of an output frame (as field key ``field`` when given)."""
    return prediction_bytes_after(prediction_fqrv_field(fqrv), frame, field)


def prediction_bytes_after(fqrv_field: bytes, frame: Frame, field: bytes = b"") -> bytes:
    """:func:`prediction_bytes` with the fqrv field already written (by :func:`prediction_fqrv_field`).

    Vector outputs get one field name per value, as in the JSON body."""
    # Written as it is when every column is 1-D (the usual answer: no per-column check in Python).
    out = _ffwire.message(field, fqrv_field, 0x12, 0x1A, -1, frame.columns, None, True)
    if out is not None:
        return out
    frame = one_name_per_value(frame)
    out = _ffwire.message(field, fqrv_field, 0x12, 0x1A, frame.num_rows, frame.columns, None)
    return out if out is not None else _converted(field, fqrv_field, 0x12, 0x1A, frame, None)


def embedded(number: int, payload: bytes) -> bytes:
    """``payload`` as length-delimited field ``number`` (to append to a serialized message)."""
    return _field(key(number, 2), payload)
