"""Types of the C extension forestflow/predlog/_kafka_records.c."""

from collections.abc import Sequence
from typing import Any

def records(entries: Sequence[Any], /) -> bytes: ...
def ce_headers(fixed: bytes, request_id: str, event_time_ms: int, /) -> bytes | None: ...

EVENT_OVERHEAD_BYTES: int

class LogEntry:
    graphpipe: bool
    key: bytes | None
    value: bytes
    headers: bytes
    size: int
    def __init__(self, graphpipe: bool, key: bytes | None, value: bytes, headers: bytes = ...) -> None: ...

def set_record_type(cls: type, names: tuple[str, ...], defaults: tuple[Any, ...], /) -> None: ...
def new_record(*fields: Any) -> Any: ...
def usual_entry(record: Any, mode: int, /) -> LogEntry | None: ...
def set_usual(
    fields_of: Any,
    protocol_fields: dict[str, bytes],
    wire_event: Any,
    graphpipe_event: Any,
    usual_line: Any,
    dumps: Any,
    wire_body_type: type,
    message: Any,
    /,
) -> None: ...
