"""Types of the C extension forestflow/api/_ffhttp.c (its docstring says what the call does)."""

from typing import Any

def request_head(
    buf: bytes | bytearray, end: int, names: dict[str, Any], istr: type, /
) -> tuple[str, int, bool, int, list[tuple[str, str]]] | None: ...
