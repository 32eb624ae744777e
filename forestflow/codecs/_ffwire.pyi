"""Types of the C extension forestflow/codecs/_ffwire.c (its docstrings say what each call does)."""

from collections.abc import Sequence

import numpy as np

def set_types(table: Sequence[tuple[int, bytes]], /) -> None: ...
def message(
    outer: bytes,
    prefix: bytes,
    schema_tag: int,
    datum_tag: int,
    rows: int,
    columns: dict[str, np.ndarray],
    configs: dict[str, str] | None,
    flat_only: bool = False,
    before: bytes = ...,
    after: bytes = ...,
    /,
) -> bytes | None: ...
def varint(value: int, /) -> bytes: ...
def read_varint(data: bytes | bytearray | memoryview, pos: int, /) -> tuple[int, int]: ...
def event_head(
    head: bytes, event_time_ms: int, request_id: str, fqrv_field: bytes, latency_ms: float, status: int, tail: bytes, /
) -> bytes: ...
def wire_event(
    head: bytes,
    event_time_ms: int,
    request_id: str,
    fqrv_field: bytes,
    latency_ms: float,
    status: int,
    tail: bytes,
    request: bytes | None,
    response: bytes | None,
    request_json_length: int | None,
    response_json_length: int | None,
    /,
) -> bytes: ...
def graphpipe_event(
    head: bytes,
    event_time_ms: int,
    request_id: str,
    fqrv_field: bytes,
    latency_ms: float,
    status: int,
    tail: bytes,
    infer_bytes: bytes,
    infer_response: bytes | None,
    prediction_fqrv: bytes,
    /,
) -> bytes: ...
