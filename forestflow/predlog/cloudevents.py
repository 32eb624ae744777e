"""CloudEvents (1.0, Kafka protocol binding, binary mode) headers on the records forestflow produces.

Binary mode leaves the record's value as it is (ForestFlow's protobuf event, or a reply body) and
says what it is in headers: ``ce_specversion``, ``ce_id`` (the request id), ``ce_source`` (the
gateway's route of the contract, ``/org/project/N``), ``ce_type``, ``ce_time`` and
``content-type``. A CloudEvents consumer (KServe's payload logger tooling, TrustyAI, Knative's
KafkaSource) then reads the records unmodified; ForestFlow consumers ignore headers.

The prediction log writes its records in C (``_kafka_records``): :func:`record_headers` gives the
headers section of one record already encoded (count and each header, as Kafka's record format has
them), the constant part cached per contract and kind.
"""

from __future__ import annotations

from datetime import UTC, datetime

from forestflow.codecs.ff_protobuf import varint
from forestflow.core.ids import Contract
from forestflow.predlog._kafka_records import ce_headers

SPECVERSION = b"1.0"
SERVED = "org.forestflow.prediction.served"
SHADOW = "org.forestflow.prediction.shadow"
REPLY = "org.forestflow.prediction.reply"
#: The content type of the prediction events (ForestFlow's PredictionEvent / PredictionEventGP).
EVENT_CONTENT_TYPE = b"application/x-protobuf"
#: Headers in every record the log writes: the four fixed ones, ce_id and ce_time.
_COUNT = 6


def source_of(contract: Contract) -> str:
    """The contract's route on the gateway, ``/org/project/N``."""
    return f"/{contract.organization}/{contract.project}/{contract.number}"


def event_time(epoch_ms: int) -> str:
    """RFC 3339 UTC time with milliseconds, as ce_time wants it."""
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def _varint(n: int) -> bytes:
    """A zigzag varint (Kafka's record fields): for ``n`` >= 0, as here, the varint of ``2n``."""
    return varint(n << 1)


def _header(name: bytes, value: bytes) -> bytes:
    return _varint(len(name)) + name + _varint(len(value)) + value


def fixed_headers(contract: Contract, served: bool) -> bytes:
    """The count and the headers every event of this contract and kind carries (what
    ``_kafka_records.ce_headers`` takes first)."""
    return (
        _varint(_COUNT)
        + _header(b"ce_specversion", SPECVERSION)
        + _header(b"ce_source", source_of(contract).encode())
        + _header(b"ce_type", (SERVED if served else SHADOW).encode())
        + _header(b"content-type", EVENT_CONTENT_TYPE)
    )


#: Per contract, by the identity of its object (the service hands the same contract object on every
#: event of a servable, and a frozen dataclass's hash is Python code): the contract and its fixed
#: headers for a served event and for a shadow copy.
_FIXED: dict[int, tuple[Contract, bytes, bytes]] = {}


def _fixed_of(contract: Contract) -> tuple[Contract, bytes, bytes]:
    if len(_FIXED) >= 4096:
        _FIXED.clear()
    hit = _FIXED[id(contract)] = (contract, fixed_headers(contract, True), fixed_headers(contract, False))
    return hit


_ID_NAME = _varint(5) + b"ce_id"
#: ce_time's name and value length: the value is always 24 characters (2026-11-25T12:37:13.123Z).
_TIME_NAME = _varint(7) + b"ce_time" + _varint(24)
_SMALL = [_varint(n) for n in range(64)]  # one byte each: what request ids take


def record_headers(contract: Contract, served: bool, request_id: str, event_time_ms: int) -> bytes:
    """The encoded headers section of one prediction event's Kafka record (written in C: runs per event)."""
    hit = _FIXED.get(id(contract))
    if hit is None or hit[0] is not contract:
        hit = _fixed_of(contract)
    out = ce_headers(hit[1] if served else hit[2], request_id, event_time_ms)
    return out if out is not None else python_record_headers(contract, served, request_id, event_time_ms)


def python_record_headers(contract: Contract, served: bool, request_id: str, event_time_ms: int) -> bytes:
    """:func:`record_headers` in Python: for times C does not write (before 1970, after 9999), and
    the reference the C writer is tested against."""
    seconds, ms = divmod(event_time_ms, 1000)
    rid = request_id.encode()
    n = len(rid)
    return b"".join(
        (
            fixed_headers(contract, served),
            _ID_NAME,
            _SMALL[n] if n < 64 else _varint(n),
            rid,
            _TIME_NAME,
            datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.").encode(),
            b"%03dZ" % ms,
        )
    )


def reply_headers(request_id: str, source: str, epoch_ms: int) -> list[tuple[str, bytes]]:
    """The ce_* headers of a Kafka ingestion reply (its content-type header is already there)."""
    return [
        ("ce_specversion", SPECVERSION),
        ("ce_id", request_id.encode()),
        ("ce_source", source.encode()),
        ("ce_type", REPLY.encode()),
        ("ce_time", event_time(epoch_ms).encode()),
    ]
