"""V2 tensor elements <-> numpy: JSON ``data``, the binary/raw byte layout and gRPC typed contents.

Every decoder checks the declared datatype and shape against the data it got and raises
:class:`InvalidInput` naming the tensor, so a bad tensor is a 400 / INVALID_ARGUMENT, never a 500.
Binary layout (REST binary extension and gRPC ``raw_*_contents``): little-endian, row-major, no
padding; BOOL is one byte; each BYTES element is a 4-byte little-endian length then its bytes.
BYTES elements that are valid UTF-8 are decoded to ``str`` (tabular models want text); a tensor
holding any element that is not stays ``bytes``. A BYTES tensor whose ``parameters.content_type`` is
``base64`` (MLServer's convention; encoded images) goes into JSON bodies as base64 text.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forestflow.core.declared import NotRepresentable, numbers_as
from forestflow.core.frame import DATATYPES
from forestflow.errors import InvalidInput

_LENGTH = struct.Struct("<I")
_FLOAT = frozenset({"FP16", "FP32", "FP64"})
#: Most dimensions of a tensor, and most bytes its dimensions may describe (numpy's limits).
_MAX_DIMS = 32
_MAX_BYTES = np.iinfo(np.intp).max
#: The tensor ``parameters.content_type`` of BYTES sent as base64 text in JSON.
BASE64 = "base64"

#: V2 datatype -> the InferTensorContents field that carries it (FP16 travels raw only).
CONTENTS_FIELD: dict[str, str | None] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP16": None,
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


@dataclass(slots=True)
class Tensor:
    """One named V2 tensor: its datatype, its (shaped) data and its parameters."""

    name: str
    datatype: str
    array: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> list[int]:
        """The shape as a JSON-friendly list."""
        return list(self.array.shape)


def check_header(name: str, datatype: Any, shape: Any, what: str = "input") -> tuple[np.dtype[Any], tuple[int, ...]]:
    """Validate a tensor's datatype and shape; returns the numpy dtype and the shape."""
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise InvalidInput(f"{what} {name!r}: unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}")
    if not isinstance(shape, (list, tuple)) or not all(type(d) is int and d >= 0 for d in shape):
        raise InvalidInput(f"{what} {name!r}: shape must be a list of non-negative integers, got {shape!r}")
    dtype = DATATYPES[datatype]
    # numpy refuses an array whose dimensions (zeros aside) multiply past its index range, even an
    # empty one ([1, 2^62, 2^62, 0]), and more than _MAX_DIMS of them.
    if len(shape) > _MAX_DIMS or math.prod(d for d in shape if d) * dtype.itemsize > _MAX_BYTES:
        raise InvalidInput(f"{what} {name!r}: shape {_short_shape(shape)} is larger than any tensor can be")
    return dtype, tuple(shape)


def _short_shape(shape: Sequence[int]) -> str:
    text = str(list(shape))
    return text if len(text) <= 80 else text[:77] + "..."


def element_count(shape: Sequence[int]) -> int:
    """How many elements a shape holds."""
    return math.prod(shape)


def _flatten(data: list[Any]) -> list[Any]:
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _check_count(name: str, shape: tuple[int, ...], got: int, what: str) -> None:
    need = element_count(shape)
    if got != need:
        raise InvalidInput(f"{what} {name!r}: shape {list(shape)} needs {need} elements, got {got}")


