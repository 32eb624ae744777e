"""Input mapping for the H2O MOJO flavor: a Frame becomes genmodel's row matrix.

Model columns are matched by name. Categorical values become domain indices (strings exactly,
numbers by their text: 1 and 1.0 name level "1"); numeric values are numbers, numeric strings
parsed with Java's ``Double.parseDouble`` grammar. Missing values and unparsable numbers are NaN
(NA); unseen levels are NA too, or a distinct code for models that encode categoricals themselves.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from forestflow.core.frame import Frame
from forestflow.errors import InvalidInput
from forestflow.runtime._h2o_trees import encode_columns, level_codes

#: The value genmodel reads as missing.
NA = float("nan")
#: Code of a non-missing categorical value that names no level (genmodel: unseen level -> NA).
UNSEEN = -1.0
# Double.parseDouble after String.trim() (which strips every char <= U+0020): the same grammar here.
_JAVA_WS = "".join(map(chr, range(33)))
_JAVA_DECIMAL = re.compile(r"[+-]?(?:NaN|Infinity|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[fFdD]?)")
_JAVA_HEX = re.compile(r"([+-]?)0[xX]((?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?\d+)[fFdD]?")


@functools.lru_cache(maxsize=8192)
def parse_number(text: str) -> float:
    """A numeric string as Java's ``Double.parseDouble`` reads it; NaN (NA) when it cannot."""
    s = text.strip(_JAVA_WS)
    if _JAVA_DECIMAL.fullmatch(s):
        return float(s.rstrip("fFdD"))
    m = _JAVA_HEX.fullmatch(s)
    return float.fromhex(f"{m[1]}0x{m[2]}") if m else NA


@dataclass(frozen=True, slots=True)
class ModelColumn:
    """One model input: its name, and for a categorical its levels and a level -> index map."""

    name: str
    domain: tuple[str, ...] | None = None
    lookup: dict[str, int] = field(default_factory=dict)

    @classmethod
    def make(cls, name: str, domain: tuple[str, ...] | None) -> ModelColumn:
        """Build the column; like genmodel, "<level>" also finds a level stored as "<name>.<level>"."""
        if domain is None:
            return cls(name)
        lookup = {level: i for i, level in enumerate(domain)}
        prefix = name + "."
        for i, level in enumerate(domain):
            if level.startswith(prefix):
                lookup.setdefault(level[len(prefix) :], i)
        return cls(name, domain, lookup)

    def level_of_number(self, x: Any) -> float:
        """The level index a number names: 1 and 1.0 name "1", 1.5 names "1.5"; UNSEEN if none."""
        if isinstance(x, (int, np.integer)):
            candidates = [str(int(x))]
        else:
            f = float(x)
            if math.isnan(f):
                return NA
            # str() of a numpy float32 is its own shortest form ("1.1"), not float64's.
            candidates = [str(int(f)), str(x)] if f.is_integer() else [str(x)]
        for text in candidates:
            index = self.lookup.get(text)
            if index is not None:
                return float(index)
        return UNSEEN

    def level_of(self, v: Any) -> float:
        """The level index of one value: strings exactly, numbers by their text; NaN if missing."""
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        if isinstance(v, str):
            index = self.lookup.get(v)
            return UNSEEN if index is None else float(index)
        if isinstance(v, (bool, np.bool_)):
            v = int(v)
        if isinstance(v, (int, float, np.integer, np.floating)):
            return self.level_of_number(v)
        return NA if v is None else UNSEEN

    def code_of(self, v: Any, unseen: float = NA) -> float:
        """The level index of one value (NaN = missing), ``unseen`` for an unknown one."""
        index = self.lookup.get(v) if isinstance(v, str) else None
        if index is not None:
            return float(index)
        level = self.level_of(v)
        return unseen if level == UNSEEN else level

    def codes(self, arr: np.ndarray, unseen: float = NA) -> np.ndarray | list[float]:
        """Level indices (NaN = missing) for a whole column; ``unseen`` for unknown values."""
        if arr.dtype.kind in "biuf":
            if arr.dtype.kind == "b":
                arr = arr.astype(np.int64)
            uniq, inverse = np.unique(arr, return_inverse=True)  # NaNs collapse into one entry
            table = np.array([self.level_of_number(u) for u in uniq], dtype=np.float64)
            out = table[inverse.reshape(-1)]
            out[out == UNSEEN] = unseen
            return out
        lookup = self.lookup
        try:  # the common case, known strings, in one pass; the rest resolved one by one
            found: list[float] = list(map(lookup.get, arr.tolist(), repeat(-1)))  # no Python step per value
        except TypeError:  # an unhashable value somewhere
            found = [-1] * len(arr)
        if -1 in found:
            for i, code in enumerate(found):
                if code == -1:
                    found[i] = self.code_of(arr[i], unseen)
        return found

    def fill(self, arr: np.ndarray, X: np.ndarray, j: int, unseen: float = NA) -> None:
        """``X[:, j] = self.codes(arr, unseen)``, known strings written by the C kernel's module in
        one pass (no Python step, no list of floats per value); the rest resolved one by one."""
        if arr.dtype.kind != "O" or X.dtype != np.float64 or not X.flags.c_contiguous:
            X[:, j] = self.codes(arr, unseen)
            return
        for i in level_codes(arr.tolist(), self.lookup, X, j):
            X[i, j] = self.code_of(arr[i], unseen)


