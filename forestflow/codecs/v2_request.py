"""A V2 inference request's parts as both front-ends and the prediction log read them.

The REST JSON ``inputs`` (with binary tensor data), the gRPC message's tensors and parameters, and the
request parameters that become prediction-log configs: used by api/v2_rest.py and api/v2_grpc.py when
they decode a request, and by predlog/convert.py when ``logs tail`` converts a logged wire request.
"""

from __future__ import annotations

from typing import Any

import orjson

from forestflow.codecs import _ffjson
from forestflow.codecs.v2_tensor import Tensor, array_from_contents, array_from_json, array_from_raw, raw_bytes
from forestflow.errors import InvalidInput

#: Parameters of the binary extension: they steer the encoding and are not model parameters.
TRANSPORT_PARAMETERS = frozenset({"binary_data_output", "binary_data", "binary_data_size"})


def loads(head: bytes | memoryview) -> Any:
    """The JSON part of a V2 inference request, as orjson.loads reads it, but each flat input ``data``
    array already the numpy array it becomes (read in C, see ``_ffjson.v2_request``); a 400 when it is
    not JSON."""
    doc = _ffjson.v2_request(head)
    if doc is not None:
        return doc
    try:
        return orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"body: not valid JSON ({exc.msg} at position {exc.pos})") from None


def configs_from(parameters: dict[str, Any]) -> dict[str, str]:
    """Request parameters as prediction-log configs (string values, transport parameters left out)."""
    out = {}
    for key, value in parameters.items():
        if key in TRANSPORT_PARAMETERS:
            continue
        out[str(key)] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def object_of(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def tensor_name(item: Any, where: str) -> str:
    if not isinstance(item, dict):
        raise InvalidInput(f"{where}: expected a JSON object")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"{where}.name: required, a string")
    return name


def parse_inputs(doc: dict[str, Any], binary: memoryview, max_rows: int | None = None) -> list[Tensor]:
    """Decode ``inputs`` (JSON ``data`` or binary blobs, consumed in input order).

    With ``max_rows``, a tensor whose shape says more rows (its first dimension) is refused before
    any column is built."""
    items = doc.get("inputs")
    if not isinstance(items, list) or not items:
        raise InvalidInput("inputs: required, a non-empty list of input tensors")
    if max_rows is not None:
        for item in items:
            shape = item.get("shape") if isinstance(item, dict) else None
            if isinstance(shape, list) and shape and type(shape[0]) is int and shape[0] > max_rows:
                raise InvalidInput(f"batch of {shape[0]} records is over the limit of {max_rows}")
    tensors, offset = [], 0
    for i, item in enumerate(items):
        name = item.get("name") if type(item) is dict else None
        if type(name) is str and name and "data" in item and "parameters" not in item:
            # The usual tensor ({name, datatype, shape, data}): what the lines below do for it, in fewer steps.
            datatype = item.get("datatype")
            tensors.append(Tensor(name, datatype, array_from_json(name, datatype, item.get("shape"), item["data"]), {}))
            continue
        name = tensor_name(item, f"inputs[{i}]")
        params = object_of(item.get("parameters"), f"input {name!r}: parameters")
        datatype, shape = item.get("datatype"), item.get("shape")
        size = params.get("binary_data_size")
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise InvalidInput(f"input {name!r}: binary_data_size must be a non-negative integer")
            if offset + size > len(binary):
                raise InvalidInput(f"input {name!r}: binary_data_size {size} runs past the {len(binary)} bytes of binary data")
            array = array_from_raw(name, datatype, shape, binary[offset : offset + size])
            offset += size
        elif "data" in item:
            array = array_from_json(name, datatype, shape, item["data"])
        else:
            raise InvalidInput(f"input {name!r}: needs data (or parameters.binary_data_size with binary data)")
        tensors.append(Tensor(name, datatype, array, params))
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data after the last binary input")
    return tensors


def parameters_of(field: Any) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` as plain Python values."""
    out = {}
    for key, param in field.items():
        which = param.WhichOneof("parameter_choice")
        if which is not None:
            out[key] = getattr(param, which)
    return out


def tensors_of(message: Any, what: str = "input") -> list[Tensor]:
    """The tensors of a ModelInferRequest (``what="input"``) or of a ModelInferResponse
    (``what="output"``), typed (``contents``) or raw."""
    items, raw = (
        (message.inputs, message.raw_input_contents) if what == "input" else (message.outputs, message.raw_output_contents)
    )
    if raw and len(raw) != len(items):
        raise InvalidInput(f"raw_{what}_contents has {len(raw)} entries for {len(items)} {what}s")
    tensors = []
    for i, t in enumerate(items):
        shape = list(t.shape)
        if raw:
            array = array_from_raw(t.name, t.datatype, shape, raw[i], what)
        else:
            array = array_from_contents(t.name, t.datatype, shape, t.contents, what)
        tensors.append(Tensor(t.name, t.datatype, array, parameters_of(t.parameters)))
    return tensors


def add_raw_tensors(items: Any, raw: Any, tensors: Any) -> None:
    """Append ``tensors`` to a request's ``inputs`` or a response's ``outputs`` (``items``), their
    contents in the binary layout to the matching ``raw_*_contents`` (``raw``)."""
    for tensor in tensors:
        items.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        raw.append(raw_bytes(tensor.array, tensor.datatype))


def set_parameter(param: Any, value: Any) -> None:
    """One ``InferParameter`` from a Python value (anything but bool/int/float as its text)."""
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    else:
        param.string_param = value if isinstance(value, str) else str(value)
