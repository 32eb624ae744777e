"""Frames straight to ForestFlow's protobuf wire format (InferenceRequest, Prediction).

Building these messages through the protobuf API costs a Python call per record and tensor,
which dominated the prediction log's cost on Kafka. Here the bytes are assembled directly. What
depends only on the frame's layout (the schema entries, the constant tag and length prefix of a
fixed-width tensor) is built once and cached; per record, strings are joined from cached
elements and float tensors are packed with ``struct`` (a few records) or written by numpy for the
whole group at once. The output parses to exactly the message the protobuf API builds (tested).
"""

from __future__ import annotations

import functools
import struct

import numpy as np

from forestflow._proto import forestflow_pb2 as pb
from forestflow.codecs.schema_datum import TENSOR_KEY, row_values, type_groups
from forestflow.core.frame import Frame
from forestflow.core.ids import FQRV

#: The Tensor oneof field number of each ForestFlow type.
_TENSOR_FIELD = {name: pb.Tensor.DESCRIPTOR.fields_by_name[key].number for name, key in TENSOR_KEY.items()}
#: TensorType enum value of each type name.
_TYPE_NUMBER = {name: pb.TensorType.Value(name) for name in TENSOR_KEY}
#: (tag byte, numpy little-endian dtype, struct code) of the fixed-width element types.
_FIXED = {"Float64": (0x09, "<f8", "d"), "Float32": (0x0D, "<f4", "f"), "Float16": (0x0D, "<f4", "f")}
#: Up to this many records, struct per record beats setting up numpy arrays.
_STRUCT_MAX_ROWS = 4

_SMALL = [bytes((i,)) for i in range(128)]


def varint(value: int) -> bytes:
    """Protobuf base-128 varint (negative numbers as 64-bit two's complement)."""
    if 0 <= value < 128:
        return _SMALL[value]
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    n = len(payload)
    return tag + (_SMALL[n] if n < 128 else varint(n)) + payload


def key(number: int, wire_type: int) -> bytes:
    """A field's key (tag): its number and wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32)."""
    return varint((number << 3) | wire_type)


@functools.lru_cache(maxsize=4096)
def _string_element(value: str) -> bytes:
    """One ``data`` string element; categorical values repeat, so they are cached."""
    return _field(b"\x0a", value.encode())


@functools.cache
def _tensor_tag(ff_type: str) -> bytes:
    return key(_TENSOR_FIELD[ff_type], 2)


def _tensor(ff_type: str, data: bytes) -> bytes:
    """A ``Datum.tensors`` entry holding the encoded ``data`` elements of one typed group."""
    return _field(b"\x0a", _field(_tensor_tag(ff_type), data))


@functools.lru_cache(maxsize=1024)
def _schema(entry_tag: bytes, groups: tuple[tuple[str, tuple[str, ...]], ...]) -> bytes:
    """Every TensorSchema entry of a layout, each as field ``entry_tag``."""
    return b"".join(
        _field(entry_tag, b"\x08" + varint(_TYPE_NUMBER[ff_type]) + b"".join(_field(b"\x12", f.encode()) for f in names))
        for ff_type, names in groups
    )


@functools.lru_cache(maxsize=256)
def _fixed_layout(ff_type: str, count: int) -> tuple[bytes, struct.Struct, np.dtype]:
    """For ``count`` float elements: the tensor's constant prefix, a struct and a numpy record of one row."""
    tag, dtype, code = _FIXED[ff_type]
    width = count * (1 + np.dtype(dtype).itemsize)
    prefix = _tensor(ff_type, bytes(width))[:-width] if width else _tensor(ff_type, b"")
    row = struct.Struct(f"<{len(prefix)}s" + ("B" + code) * count)
    record = np.dtype([("prefix", "u1", (len(prefix),)), ("cells", [("tag", "u1"), ("value", dtype)], (count,))])
    return prefix, row, record