def _number(v: Any) -> float:
    if isinstance(v, str):
        return parse_number(v)
    if isinstance(v, bytes):
        return parse_number(v.decode("utf-8", "replace"))
    if v is None:
        return NA
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return NA


def numbers(arr: np.ndarray) -> np.ndarray | list[float]:
    """A numeric column as numbers (NaN = NA): numeric strings parsed, anything unparsable NaN."""
    if arr.dtype.kind in "biuf":
        return arr  # numpy casts to float64 when the caller stores it
    return [_number(v) for v in arr.tolist()]


def one_per_row(name: str, arr: np.ndarray) -> np.ndarray:
    if arr.ndim == 2 and arr.shape[1] == 1:
        return arr[:, 0]
    if arr.ndim != 1:
        raise InvalidInput(f"input {name!r} must hold one value per row (shape [N] or [N,1]), got {list(arr.shape)}")
    return arr


def build_matrix(
    frame: Frame,
    columns: list[ModelColumn],
    offset: str | None,
    unseen: float = NA,
    index: dict[str, int] | None = None,
) -> tuple[np.ndarray, np.ndarray | None, list[str]]:
    """Encode a frame for genmodel: ``(rows x model columns, offsets or None, unknown column names)``.

    Columns are matched by name; model columns the frame lacks are NA, frame columns the model
    lacks are reported. A missing offset is 0. The usual columns (FP64 numbers, known levels as
    str) are written by the C kernel's module in one call; the others as below, value by value.
    """
    if index is None:
        index = {c.name: j for j, c in enumerate(columns)}
    X = np.empty((frame.num_rows, len(columns)))
    X.fill(NA)  # (np.full's Python wrapper and its copyto cost ~4k instructions more per call)
    arrays: list[np.ndarray | None] = [None] * len(columns)
    offsets = None
    unknown: list[str] = []
    for name, arr in frame.columns.items():
        j = index.get(name)
        if j is not None:
            arrays[j] = arr if arr.ndim == 1 else one_per_row(name, arr)
        elif name == offset:
            offsets = np.array(numbers(one_per_row(name, arr)), dtype=np.float64)
            offsets[np.isnan(offsets)] = 0.0
        else:
            unknown.append(name)
    left = encode_columns(arrays, _lookups(columns), X)
    if left:
        single = frame.num_rows == 1  # one row: plain Python per value beats numpy per column
        for j in left:
            col, values = columns[j], arrays[j]
            assert values is not None
            if single:
                X[0, j] = col.code_of(values[0], unseen) if col.domain is not None else _number(values[0])
            elif col.domain is not None:
                col.fill(values, X, j, unseen)
            else:
                X[:, j] = numbers(values)
    return X, offsets, unknown


#: Each model's columns' level lookups (None for a numeric column), for encode_columns.
_LOOKUPS: dict[int, tuple[list[ModelColumn], list[dict[str, int] | None]]] = {}


def _lookups(columns: list[ModelColumn]) -> list[dict[str, int] | None]:
    cached = _LOOKUPS.get(id(columns))
    if cached is not None and cached[0] is columns and len(cached[1]) == len(columns):
        return cached[1]
    lookups = [c.lookup if c.domain is not None else None for c in columns]
    if len(_LOOKUPS) >= 256:
        _LOOKUPS.clear()
    _LOOKUPS[id(columns)] = (columns, lookups)
    return lookups


def missing_columns(frame: Frame, columns: list[ModelColumn]) -> list[str]:
    """Model columns the frame does not carry (scored as NA), in model order."""
    present = frame.columns
    return [c.name for c in columns if c.name not in present]
