"""Tabular rows <-> V2 tensors: the "np" and "pd" layouts of TrustyAI and MLServer.

- **np**: one tensor ``[N, F]`` holding the whole batch; its columns are the model's inputs in
  metadata order (TrustyAI's default, MLServer's NumpyCodec). ``[N]`` is N rows of a one-input model.
- **pd**: one tensor per feature, named after it: ``[N]``, ``[N, 1]`` (MLServer's PandasCodec) or
  ``[1, N]`` (TrustyAI, which runs observations along the second axis).

The layout is detected (TrustyAI's rule: several tensors are pd; one tensor named after no model
input is np) unless ``parameters.content_type`` says "np" or "pd". The ambiguous single tensor
``[1, K]`` is resolved with the model's inputs: named after a one-value-per-row input it is K rows
of that feature (pd), otherwise it is one row of K features (np, K must equal the input count).
Outputs are always batch-first, never TrustyAI's ``[1, N*k]`` that its reader cannot split into
rows: ``[N, k]``, and a one-value output ``[N, 1]`` when the request was a table of two axes (np,
or pd columns ``[N, 1]`` / ``[1, N]``) or the output is declared ``[-1, 1]``, else ``[N]`` (a
vector input sent as ``[N, 4]`` is not a table: an output declared ``[-1]`` is answered ``[N]``). An input whose own
``parameters.content_type`` is ``base64`` (MLServer's Base64Codec) reaches the model decoded.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from forestflow.codecs.v2_tensor import Tensor
from forestflow.core.frame import Frame, TensorSpec, datatype_of
from forestflow.errors import InvalidInput

NP = "np"
PD = "pd"


@dataclass(frozen=True, slots=True)
class Layout:
    """How a request was laid out, so that the response can follow it."""

    content_type: str
    #: 1 when every request tensor was 1-D (answer ``[N]``), else 2 (answer ``[N, k]``).
    rank: int
    #: Whether the client named the layout in ``parameters.content_type`` (then it is echoed).
    explicit: bool = False
    #: The declared shapes of the model's outputs, by name (answers follow them).
    outputs: tuple[tuple[str, tuple[int, ...]], ...] = ()


def requested_content_type(parameters: dict[str, Any]) -> str | None:
    """The layout the request names (``np``/``pd``), None if none; 400 for another value."""
    value = parameters.get("content_type")
    if value is None:
        return None
    if value in (NP, PD):
        return str(value)
    raise InvalidInput(f'parameters.content_type: expected "np" or "pd", got {value!r}')


def _per_row_dims(spec: TensorSpec | None) -> tuple[int, ...] | None:
    """The dimensions of one row of an input (``()`` for a scalar feature); None if unknown."""
    if spec is None:
        return None
    return tuple(spec.shape[1:])


def _pd_column(tensor: Tensor, spec: TensorSpec | None) -> np.ndarray:
    """One pd tensor as a batch-first column."""
    a: np.ndarray = tensor.array
    per_row = _per_row_dims(spec)
    if per_row == (1,):  # an [N, 1] input (ONNX models) takes one value per row: read it like a scalar
        per_row = ()
    if per_row:  # a vector (or N-D) input: [N, *per_row], or one row given without its batch axis
        if a.ndim == len(per_row) + 1:
            return a
        if a.ndim == len(per_row):
            return a[None, ...]
        raise InvalidInput(f"input {tensor.name!r}: expected shape [N, {', '.join(map(str, per_row))}], got {tensor.shape}")
    if a.ndim == 0:
        return a.reshape(1)
    if a.ndim == 1:
        return a
    if a.ndim == 2 and a.shape[1] == 1:
        return a[:, 0]
    if a.ndim == 2 and a.shape[0] == 1:
        return a.reshape(-1)
    if spec is None:  # not a model input: handed over as it is, rows on the first axis
        return a
    raise InvalidInput(f"input {tensor.name!r}: expected one value per row (shape [N], [N, 1] or [1, N]), got {tensor.shape}")


def _input_codec(tensor: Tensor) -> Tensor:
    """Apply an input-level MLServer ``content_type``: ``base64`` BYTES are decoded, others kept."""
    if tensor.parameters.get("content_type") != "base64" or tensor.datatype != "BYTES":
        return tensor
    flat = tensor.array.reshape(-1)
    decoded = np.empty(len(flat), dtype=object)
    try:
        decoded[:] = [base64.b64decode(v, validate=True) for v in flat]
    except (binascii.Error, TypeError, ValueError):
        raise InvalidInput(f"input {tensor.name!r}: content_type base64, but an element is not base64") from None
    return Tensor(tensor.name, tensor.datatype, decoded.reshape(tensor.array.shape), tensor.parameters)


def _decode_pd(tensors: Sequence[Tensor], specs: dict[str, TensorSpec]) -> dict[str, np.ndarray]:
    columns: dict[str, np.ndarray] = {}
    for tensor in tensors:
        if tensor.name in columns:
            raise InvalidInput(f"input {tensor.name!r} appears more than once")
        spec, a = specs.get(tensor.name), tensor.array
        # The usual column ([N] for a one-value input, or not an input) as it is; else _pd_column says.
        scalar = a.ndim == 1 and (spec is None or len(spec.shape) <= 1)
        columns[tensor.name] = a if scalar else _pd_column(tensor, spec)
    rows = {name: len(col) for name, col in columns.items()}
    if len(set(rows.values())) > 1:
        shapes = ", ".join(f"{t.name} {t.shape} = {rows[t.name]} rows" for t in tensors)
        raise InvalidInput(f"inputs disagree on the number of rows: {shapes}")
    return columns


def _decode_np(tensor: Tensor, specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    names = [s.name for s in specs]
    a = tensor.array
    if not names:  # a model that does not describe its inputs gets the tensor as it is
        return {tensor.name: a if a.ndim else a.reshape(1)}
    width = len(names)
    if width == 1 and len(specs[0].shape) > 1:  # the one input is itself a vector per row
        return {names[0]: _pd_column(tensor, specs[0])}
    if a.ndim == 2 and a.shape[1] == width:
        return {name: np.ascontiguousarray(a[:, j]) for j, name in enumerate(names)}
    if a.ndim == 2 and width == 1 and a.shape[0] == 1:  # TrustyAI's pd batch of the only feature
        return {names[0]: a[0]}
    if a.ndim == 1 and width == 1:
        return {names[0]: a}
    if a.ndim == 1 and a.shape[0] == width:  # one row given without its batch axis
        return {name: a[j : j + 1] for j, name in enumerate(names)}
    raise InvalidInput(
        f"input {tensor.name!r}: the np layout needs shape [N, {width}] (one column per model input: "
        f"{', '.join(names)}), got {tensor.shape}"
    )


def _looks_np(tensor: Tensor, specs: Sequence[TensorSpec], by_name: dict[str, TensorSpec]) -> bool:
    """A lone tensor is np unless it is named after a model input and fits that input as pd."""
    spec = by_name.get(tensor.name)
    if spec is None:
        return True
    a = tensor.array
    scalar = not _per_row_dims(spec)
    return scalar and a.ndim == 2 and min(a.shape) > 1 and a.shape[1] == len(specs) > 1


#: The inputs of the releases seen, by name: (the specs themselves, to check it is them; by name).
_BY_NAME: dict[int, tuple[Sequence[TensorSpec], dict[str, TensorSpec]]] = {}


def _specs_by_name(specs: Sequence[TensorSpec]) -> dict[str, TensorSpec]:
    """``{spec.name: spec}``, made once per release's inputs (not again for every request)."""
    cached = _BY_NAME.get(id(specs))
    if cached is not None and cached[0] is specs:
        return cached[1]
    by_name = {s.name: s for s in specs}
    if isinstance(specs, tuple):  # a list could change after this: not kept
        if len(_BY_NAME) >= 256:
            _BY_NAME.clear()
        _BY_NAME[id(specs)] = (specs, by_name)
    return by_name


