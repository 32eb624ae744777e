"""Types of the C extension forestflow/predlog/_jsonl.c."""

def usual_line(
    kind: int,
    key: str | None,
    request: bytes,
    response: bytes,
    served: bool,
    logging_json: bytes,
    event_time_ms: int,
    request_id: str,
    fqrv_json: bytes,
    latency_ms: bytes,
    status: int,
    protocol: str,
    /,
) -> bytes | None: ...
def _set_simd(level: int, /) -> int: ...
