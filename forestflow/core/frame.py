"""The Frame: the one internal batch type every front-end converts to and from.

A Frame is an ordered mapping ``name -> numpy array`` whose first axis is the row (record) axis.
Every column has the same length. Each column's datatype is one of the V2 names below; strings
and raw bytes are numpy ``object`` arrays (``BYTES``). ``parameters`` carries request-level
metadata (ForestFlow ``configs``, V2 ``parameters``) that every step can read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from forestflow.errors import InvalidInput

#: V2 datatype name -> numpy dtype. BYTES is a numpy object array of str or bytes.
DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
_BY_DTYPE: dict[np.dtype[Any], str] = {v: k for k, v in DATATYPES.items()}

NUMERIC_DATATYPES = frozenset(DATATYPES) - {"BYTES", "BOOL"}
#: The ``content_type`` of a BYTES tensor holding one encoded image (PNG, JPEG...) per element.
IMAGE = "image"


def datatype_of(array: np.ndarray) -> str:
    """The V2 datatype name of a numpy array (unicode arrays count as BYTES)."""
    dt = array.dtype
    known = _BY_DTYPE.get(dt)  # the usual native-order numbers and objects, in one look-up
    if known is not None:
        return known
    if dt.kind in ("U", "S", "O", "T"):
        return "BYTES"
    try:
        return _BY_DTYPE[dt.newbyteorder("=") if dt.byteorder not in ("=", "|") else dt]
    except KeyError:
        raise InvalidInput(f"unsupported array dtype {dt}") from None


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """The name, datatype and shape of one model input or output (``-1`` = any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...] = (-1,)
    description: str = ""
    #: For categorical inputs: the allowed levels, in the model's order.
    domain: tuple[str, ...] | None = None
    #: What a BYTES tensor's elements hold when that is not text, e.g. "image" (one encoded image
    #: each); V2 metadata gives it as the tensor's ``parameters.content_type``.
    content_type: str | None = None


@dataclass(slots=True)
class Frame:
    """An ordered set of equally long columns plus request-level parameters."""

    columns: dict[str, np.ndarray]
    parameters: dict[str, Any] = field(default_factory=dict)
    #: Columns whose datatype the request could not choose one by one (a V2 np tensor holds every
    #: feature in one datatype): not held to the datatypes the model declares (core/declared.py).
    loose_datatypes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        # A plain loop (no set comprehension, a call of its own): this runs for every frame made.
        rows = -1
        for col in self.columns.values():
            if not col.ndim or (rows != -1 and len(col) != rows):
                self._refuse()
            rows = len(col)

    def _refuse(self) -> NoReturn:
        """The error of columns without a row axis or of unequal lengths (the first applies if both do):
        called only when one of them is the case."""
        lengths = {len(col) if col.ndim else -1 for col in self.columns.values()}
        if -1 in lengths:
            raise InvalidInput("every column needs a row axis (arrays of rank >= 1)")
        detail = ", ".join(f"{name}={len(col)}" for name, col in self.columns.items())
        raise InvalidInput(f"all columns must have the same number of rows, got {detail}")

    @property
    def num_rows(self) -> int:
        """How many records the batch holds (0 for a frame without columns)."""
        for col in self.columns.values():
            return len(col)
        return 0

    def __len__(self) -> int:
        return self.num_rows

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def __contains__(self, name: object) -> bool:
        return name in self.columns

    def datatypes(self) -> dict[str, str]:
        """Each column's V2 datatype name."""
        return {name: datatype_of(col) for name, col in self.columns.items()}

    def select(self, names: list[str]) -> Frame:
        """A frame with only the named columns, in that order."""
        missing = [n for n in names if n not in self.columns]
        if missing:
            raise InvalidInput(f"unknown output(s) {', '.join(missing)}; available: {', '.join(self.columns)}")
        return Frame({n: self.columns[n] for n in names}, dict(self.parameters))

    def slice(self, start: int, stop: int) -> Frame:
        """Rows ``start:stop`` of every column (views, no copies)."""
        return Frame({n: c[start:stop] for n, c in self.columns.items()}, self.parameters)

    def rows(self) -> list[dict[str, Any]]:
        """The frame as a list of ``{column: value}`` records (for python servables and tests)."""
        names = list(self.columns)
        cols = [self.columns[n].tolist() for n in names]
        return [dict(zip(names, values)) for values in zip(*cols)]

    @classmethod
    def from_columns(cls, columns: Mapping[str, Any], parameters: dict[str, Any] | None = None) -> Frame:
        """Build a frame from lists or arrays; lists of str become BYTES columns."""
        built: dict[str, np.ndarray] = {}
        for name, values in columns.items():
            arr = values if isinstance(values, np.ndarray) else np.asarray(values)
            if arr.dtype.kind in ("U", "S"):
                arr = arr.astype(object)
            built[name] = arr
        return cls(built, dict(parameters or {}))

    @staticmethod
    def concat(frames: list[Frame]) -> Frame:
        """Stack frames with the same columns row-wise (micro-batching)."""
        first = frames[0]
        if len(frames) == 1:
            return first
        return Frame(
            {n: np.concatenate([f.columns[n] for f in frames]) for n in first.columns},
            dict(first.parameters),
        )
