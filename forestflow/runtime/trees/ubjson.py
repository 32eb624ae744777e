"""A small UBJSON reader (the format XGBoost saves ``.ubj`` models in), typed arrays as numpy arrays.

Universal Binary JSON: big-endian, one marker byte per value (``Z`` null, ``T``/``F``, ``i U I l L``
integers, ``d D`` floats, ``C`` char, ``S``/``H`` strings, ``[`` arrays, ``{`` objects), with
optimized containers (``$`` one element type, ``#`` a count). A counted array of one numeric
type becomes a numpy array read in one step; everything else Python values. The input is
untrusted: every length is checked against the bytes left, nesting is bounded, and any fault is
a :class:`UBJSONError` saying where.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

_INTS = {b"i": ">i1", b"U": ">u1", b"I": ">i2", b"l": ">i4", b"L": ">i8"}
_NUMBERS = {**_INTS, b"d": ">f4", b"D": ">f8"}
_MAX_DEPTH = 64


class UBJSONError(ValueError):
    """Bytes that are not (complete) UBJSON."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def fail(self, what: str) -> UBJSONError:
        return UBJSONError(f"{what} at byte {self.pos}")

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise self.fail("truncated")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def marker(self) -> bytes:
        while True:
            m = bytes(self.take(1))
            if m != b"N":  # no-op
                return m

    def number(self, m: bytes) -> Any:
        dtype = np.dtype(_NUMBERS[m])
        value = np.frombuffer(self.take(dtype.itemsize), dtype=dtype)[0]
        return int(value) if m in _INTS else float(value)

    def count(self, m: bytes | None = None) -> int:
        m = self.marker() if m is None else m
        if m not in _INTS:
            raise self.fail(f"a length must be an integer, got marker {m!r}")
        n = self.number(m)
        if n < 0:
            raise self.fail("negative length")
        return int(n)

    def text(self) -> str:
        raw = self.take(self.count())
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise self.fail("a string is not UTF-8") from None

    def value(self, m: bytes, depth: int) -> Any:
        if m in _NUMBERS:
            return self.number(m)
        if m == b"S" or m == b"H":
            return self.text()
        if m == b"C":
            return chr(self.take(1)[0])
        if m == b"T":
            return True
        if m == b"F":
            return False
        if m == b"Z":
            return None
        if m == b"[":
            return self.array(depth + 1)
        if m == b"{":
            return self.object(depth + 1)
        raise self.fail(f"unknown marker {m!r}")

    def peek(self) -> bytes:
        return bytes(self.data[self.pos : self.pos + 1])

    def container_header(self) -> tuple[bytes | None, int | None]:
        kind: bytes | None = None
        size: int | None = None
        if self.peek() == b"$":
            self.pos += 1
            kind = bytes(self.take(1))
            if self.peek() != b"#":
                raise self.fail("a typed container needs a count")
        if self.peek() == b"#":
            self.pos += 1
            size = self.count()
        return kind, size

    def array(self, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise self.fail("nested too deep")
        kind, size = self.container_header()
        if kind in _NUMBERS and size is not None:
            dtype = np.dtype(_NUMBERS[kind])
            raw = self.take(size * dtype.itemsize)
            return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))
        if size is not None:
            if size > len(self.data) - self.pos and kind not in (b"Z", b"T", b"F"):
                raise self.fail("truncated")
            return [self.value(kind if kind is not None else self.marker(), depth) for _ in range(size)]
        out: list[Any] = []
        while True:
            m = self.marker()
            if m == b"]":
                return out
            out.append(self.value(m, depth))

    def object(self, depth: int) -> dict[str, Any]:
        if depth > _MAX_DEPTH:
            raise self.fail("nested too deep")
        kind, size = self.container_header()
        out: dict[str, Any] = {}
        if size is not None:
            if size > len(self.data) - self.pos:
                raise self.fail("truncated")
            for _ in range(size):
                key = self.text()
                out[key] = self.value(kind if kind is not None else self.marker(), depth)
            return out
        while True:
            m = self.marker()
            if m == b"}":
                return out
            key = self.text_after(m)
            out[key] = self.value(self.marker(), depth)

    def text_after(self, m: bytes) -> str:
        raw = self.take(self.count(m))
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise self.fail("a key is not UTF-8") from None


def loads(data: bytes) -> Any:
    """The value UBJSON ``data`` holds (one value, nothing after it)."""
    reader = _Reader(data)
    try:
        value = reader.value(reader.marker(), 0)
    except (struct.error, IndexError, ValueError) as exc:
        if isinstance(exc, UBJSONError):
            raise
        raise reader.fail(str(exc)) from None
    if reader.pos != len(reader.data):
        raise reader.fail("bytes after the value")
    return value
