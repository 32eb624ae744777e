"""GraphPipe flatbuffers <-> numpy tensors and Frames.

Reads a ``Request`` (an ``InferRequest`` or a ``MetadataRequest``) and writes the bare root
``InferResponse`` / ``MetadataResponse`` tables GraphPipe clients expect. Input tensors become
Frame columns, one row per ``shape[0]``:

- by ``input_names`` when the request has them;
- without names, for a model whose inputs are all scalar columns (H2O), by ForestFlow's grouping:
  a String tensor fills the model's categorical (BYTES) inputs and a numeric tensor its numeric
  inputs, in metadata order;
- without names, for a model with a vector (or N-D) input (an ONNX ``[N, F]`` input, say), one
  tensor per input in metadata order.

A tensor for a vector input must match its declared shape past the record axis (``[n, 4]`` for
``[-1, 4]``). Outputs: without ``output_names``, the FQRV as a ``[1, 1]`` String tensor followed
by every model output; with them, exactly the named tensors in the requested order (``fqrv``
names the FQRV tensor). 1-D columns go out as ``[n, 1]``.

Every malformed input raises :class:`InvalidInput` with a message that names the culprit; the
reader checks vector lengths against the buffer size so a corrupt body cannot make it loop.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import flatbuffers
import numpy as np

from forestflow._proto.graphpipe import (
    Error,
    InferResponse,
    IOMetadata,
    MetadataResponse,
)
from forestflow._proto.graphpipe.Req import Req
from forestflow._proto.graphpipe.Type import Type
from forestflow.codecs import _ffgp
from forestflow.core.frame import DATATYPES, NUMERIC_DATATYPES, Frame, TensorSpec
from forestflow.core.ids import FQRV
from forestflow.errors import InvalidInput
from forestflow.runtime.base import ServableMetadata

#: GraphPipe numeric type -> numpy dtype (little-endian on the wire).
GP_DTYPES: dict[int, np.dtype[Any]] = {
    Type.Uint8: np.dtype("<u1"),
    Type.Int8: np.dtype("<i1"),
    Type.Uint16: np.dtype("<u2"),
    Type.Int16: np.dtype("<i2"),
    Type.Uint32: np.dtype("<u4"),
    Type.Int32: np.dtype("<i4"),
    Type.Uint64: np.dtype("<u8"),
    Type.Int64: np.dtype("<i8"),
    Type.Float16: np.dtype("<f2"),
    Type.Float32: np.dtype("<f4"),
    Type.Float64: np.dtype("<f8"),
}
#: V2 datatype -> GraphPipe type. GraphPipe has no boolean: BOOL goes out as Uint8.
GP_TYPE_OF_DATATYPE: dict[str, int] = {
    "UINT8": Type.Uint8,
    "INT8": Type.Int8,
    "UINT16": Type.Uint16,
    "INT16": Type.Int16,
    "UINT32": Type.Uint32,
    "INT32": Type.Int32,
    "UINT64": Type.Uint64,
    "INT64": Type.Int64,
    "FP16": Type.Float16,
    "FP32": Type.Float32,
    "FP64": Type.Float64,
    "BYTES": Type.String,
    "BOOL": Type.Uint8,
}
GP_TYPE_NAMES: dict[int, str] = {v: k for k, v in vars(Type).items() if not k.startswith("_")}
_GP_TYPE_OF_DTYPE: dict[np.dtype[Any], int] = {dt.newbyteorder("="): t for t, dt in GP_DTYPES.items()}
#: Each wire type's dtype in this machine's byte order (what a request's arrays become).
_NATIVE: dict[int, np.dtype[Any]] = {t: dt.newbyteorder("=") for t, dt in GP_DTYPES.items()}
FQRV_OUTPUT = "fqrv"


@dataclass(slots=True)
class GPInferRequest:
    """A decoded ``InferRequest``: tensors as numpy arrays (strings as object arrays)."""

    config: str = ""
    input_names: list[str] = field(default_factory=list)
    tensors: list[np.ndarray] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)


class GPMetadataRequest:
    """A decoded ``MetadataRequest`` (it has no fields)."""


#: The usual InferRequest, checked whole in C (``_ffgp.plain_request``): its config, output names,
#: record count and tensors (one or two unnamed ``[rows, width]`` tensors, each ``(type, width, start)``).
PlainRequest = tuple[str, list[str], int, tuple[tuple[int, int, int], ...]]


# ---- reading ----------------------------------------------------------------------------------
# The body is read straight from its bytes: the generated accessors cost several Python calls per
# field (and a numpy round trip per vector), 100 us for a one-record request; a request has only a
# handful of fields, each read once here with its bounds checked.
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")


class _Corrupt(Exception):
    """An offset or length that points outside the body (reported as a corrupt flatbuffer)."""


class _Reader:
    """Bounds-checked access to the tables, vectors and strings of one flatbuffer."""

    __slots__ = ("buf", "size")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf if isinstance(buf, bytes) else bytes(buf)
        self.size = len(self.buf)

    def u32(self, pos: int) -> int:
        if pos < 0 or pos + 4 > self.size:
            raise _Corrupt
        return int(_U32.unpack_from(self.buf, pos)[0])

    def ref(self, pos: int) -> int:
        """Where the uoffset at ``pos`` points."""
        return pos + self.u32(pos)

    def table(self, pos: int) -> tuple[int, int, int]:
        """(table position, vtable position, vtable size) of the table at ``pos``."""
        if pos < 0 or pos + 4 > self.size:
            raise _Corrupt
        vtable = pos - _I32.unpack_from(self.buf, pos)[0]
        if vtable < 0 or vtable + 4 > self.size:
            raise _Corrupt
        vsize = _U16.unpack_from(self.buf, vtable)[0]
        if vtable + vsize > self.size:
            raise _Corrupt
        return pos, vtable, vsize

    def field(self, table: tuple[int, int, int], slot: int) -> int:
        """The position of the field in vtable ``slot`` (4, 6, ...), 0 when it is absent."""
        pos, vtable, vsize = table
        if slot + 2 > vsize:
            return 0
        offset = _U16.unpack_from(self.buf, vtable + slot)[0]
        if offset and pos + offset >= self.size:
            raise _Corrupt
        return pos + offset if offset else 0

    def u8(self, table: tuple[int, int, int], slot: int) -> int:
        pos = self.field(table, slot)
        return self.buf[pos] if pos else 0

    def vector(self, table: tuple[int, int, int], slot: int, elem_size: int, what: str) -> tuple[int, int]:
        """(position of the first element, element count) of a vector field; (0, 0) when absent."""
        pos = self.field(table, slot)
        if not pos:
            return 0, 0
        start = self.ref(pos)
        length = self.u32(start)
        if length * elem_size > self.size:
            raise InvalidInput(f"{what}: vector length {length} does not fit in a {self.size}-byte body")
        if start + 4 + length * elem_size > self.size:
            raise _Corrupt  # a cut-off body
        return start + 4, length

    def string(self, pos: int, what: str) -> bytes:
        """The string the uoffset at ``pos`` points to."""
        start = self.ref(pos)
        if start + 4 > self.size:
            raise InvalidInput(f"{what}: string offset outside the body")
        length = self.u32(start)
        if start + 4 + length > self.size:
            raise InvalidInput(f"{what}: string length outside the body")
        return bytes(self.buf[start + 4 : start + 4 + length])

    def strings(self, table: tuple[int, int, int], slot: int, what: str) -> list[bytes]:
        """A vector of strings (one loop: string columns can hold many records)."""
        start, count = self.vector(table, slot, 4, what)
        buf, size, unpack = self.buf, self.size, _U32.unpack_from
        out = []
        for slot_pos in range(start, start + 4 * count, 4):
            at = slot_pos + unpack(buf, slot_pos)[0]
            if at + 4 > size:
                raise InvalidInput(f"{what}[{(slot_pos - start) // 4}]: string offset outside the body")
            length = unpack(buf, at)[0]
            if at + 4 + length > size:
                raise InvalidInput(f"{what}[{(slot_pos - start) // 4}]: string length outside the body")
            out.append(buf[at + 4 : at + 4 + length])
        return out


def parse_request(body: bytes) -> GPInferRequest | GPMetadataRequest:
    """Decode a GraphPipe ``Request`` body; InvalidInput when it is not one."""
    if len(body) < 8:
        raise InvalidInput("body: empty or too short for a GraphPipe Request flatbuffer")
    reader = _Reader(body)
    # The usual request, its structure walked in C (_ffgp.infer_request); anything that walk
    # declines (a MetadataRequest, any bound outside the body) is read below, which says what is wrong.
    parts = _ffgp.infer_request(reader.buf)
    try:
        if parts is not None:
            raw_config, raw_names, raw_outputs, raw_tensors = parts
            names = [_text(v, f"input_names[{i}]") for i, v in enumerate(raw_names)]
            outputs = [_text(v, f"output_names[{i}]") for i, v in enumerate(raw_outputs)]
            tensors = [_tensor(reader, t, s, start, n, i) for i, (t, s, start, n) in enumerate(raw_tensors)]
            return GPInferRequest(_text(raw_config or b"", "config"), names, tensors, outputs)
        request = reader.table(reader.ref(0))
        kind = reader.u8(request, 4)  # req_type
        if kind == Req.MetadataRequest:
            return GPMetadataRequest()
        if kind != Req.InferRequest:
            raise InvalidInput(f"Request.req: expected an InferRequest or a MetadataRequest, got union type {kind}")
        req = reader.field(request, 6)
        if not req:
            raise InvalidInput("Request.req: missing")
        infer = reader.table(reader.ref(req))
        names = [_text(v, f"input_names[{i}]") for i, v in enumerate(reader.strings(infer, 6, "input_names"))]
        outputs = [_text(v, f"output_names[{i}]") for i, v in enumerate(reader.strings(infer, 10, "output_names"))]
        start, count = reader.vector(infer, 8, 4, "input_tensors")
        tensors = [_read_tensor(reader, reader.ref(start + 4 * i), i) for i in range(count)]
        config = reader.field(infer, 4)
        return GPInferRequest(_text(reader.string(config, "config") if config else b"", "config"), names, tensors, outputs)
    except InvalidInput:
        raise
    except Exception:  # _Corrupt, and struct/index errors from offsets that point nowhere
        raise InvalidInput("body: not a valid GraphPipe Request flatbuffer") from None


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{what}: not valid UTF-8") from None


def _read_tensor(reader: _Reader, pos: int, i: int) -> np.ndarray:
    where = f"input_tensors[{i}]"
    tensor = reader.table(pos)
    gp_type = reader.u8(tensor, 4)
    start, dims = reader.vector(tensor, 6, 8, f"{where}.shape")
    shape = list(struct.unpack_from(f"<{dims}q", reader.buf, start)) if dims else []
    start = count = 0
    if gp_type == Type.String:
        start, count = reader.vector(tensor, 10, 4, f"{where}.string_val")
    elif gp_type in GP_DTYPES:
        start, count = reader.vector(tensor, 8, 1, f"{where}.data")
    return _tensor(reader, gp_type, shape, start, count, i, tensor)


def _tensor(
    reader: _Reader, gp_type: int, shape: Sequence[int], start: int, count: int, i: int, table: tuple[int, int, int] | None = None
) -> np.ndarray:
    """A tensor's array from its type, shape and where its values are (``count`` strings, or bytes of data)."""
    where = f"input_tensors[{i}]"
    if gp_type == Type.String:
        values: list[Any] | None = _ffgp.read_strings(reader.buf, start, count)  # str, or all bytes if not text
        if values is None:  # an offset or a length outside the body: the walk in Python says which
            assert table is not None  # the C walk checked every string of the tensors it gives
            values = reader.strings(table, 10, f"{where}.string_val")
        flat = np.empty(len(values), dtype=object)
        flat[:] = values
    elif gp_type in GP_DTYPES:
        dtype = GP_DTYPES[gp_type]
        nbytes = count
        if nbytes % dtype.itemsize:
            raise InvalidInput(f"{where}: {nbytes} data bytes are not a whole number of {GP_TYPE_NAMES[gp_type]} values")
        flat = np.frombuffer(reader.buf, dtype=dtype, count=nbytes // dtype.itemsize, offset=start).astype(_NATIVE[gp_type])
    else:
        raise InvalidInput(f"{where}: unsupported tensor type {GP_TYPE_NAMES.get(gp_type, gp_type)}")
    return flat.reshape(_resolve_shape(list(shape), flat.size, where))


def _resolve_shape(shape: list[int], count: int, where: str) -> tuple[int, ...]:
    if len(shape) == 2 and shape[0] >= 0 and shape[1] >= 0 and shape[0] * shape[1] == count:
        return (shape[0], shape[1])  # the usual [n, k], nothing to resolve: no generator per dimension
    if not shape:
        raise InvalidInput(f"{where}.shape: required, with the record count first (e.g. [n, k])")
    if any(d < -1 for d in shape) or shape.count(-1) > 1:
        raise InvalidInput(f"{where}.shape {shape}: dimensions must be >= 0, with at most one -1")
    known = math.prod(d for d in shape if d != -1)  # exact for any size (numpy's would overflow)
    if -1 in shape:
        if known == 0 or count % known:
            raise InvalidInput(f"{where}.shape {shape}: cannot hold {count} values")
        shape = [count // known if d == -1 else d for d in shape]
    elif known != count:
        raise InvalidInput(f"{where}.shape {shape} needs {known} values, the tensor has {count}")
    return tuple(shape)


def parse_config(config: str) -> dict[str, str]:
    """ForestFlow's ``k1:v1,k2:v2`` config string as a dict; junk entries (no ``:``, no key) are skipped."""
    configs: dict[str, str] = {}
    for item in config.split(","):
        key, sep, value = item.partition(":")
        if sep and key.strip():
            configs[key.strip()] = value.strip()
    return configs


# ---- tensors -> Frame ---------------------------------------------------------------------------
def plain_request(body: bytes) -> PlainRequest | None:
    """The usual InferRequest body (no input names, one String and/or one numeric ``[n, k]`` tensor,
    texts in UTF-8, every bound inside the body), walked in C; None for any other body, which
    :func:`parse_request` reads (it reads every body taken here without an error)."""
    return _ffgp.plain_request(body) if isinstance(body, bytes) else None


def plain_frame(body: bytes, request: PlainRequest, inputs: Sequence[TensorSpec]) -> Frame:
    """The input Frame of a plain request: what ``frame_from_request(parse_request(body), inputs)``
    gives, read straight into its columns in C when the grouping lays it out as the model takes it
    (every input a scalar column, the numeric ones FP64, each tensor one column per input of its
    group); else by that general path, which also says what is wrong."""
    layout = _plan(inputs).plain_layout
    if layout:
        columns = _ffgp.grouped_columns(body, request[2], request[3], layout)
        if columns is not None:
            return Frame(columns)
    parsed = parse_request(body)
    assert isinstance(parsed, GPInferRequest)
    return frame_from_request(parsed, inputs)


def frame_from_request(request: GPInferRequest, inputs: Sequence[TensorSpec]) -> Frame:
    """The input Frame of an InferRequest for a model with these inputs."""
    if not request.tensors:
        raise InvalidInput("input_tensors: at least one tensor is required")
    rows = {t.shape[0] for t in request.tensors}
    if len(rows) > 1:
        raise InvalidInput(f"input_tensors disagree on the record count (shape[0]): {sorted(rows)}")
    if rows == {0}:
        raise InvalidInput("input_tensors: at least one record is required (shape[0] is 0)")
    plan = _plan(inputs)
    if not request.input_names and plan.all_scalar:  # every column is an input: in metadata order
        columns = _grouped(request.tensors, inputs, plan.groups)
        return Frame({spec.name: columns[spec.name] for spec in inputs if spec.name in columns})
    if request.input_names:
        columns = _named(request, inputs)
    else:
        columns = _positional(request.tensors, inputs)
    order = plan.order
    ordered = dict(sorted(columns.items(), key=lambda kv: order.get(kv[0], len(order))))
    return Frame(ordered)


@dataclass(frozen=True, slots=True)
class _InputPlan:
    """What frame_from_request needs of a model's inputs, worked out once per release's inputs."""

    all_scalar: bool
    #: Position of each input in metadata order.
    order: dict[str, int]
    #: The "categorical" (BYTES) and "numeric" inputs, in metadata order, for unnamed tensors.
    groups: dict[str, list[TensorSpec]]
    #: ``(name, is_text)`` of each input, in metadata order, when _ffgp.grouped_columns can lay out
    #: grouped tensors for them (every input a scalar column, the numeric ones FP64); else empty.
    plain_layout: tuple[tuple[str, bool], ...] = ()


#: Plans of the inputs seen: (the inputs themselves, to check it is them; their plan).
_PLANS: dict[int, tuple[Sequence[TensorSpec], _InputPlan]] = {}


def _plan(inputs: Sequence[TensorSpec]) -> _InputPlan:
    cached = _PLANS.get(id(inputs))
    if cached is not None and cached[0] is inputs:
        return cached[1]
    all_scalar = all(is_scalar(spec) for spec in inputs)
    plain = all_scalar and all(spec.datatype in ("BYTES", "FP64") for spec in inputs)
    plan = _InputPlan(
        all_scalar,
        {spec.name: i for i, spec in enumerate(inputs)},
        {
            "categorical": [s for s in inputs if s.datatype == "BYTES"],
            "numeric": [s for s in inputs if s.datatype != "BYTES"],
        },
        tuple((spec.name, spec.datatype == "BYTES") for spec in inputs) if plain else (),
    )
    if isinstance(inputs, tuple):  # a list could change after this: not kept
        if len(_PLANS) >= 256:
            _PLANS.clear()
        _PLANS[id(inputs)] = (inputs, plan)
    return plan


def _named(request: GPInferRequest, inputs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    names, tensors = request.input_names, request.tensors
    if len(names) != len(tensors):
        raise InvalidInput(f"input_names has {len(names)} name(s) for {len(tensors)} input tensor(s)")
    if len(set(names)) != len(names):
        raise InvalidInput(f"input_names: duplicate names in {names}")
    specs = {spec.name: spec for spec in inputs}
    columns: dict[str, np.ndarray] = {}
    for name, tensor in zip(names, tensors):
        spec = specs.get(name)
        if specs and spec is None:
            raise InvalidInput(f"input_names: unknown input {name!r}; the model takes {', '.join(specs)}")
        if spec is not None and not is_scalar(spec):
            tensor = _fit(tensor, spec, f"input_tensors[{len(columns)}]")
        elif tensor.ndim > 1 and int(np.prod(tensor.shape[1:])) == 1:
            tensor = tensor.reshape(tensor.shape[0])
        columns[name] = tensor
    return columns


def is_scalar(spec: TensorSpec) -> bool:
    """Whether an input takes one value per record (a tabular column) rather than a vector."""
    return len(spec.shape) <= 1


def _positional(tensors: list[np.ndarray], inputs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """Unnamed tensors for a model with vector inputs: one per input, in metadata order."""
    if len(tensors) != len(inputs):
        raise InvalidInput(
            f"input_tensors: got {len(tensors)} tensor(s) without input_names for {len(inputs)} input(s) "
            f"({', '.join(s.name for s in inputs)}); send one tensor per input in this order, or name them"
        )
    return {spec.name: _fit(tensor, spec, f"input_tensors[{i}]") for i, (tensor, spec) in enumerate(zip(tensors, inputs))}


def _fit(tensor: np.ndarray, spec: TensorSpec, where: str) -> np.ndarray:
    """A tensor checked against the input it feeds: its kind, its shape past the record axis, its type."""
    if (tensor.dtype == object) != (spec.datatype == "BYTES"):
        kind = "String" if tensor.dtype == object else "numeric"
        raise InvalidInput(f"{where}: a {kind} tensor for input {spec.name!r}, which takes {spec.datatype}")
    if is_scalar(spec):
        if tensor.ndim > 1 and int(np.prod(tensor.shape[1:])) != 1:
            raise InvalidInput(
                f"{where}: shape {list(tensor.shape)} has more than one value per record; "
                f"input {spec.name!r} takes one (shape [n] or [n, 1])"
            )
        return _cast(tensor.reshape(tensor.shape[0]), spec)
    dims = spec.shape[1:]
    if tensor.ndim != len(spec.shape) or any(d != -1 and d != t for t, d in zip(tensor.shape[1:], dims)):
        wanted = ", ".join("n" if d == -1 else str(d) for d in dims)
        raise InvalidInput(
            f"{where}: shape {list(tensor.shape)} does not fit input {spec.name!r} "
            f"(declared {list(spec.shape)}: send [n, {wanted}])"
        )
    return _cast(tensor, spec)


def _grouped(
    tensors: list[np.ndarray], inputs: Sequence[TensorSpec], groups: dict[str, list[TensorSpec]]
) -> dict[str, np.ndarray]:
    if not inputs:
        raise InvalidInput("the model declares no inputs: name the tensors with input_names")
    wanted = [g for g, specs in groups.items() if specs]
    if len(tensors) != len(wanted):
        expected = " and ".join(f"one {'String' if g == 'categorical' else 'numeric'} tensor for {g} inputs" for g in wanted)
        raise InvalidInput(f"input_tensors: got {len(tensors)} tensor(s) without input_names, expected {expected}")
    columns: dict[str, np.ndarray] = {}
    used: set[str] = set()
    for tensor in tensors:
        group = "categorical" if tensor.dtype == object else "numeric"
        specs = groups[group]
        if not specs or group in used:
            raise InvalidInput(f"input_tensors: expected {' and '.join(wanted)} tensors, got an extra {group} one")
        used.add(group)
        per_row = tensor.reshape(tensor.shape[0], -1)
        if per_row.shape[1] > len(specs):
            raise InvalidInput(
                f"input_tensors: the {group} tensor has {per_row.shape[1]} values per record for "
                f"{len(specs)} {group} input(s) ({', '.join(s.name for s in specs)})"
            )
        taken = specs[: per_row.shape[1]]
        target = _common_cast(per_row.dtype, taken)
        if target is not None:  # every column to one dtype: the tensor's columns copied out in one step
            block = np.array(per_row[:, : len(taken)].T, dtype=target, order="C")
            for spec, column in zip(taken, block):
                columns[spec.name] = column
        else:
            for j, spec in enumerate(taken):
                columns[spec.name] = _cast(per_row[:, j].copy(), spec)
    return columns


#: (a tensor's dtype, an input's datatype) -> the dtype :func:`_cast` gives its column.
_CAST_DTYPES: dict[tuple[np.dtype[Any], str], np.dtype[Any]] = {}


def _common_cast(dtype: np.dtype[Any], specs: Sequence[TensorSpec]) -> np.dtype[Any] | None:
    """The dtype :func:`_cast` gives every column of a ``dtype`` tensor for these inputs, if it is
    the same for all of them (else None)."""
    common = None
    for spec in specs:
        key = (dtype, spec.datatype)
        cast = _CAST_DTYPES.get(key)
        if cast is None:
            numeric = spec.datatype in NUMERIC_DATATYPES and dtype.kind != "O"
            cast = DATATYPES[spec.datatype] if numeric and np.can_cast(dtype, DATATYPES[spec.datatype], "same_kind") else dtype
            if len(_CAST_DTYPES) >= 1024:  # dtypes and datatypes are few; bounded all the same
                _CAST_DTYPES.clear()
            _CAST_DTYPES[key] = cast
        if common is None:
            common = cast
        elif cast != common:
            return None
    return common


def _cast(column: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """Numbers to the input's numeric datatype when no value can change meaning (uint8 -> FP64, not FP64 -> INT32)."""
    if spec.datatype in NUMERIC_DATATYPES and column.dtype != object:
        target = DATATYPES[spec.datatype]
        if np.can_cast(column.dtype, target, "same_kind"):
            return column.astype(target, copy=False)  # columns here are the request's own arrays: no copy needed
    return column


# ---- writing ------------------------------------------------------------------------------------
def _finish(builder: flatbuffers.Builder, root: int) -> bytes:
    builder.Finish(root)
    return bytes(builder.Output())


def _offsets(builder: flatbuffers.Builder, offsets: list[int]) -> int:
    builder.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    end: int = builder.EndVector()
    return end


def _shape(builder: flatbuffers.Builder, shape: Sequence[int]) -> int:
    vector: int = builder.CreateNumpyVector(np.asarray(shape, dtype="<i8"))
    return vector


#: (GraphPipe type, shape, payload, is_text) of an output tensor. The payload is the data bytes
#: (little-endian) of a numeric tensor, or a String tensor's whole string vector as
#: ``_ffgp.write_strings`` lays it out (values as bytes, None as empty, else str() in UTF-8).
_WireTensor = tuple[int, tuple[int, ...], bytes, bool]


def _wire_tensor(name: str, array: np.ndarray) -> _WireTensor:
    """An output column as it goes on the wire."""
    shape = (array.shape[0], 1) if array.ndim == 1 else tuple(array.shape)
    if array.dtype.kind in ("O", "U", "S", "T"):
        return Type.String, shape, _ffgp.write_strings(array.ravel().tolist()), True
    gp_type = _GP_TYPE_OF_DTYPE.get(array.dtype)  # the usual native-order numbers: no dtype made
    if gp_type is None:
        native = np.dtype(np.uint8) if array.dtype.kind == "b" else array.dtype.newbyteorder("=")
        gp_type = _GP_TYPE_OF_DTYPE.get(native)
    if gp_type is None:
        raise InvalidInput(f"output {name!r}: datatype {array.dtype} has no GraphPipe type")
    return gp_type, shape, np.ascontiguousarray(array, dtype=GP_DTYPES[gp_type]).tobytes(), False


#: The FQRV tensor of the releases that answered (the same bytes in every answer of a release).
_FQRV_TENSORS: dict[FQRV, _WireTensor] = {}


def encode_infer_response(fqrv: FQRV, frame: Frame, output_names: Sequence[str] = ()) -> bytes:
    """An InferResponse: without ``output_names``, the FQRV ``[1, 1]`` String tensor then every
    output (ForestFlow's layout); with them, exactly those tensors in that order, where ``fqrv``
    names the FQRV tensor (so ``execute(..., output_name=x)`` gets one array back). Written front
    to back by ``_ffgp.infer_response``: every uoffset points forward, shapes and data start
    8-aligned so readers may view them in place."""
    fqrv_tensor = _FQRV_TENSORS.get(fqrv)
    if fqrv_tensor is None:
        fqrv_tensor = (Type.String, (1, 1), _ffgp.write_strings([str(fqrv)]), True)
        if len(_FQRV_TENSORS) >= 1024:
            _FQRV_TENSORS.clear()
        _FQRV_TENSORS[fqrv] = fqrv_tensor
    chosen: list[tuple[str, np.ndarray] | None]  # None: the FQRV tensor
    if not output_names:
        chosen = [None, *frame.columns.items()]
    else:
        if len(set(output_names)) != len(output_names):
            raise InvalidInput(f"output_names: duplicate names in {list(output_names)}")
        selected = frame.select([n for n in output_names if n != FQRV_OUTPUT]).columns  # unknown names: InvalidInput
        chosen = [None if n == FQRV_OUTPUT else (n, selected[n]) for n in output_names]
    body = _ffgp.infer_response([fqrv_tensor if c is None else c[1] for c in chosen])  # the usual columns, in C
    if body is None:  # a column of another kind (str arrays, another byte order...): as _wire_tensor makes it
        body = _ffgp.infer_response([fqrv_tensor if c is None else _wire_tensor(*c) for c in chosen])
    assert body is not None  # every tensor a tuple
    return body


def encode_errors(errors: Sequence[tuple[int, str]]) -> bytes:
    """An InferResponse carrying only ``errors`` (code, message)."""
    builder = flatbuffers.Builder(256)
    entries = []
    for code, message in errors:
        text = builder.CreateString(message)
        Error.Start(builder)
        Error.AddCode(builder, code)
        Error.AddMessage(builder, text)
        entries.append(Error.End(builder))
    vector = _offsets(builder, entries)
    InferResponse.Start(builder)
    InferResponse.AddErrors(builder, vector)
    return _finish(builder, InferResponse.End(builder))


def io_description(spec: TensorSpec) -> str:
    """A spec's description, with a categorical input's levels appended."""
    if spec.domain is None:
        return spec.description
    levels = "levels: [" + ",".join(spec.domain) + "]"
    return f"{spec.description} {levels}" if spec.description else levels


def wire_shape(spec: TensorSpec) -> list[int]:
    """The tensor shape clients exchange for a column: one value per record is ``[-1, 1]``."""
    return [-1, 1] if len(spec.shape) <= 1 else list(spec.shape)


def response_specs(meta: ServableMetadata) -> list[TensorSpec]:
    """The response tensors in order: the FQRV first, then the model's outputs."""
    fqrv = TensorSpec(FQRV_OUTPUT, "BYTES", (1, 1), "the release that answered (first unless output_names leave it out)")
    return [fqrv, *meta.outputs]


def _io(builder: flatbuffers.Builder, spec: TensorSpec) -> int:
    name = builder.CreateString(spec.name)
    description = builder.CreateString(io_description(spec))
    shape = _shape(builder, wire_shape(spec))
    IOMetadata.Start(builder)
    IOMetadata.AddName(builder, name)
    IOMetadata.AddDescription(builder, description)
    IOMetadata.AddShape(builder, shape)
    IOMetadata.AddType(builder, GP_TYPE_OF_DATATYPE.get(spec.datatype, Type.Null))
    table: int = IOMetadata.End(builder)
    return table


def encode_metadata(fqrv: FQRV, meta: ServableMetadata, server: str = "forestflow") -> bytes:
    """A MetadataResponse: the model's name, the FQRV as version, inputs and outputs."""
    builder = flatbuffers.Builder(1024)
    name = builder.CreateString(meta.name)
    version = builder.CreateString(str(fqrv))
    server_offset = builder.CreateString(server)
    description = builder.CreateString(meta.description or f"{meta.platform} servable {fqrv}")
    inputs = _offsets(builder, [_io(builder, spec) for spec in meta.inputs])
    outputs = _offsets(builder, [_io(builder, spec) for spec in response_specs(meta)])
    MetadataResponse.Start(builder)
    MetadataResponse.AddName(builder, name)
    MetadataResponse.AddVersion(builder, version)
    MetadataResponse.AddServer(builder, server_offset)
    MetadataResponse.AddDescription(builder, description)
    MetadataResponse.AddInputs(builder, inputs)
    MetadataResponse.AddOutputs(builder, outputs)
    return _finish(builder, MetadataResponse.End(builder))