def _texts(values: list[bytes]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    try:
        arr[:] = [v.decode("utf-8") for v in values]
    except UnicodeDecodeError:
        arr[:] = values
    return arr


#: The numpy dtype ``_ffjson`` reads a flat ``data`` array into, by the datatype it then needs no conversion for.
_PLAIN_DTYPES: dict[str, np.dtype[Any]] = {"FP64": DATATYPES["FP64"], "BYTES": np.dtype(object)}


def array_from_json(name: str, datatype: Any, shape: Any, data: Any, what: str = "input") -> np.ndarray:
    """Decode JSON ``data`` (flat or nested, row-major) into an array of the declared shape."""
    if (
        type(data) is np.ndarray
        and type(shape) is list
        and len(shape) == 1
        and type(shape[0]) is int
        and shape[0] == data.size
        and data.ndim == 1
        and type(datatype) is str
        and data.dtype is _PLAIN_DTYPES.get(datatype)
    ):
        # The usual column: an FP64 or BYTES [n] that _ffjson read into the array it must be. Every
        # check below passes for it and nothing is converted; a pd request pays this once per feature.
        return data
    dtype, dims = check_header(name, datatype, shape, what)
    if isinstance(data, np.ndarray):  # read by _ffjson: what np.array(data) makes of a flat array
        return _array_from_flat(name, datatype, dtype, dims, data, what)
    if not isinstance(data, list):
        raise InvalidInput(f"{what} {name!r}: data must be a JSON array, got {type(data).__name__}")
    if datatype == "BYTES":
        flat = data if all(type(v) is str for v in data) else _flatten(data)
        bad = [v for v in flat if not isinstance(v, str)] if flat is not data else None
        if bad:
            raise InvalidInput(f"{what} {name!r}: BYTES data must be strings, got {bad[0]!r}")
        _check_count(name, dims, len(flat), what)
        arr = np.empty(len(flat), dtype=object)
        arr[:] = flat
        return arr.reshape(dims)
    try:
        raw = np.array(data)
    except (ValueError, TypeError):
        raise InvalidInput(f"{what} {name!r}: data is ragged (nested arrays of different lengths)") from None
    return _array_from_flat(name, datatype, dtype, dims, raw, what)


def _array_from_flat(
    name: str, datatype: str, dtype: np.dtype[Any], dims: tuple[int, ...], raw: np.ndarray, what: str
) -> np.ndarray:
    """``np.array(data)`` of JSON ``data`` checked against the datatype and shape, and converted to them."""
    _check_count(name, dims, raw.size, what)
    if datatype == "BYTES":  # only _ffjson hands strings over as an array (an object array of str)
        return raw.reshape(dims)
    raw = raw.reshape(-1)
    kind = raw.dtype.kind
    if raw.size == 0:
        return np.empty(dims, dtype=dtype)
    if datatype == "BOOL":
        if kind != "b":
            raise InvalidInput(f"{what} {name!r}: BOOL data must be true/false")
        return raw.reshape(dims)
    if kind == "O" and datatype in _FLOAT:  # JSON null (NaN from MLServer's codecs) among numbers
        if any(v is not None and isinstance(v, (bool, str, list, dict)) for v in raw):
            raise InvalidInput(f"{what} {name!r}: {datatype} data must be numbers (or null)")
        raw = np.array([np.nan if v is None else float(v) for v in raw], dtype=np.float64)
        kind = "f"
    if kind not in "biuf":
        raise InvalidInput(f"{what} {name!r}: {datatype} data must be numbers in range, got {raw[0]!r}")
    try:
        return numbers_as(raw, datatype).reshape(dims)
    except NotRepresentable as exc:
        raise InvalidInput(f"{what} {name!r}: {exc}") from None


def array_from_raw(name: str, datatype: Any, shape: Any, buf: bytes | memoryview, what: str = "input") -> np.ndarray:
    """Decode a tensor sent in the binary layout."""
    dtype, dims = check_header(name, datatype, shape, what)
    if datatype == "BYTES":
        return _texts(split_bytes(name, buf, element_count(dims), what)).reshape(dims)
    need = element_count(dims) * dtype.itemsize
    if len(buf) != need:
        raise InvalidInput(f"{what} {name!r}: shape {list(dims)} of {datatype} needs {need} bytes, got {len(buf)}")
    if datatype == "BOOL":
        flags: np.ndarray = (np.frombuffer(buf, dtype=np.uint8) != 0).reshape(dims)
        return flags
    array: np.ndarray = np.frombuffer(buf, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(dims)
    return array


def split_bytes(name: str, buf: bytes | memoryview, count: int, what: str = "input") -> list[bytes]:
    """The elements of a length-prefixed BYTES buffer; the element count must be ``count``."""
    data = bytes(buf)
    out: list[bytes] = []
    append, unpack = out.append, _LENGTH.unpack_from
    pos, end = 0, len(data)
    while pos < end:
        if pos + 4 > end:
            raise InvalidInput(f"{what} {name!r}: BYTES data ends inside a 4-byte length prefix")
        (length,) = unpack(data, pos)
        pos += 4
        stop = pos + length
        if stop > end:
            raise InvalidInput(f"{what} {name!r}: BYTES element {len(out)} of {length} bytes runs past the data")
        append(data[pos:stop])
        pos = stop
    if len(out) != count:
        raise InvalidInput(f"{what} {name!r}: shape needs {count} BYTES elements, got {len(out)}")
    return out


def array_from_contents(name: str, datatype: Any, shape: Any, contents: Any, what: str = "input") -> np.ndarray:
    """Decode gRPC typed ``InferTensorContents`` (the field that matches the datatype)."""
    dtype, dims = check_header(name, datatype, shape, what)
    field_name = CONTENTS_FIELD[datatype]
    if field_name is None:
        raise InvalidInput(f"{what} {name!r}: {datatype} has no typed contents field; send it in raw_input_contents")
    values = getattr(contents, field_name)
    _check_count(name, dims, len(values), what)
    if datatype == "BYTES":
        return _texts(list(values)).reshape(dims)
    if datatype in ("INT8", "INT16", "UINT8", "UINT16") and len(values):
        wide = np.fromiter(values, dtype=np.int64, count=len(values))
        info = np.iinfo(dtype)
        if wide.min() < info.min or wide.max() > info.max:
            raise InvalidInput(f"{what} {name!r}: value out of range for {datatype}")
        return wide.astype(dtype).reshape(dims)
    return np.fromiter(values, dtype=dtype, count=len(values)).reshape(dims)


# ---- encoding ------------------------------------------------------------------------------------
def _as_bytes(v: Any) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    return str(v).encode("utf-8")


def json_safe(array: np.ndarray) -> bool:
    """Whether a BYTES array can go out as JSON text (no element is non-UTF-8 bytes)."""
    flat = array.reshape(-1).tolist()  # a list: iterating a numpy object array costs a boxed step per value
    if not any(issubclass(t, bytes) for t in set(map(type, flat))):  # the usual text column: nothing to try
        return True
    for v in flat:
        if isinstance(v, bytes):
            try:
                v.decode("utf-8")
            except UnicodeDecodeError:
                return False
    return True


def json_data(array: np.ndarray, datatype: str) -> Any:
    """Flat row-major data for a JSON body (numpy arrays are serialized by orjson; NaN -> null)."""
    flat = array.reshape(-1)
    if datatype == "BYTES":
        values = flat.tolist()
        if set(map(type, values)) <= {str}:  # the usual text column: as it is
            return values
        return [v.decode("utf-8") if isinstance(v, bytes) else v if isinstance(v, str) else str(v) for v in values]
    if flat.dtype.kind in "US":
        return flat.tolist()
    return np.ascontiguousarray(flat, dtype=DATATYPES[datatype])


def raw_bytes(array: np.ndarray, datatype: str) -> bytes:
    """The binary layout of a tensor."""
    if datatype == "BYTES":
        pack = _LENGTH.pack
        items = [v.encode("utf-8") if type(v) is str else _as_bytes(v) for v in array.reshape(-1)]
        return b"".join([part for b in items for part in (pack(len(b)), b)])
    if datatype == "BOOL":
        return np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    return np.ascontiguousarray(array, dtype=DATATYPES[datatype].newbyteorder("<")).tobytes()


def json_entry(tensor: Tensor, binary: bool, blobs: list[bytes]) -> dict[str, Any]:
    """A tensor's entry in a V2 JSON body (``inputs`` or ``outputs``): its data inline (base64 text
    for a ``content_type = "base64"`` tensor), or, when ``binary`` is asked (or its strings cannot
    be JSON), its binary layout appended to ``blobs`` with the entry saying its size."""
    entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
    as_base64 = tensor.datatype == "BYTES" and tensor.parameters.get("content_type") == BASE64
    if binary or (tensor.datatype == "BYTES" and not as_base64 and not json_safe(tensor.array)):
        blob = raw_bytes(tensor.array, tensor.datatype)
        entry["parameters"] = {"binary_data_size": len(blob)}
        blobs.append(blob)
    elif as_base64:
        entry["parameters"] = {"content_type": BASE64}
        entry["data"] = [base64.b64encode(_as_bytes(v)).decode("ascii") for v in tensor.array.reshape(-1).tolist()]
    else:
        entry["data"] = json_data(tensor.array, tensor.datatype)
    return entry