def _fixed_rows(frame: Frame, names: list[str], ff_type: str) -> list[bytes]:
    """Per record, the tensor of a float group: a constant prefix, then (tag, value) per element."""
    n = frame.num_rows
    tag = _FIXED[ff_type][0]
    if n <= _STRUCT_MAX_ROWS:
        rows = row_values(frame, names)
        prefix, packer, _ = _fixed_layout(ff_type, len(rows[0]))
        return [packer.pack(prefix, *[x for v in row for x in (tag, v)]) for row in rows]
    values = np.concatenate([frame.columns[name].reshape(n, -1) for name in names], axis=1)
    prefix, _, record = _fixed_layout(ff_type, values.shape[1])
    cells = np.empty(n, dtype=record)
    cells["prefix"] = np.frombuffer(prefix, dtype=np.uint8)
    cells["cells"]["tag"] = tag
    cells["cells"]["value"] = values
    raw = cells.tobytes()
    width = record.itemsize
    return [raw[i : i + width] for i in range(0, n * width, width)]


@functools.lru_cache(maxsize=64)
def _prefixes(outer: bytes, inner: bytes) -> tuple[bytes, ...]:
    """``outer`` + length + ``inner`` + length before a payload of n bytes, for every n that keeps
    both lengths one byte long (``inner`` empty: a single field ``outer``)."""
    if not inner:
        return tuple(outer + _SMALL[n] for n in range(128))
    return tuple(outer + _SMALL[len(inner) + 1 + n] + inner + _SMALL[n] for n in range(127 - len(inner)))


def _wrapped(payloads: list[bytes], outer: bytes, inner: bytes = b"") -> list[bytes]:
    """Each payload as field ``outer`` (holding it as field ``inner`` when given).

    The common short payloads take their prefix from a table through C-level ``map`` calls, not
    a Python call each; a long one anywhere sends the whole list down the general path.
    """
    table = _prefixes(outer, inner)
    try:
        return list(map(bytes.__add__, map(table.__getitem__, map(len, payloads)), payloads))
    except IndexError:
        if inner:
            payloads = [_field(inner, p) for p in payloads]
        return [_field(outer, p) for p in payloads]


def _tensor_rows(frame: Frame, names: list[str], ff_type: str) -> list[bytes]:
    """Per record, the ``Datum.tensors`` entry of one typed group."""
    if ff_type in _FIXED:
        return _fixed_rows(frame, names, ff_type)
    columns = [frame.columns[name] for name in names]
    if ff_type == "String" and all(c.ndim == 1 for c in columns):
        # Column by column: one C-level map over each column's (cached) elements.
        encoded = [list(map(_string_element, c.tolist())) for c in columns]
        data = encoded[0] if len(encoded) == 1 else list(map(b"".join, zip(*encoded)))
    else:
        rows = row_values(frame, names)
        if ff_type == "String":
            data = [b"".join(map(_string_element, row)) for row in rows]
        elif ff_type == "Bytes":
            data = [b"".join(_field(b"\x0a", bytes(v)) for v in row) for row in rows]
        else:  # Int8..Int64 and Bool: varints after tag 0x08
            data = [b"".join(b"\x08" + varint(int(v)) for v in row) for row in rows]
    return _wrapped(data, b"\x0a", _tensor_tag(ff_type))


def _schema_and_datums(frame: Frame, schema_tag: bytes, datum_tag: bytes) -> bytes:
    """The schema entries and one Datum per record of a frame, as fields ``schema_tag`` and ``datum_tag``."""
    groups = type_groups(frame)
    schema = _schema(schema_tag, tuple((ff_type, tuple(names)) for ff_type, names in groups))
    if not groups or frame.num_rows == 0:
        return schema
    per_group = [_tensor_rows(frame, names, ff_type) for ff_type, names in groups]
    datums = per_group[0] if len(per_group) == 1 else list(map(b"".join, zip(*per_group)))
    return schema + b"".join(_wrapped(datums, datum_tag))


def inference_request_bytes(frame: Frame, configs: dict[str, str]) -> bytes:
    """A serialized InferenceRequest of an input frame and its configs."""
    out = _schema_and_datums(frame, b"\x0a", b"\x12")
    if configs:
        out += b"".join([_field(b"\x1a", _field(b"\x0a", k.encode()) + _field(b"\x12", v.encode())) for k, v in configs.items()])
    return out


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