def decode_inputs(
    tensors: Sequence[Tensor], specs: Sequence[TensorSpec], parameters: dict[str, Any], outputs: Sequence[TensorSpec] = ()
) -> tuple[Frame, Layout]:
    """Turn request tensors into a Frame of the model's inputs, and remember the layout (and the
    declared ``outputs``, which the answer follows)."""
    if not tensors:
        raise InvalidInput("inputs: at least one input tensor is required")
    asked = requested_content_type(parameters)
    tensors = [_input_codec(t) if t.parameters else t for t in tensors]
    by_name = _specs_by_name(specs)
    if asked is not None:
        layout = asked
    elif len(tensors) == 1 and specs and _looks_np(tensors[0], specs, by_name):
        layout = NP
    else:
        layout = PD
    if layout == NP:
        if len(tensors) != 1:
            names = ", ".join(t.name for t in tensors)
            raise InvalidInput(f"the np layout takes one input tensor holding every feature, got {len(tensors)}: {names}")
        columns = _decode_np(tensors[0], specs)
        vector = len(specs) == 1 and len(specs[0].shape) > 1  # the one input takes a vector: a tensor, not a table
        rank = 1 if vector else 2
        loose = frozenset() if vector else frozenset(columns)
    else:
        columns = _decode_pd(tensors, by_name)
        rank = 1 if all(not _tabular_2d(t, by_name.get(t.name)) for t in tensors) else 2
        loose = frozenset()
    frame = Frame(columns, dict(parameters), loose)
    declared = tuple((s.name, tuple(s.shape)) for s in outputs)
    return frame, Layout(layout, rank, asked is not None, declared)


def _tabular_2d(tensor: Tensor, spec: TensorSpec | None) -> bool:
    """Whether a pd tensor has a second axis because of a tabular layout (MLServer's [N, 1], TrustyAI's
    [1, N] of a one-value-per-row feature), not because its input takes a vector per row."""
    if tensor.array.ndim <= 1:
        return False
    return spec is None or _per_row_dims(spec) in ((), (1,))


def encode_outputs(frame: Frame, layout: Layout, requested: Sequence[str] | None = None) -> list[Tensor]:
    """The output tensors of a scored Frame, batch-first, in the requested order (else all)."""
    if requested:
        frame = frame.select(list(requested))
    declared = dict(layout.outputs)
    out = []
    for name, column in frame.columns.items():
        shape = declared.get(name)
        # [N, 1] for a tabular request (TrustyAI's reader needs two axes) or an output declared [-1, 1]
        two_d = layout.rank == 2 or (shape is not None and len(shape) >= 2)
        array = column.reshape(len(column), 1) if column.ndim == 1 and two_d else column
        out.append(Tensor(name, datatype_of(column), array))
    return out


def spec_json(spec: TensorSpec) -> dict[str, Any]:
    """A V2 ``$metadata_tensor``: ``{name, datatype, shape}``, and ``parameters.content_type`` when
    the tensor holds something other than text or numbers (``"image"``)."""
    out: dict[str, Any] = {"name": spec.name, "datatype": spec.datatype, "shape": [int(d) for d in spec.shape]}
    if spec.content_type is not None:
        out["parameters"] = {"content_type": spec.content_type}
    return out
