"""A Frame <-> the V2 tensors sent to and received from a remote backend.

Requests go out one tensor per column (the "pd" layout every V2 server reads), cast to the
datatypes the backend's metadata gives its inputs. Columns that match no input of a backend
whose one input is a ``[-1, F]`` vector (MLServer's numpy models, iris ``[N, 4]``) are stacked
into that input in column order: a ForestFlow ``/score`` schema of F scalar fields scores such a
model as it is. Answers come back one column per output tensor, rows on the first axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from forestflow.codecs.v2_tensor import Tensor
from forestflow.core.frame import DATATYPES, NUMERIC_DATATYPES, Frame, TensorSpec, datatype_of

#: Request parameters kept to this gateway: the layout a client named was applied when its request
#: was decoded here; what goes to the backend is always one tensor per column.
_LOCAL_PARAMETERS = frozenset({"content_type"})
_NUMBERS = NUMERIC_DATATYPES | {"BOOL"}


def request_tensors(frame: Frame, inputs: Sequence[TensorSpec]) -> list[Tensor]:
    """The tensors of a request to a backend whose model takes ``inputs`` (empty: unknown)."""
    by_name = {spec.name: spec for spec in inputs}
    columns = frame.columns
    stacked = _stacked(columns, inputs)
    if stacked is not None:
        return [stacked]
    named = {name: col for name, col in columns.items() if name in by_name}
    # Columns the model does not take stay here (a backend may refuse unknown inputs); a request
    # that names none of its inputs goes as it is, and the backend says what is wrong with it.
    chosen = named if named else columns
    return [_tensor(name, column, by_name.get(name)) for name, column in chosen.items()]


def _stacked(columns: dict[str, np.ndarray], inputs: Sequence[TensorSpec]) -> Tensor | None:
    """Scalar columns stacked into the one ``[-1, F]`` input they fill, or None."""
    if len(inputs) != 1 or len(inputs[0].shape) != 2:
        return None
    spec = inputs[0]
    width = spec.shape[1]
    if spec.name in columns or not columns or any(c.ndim != 1 for c in columns.values()):
        return None
    if width not in (-1, len(columns)):
        return None
    dtype = DATATYPES.get(spec.datatype)
    if dtype is None or spec.datatype not in _NUMBERS:
        return None
    if any(datatype_of(c) == "BYTES" for c in columns.values()):
        return None
    array = np.stack([c.astype(dtype, copy=False) for c in columns.values()], axis=1)
    return Tensor(spec.name, spec.datatype, array)


def _tensor(name: str, column: np.ndarray, spec: TensorSpec | None) -> Tensor:
    datatype = datatype_of(column)
    # Numbers go as the datatype the model takes (e.g. the FP64 fields of /score for an FP32 model).
    if spec is not None and spec.datatype != datatype and {spec.datatype, datatype} <= _NUMBERS:
        column = column.astype(DATATYPES[spec.datatype])
        datatype = spec.datatype
    return Tensor(name, datatype, column)


def forwarded_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """The request parameters a backend receives: scalar values, this gateway's own left out."""
    return {
        key: value
        for key, value in parameters.items()
        if key not in _LOCAL_PARAMETERS and isinstance(value, str | bool | int | float)
    }


def answer_frame(outputs: Sequence[Tensor], rows: int) -> tuple[Frame | None, str]:
    """The backend's output tensors as a Frame of ``rows`` rows, or None and what is wrong."""
    columns: dict[str, np.ndarray] = {}
    for tensor in outputs:
        array = tensor.array
        if array.ndim == 0 or array.shape[0] != rows:
            return None, f"output {tensor.name!r} has shape {list(array.shape)} for {rows} input row(s)"
        if tensor.name in columns:
            return None, f"output {tensor.name!r} appears twice"
        columns[tensor.name] = array
    if not columns:
        return None, "the answer has no outputs"
    return Frame(columns), ""


def spec_of(item: dict[str, Any]) -> TensorSpec:
    """A ``$metadata_tensor`` (name, datatype, shape) as a TensorSpec."""
    shape = item.get("shape") or [-1]
    return TensorSpec(str(item.get("name", "")), str(item.get("datatype", "BYTES")), tuple(int(d) for d in shape))
