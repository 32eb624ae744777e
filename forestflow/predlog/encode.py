"""PredictionRecord -> ForestFlow's PredictionEvent / PredictionEventGP protobuf, or a JSON line.

The JSON line is built straight from the record (no protobuf on the way) and has the shape
protobuf's JSON mapping gives the same event (camelCase, int64 as strings, bytes as base64).
V2 records (:class:`~forestflow.predlog.record.WireBody` bodies) become wire events: fields 18-21
hold the request and answer as they were on the wire, copied, not re-encoded; in the JSON line a
REST JSON body is the document itself rather than base64.
"""

from __future__ import annotations

import base64
import functools
import struct
from dataclasses import dataclass
from typing import Any

import orjson
from google.protobuf import json_format

from forestflow._proto import forestflow_pb2 as pb
from forestflow.codecs._ffwire import graphpipe_event, message, wire_event
from forestflow.codecs.ff_protobuf import (
    embedded,
    fqrv_bytes,
    inference_request_between,
    inference_request_bytes,
    key,
    prediction_bytes_after,
    prediction_fqrv_field,
    varint,
)
from forestflow.codecs.ff_settings import fqrv_to_json, logging_to_json
from forestflow.codecs.schema_datum import prediction_json, request_json
from forestflow.core.ids import FQRV
from forestflow.core.policies import LoggingSettings
from forestflow.predlog import _kafka_records
from forestflow.predlog._jsonl import usual_line
from forestflow.predlog._kafka_records import LogEntry, ce_headers, set_usual
from forestflow.predlog.cloudevents import fixed_headers, python_record_headers
from forestflow.predlog.record import PredictionRecord, WireBody

_SERVED = {True: key(2, 0) + b"\x01", False: key(2, 0) + b"\x00"}
_PREDICTION, _INFERENCE_REQUEST = key(1, 2), key(3, 2)
_PINNED = key(22, 0) + b"\x01"
_EVENT_TIME = key(10, 0)
#: CR and LF as spaces: in valid JSON they can only be whitespace between tokens (a string holds
#: them escaped, as a backslash and a letter), so the swap keeps the document's meaning.
_LINE_BREAKS_TO_SPACES = bytes.maketrans(b"\r\n", b"  ")


def one_line_json(body: bytes) -> bytes:
    """A parsed (hence valid) JSON body made safe for a JSON-lines file, reused as is when it can be.

    Pretty-printed bodies (``curl --data-binary @file``, httpie ``< file``) carry line breaks;
    written verbatim they would split one event over many lines of the log.
    """
    # Searched as byte values: ``10 in body`` is a plain byte search, ``b"\n" in body`` goes through the
    # buffer protocol first and costs 6x more on a small body (it runs twice on every logged request).
    if 10 in body or 13 in body:  # LF, CR
        return body.translate(_LINE_BREAKS_TO_SPACES)
    return body


@functools.lru_cache(maxsize=256)
def _logging_field(logging: LoggingSettings) -> bytes:
    """Field 4 (loggingSettings) of either event; a servable's settings repeat on every event."""
    body = key(1, 0) + varint(logging.log_level.value)
    body += b"".join(embedded(2, name.encode()) for name in logging.key_features)
    return embedded(4, body + embedded(3, logging.key_features_separator.encode()))


@dataclass(frozen=True, slots=True)
class _ServableFields:
    """What every event of one servable repeats, written once: protobuf fields and JSON values."""

    logging: LoggingSettings
    fqrv: FQRV
    #: servedRequest (field 2) and loggingSettings (4), for a served request and for a shadow copy.
    served_head: bytes
    shadow_head: bytes
    fqrv_field: bytes
    #: A Prediction's fqrv field (field 1 of the Prediction message).
    prediction_fqrv: bytes
    #: A GraphPipe Prediction's fqrv field (field 2 of PredictionEventGP's prediction).
    graphpipe_fqrv: bytes
    logging_json: orjson.Fragment
    fqrv_json: orjson.Fragment
    #: The same two as JSON bytes (what the C line writer takes).
    logging_json_bytes: bytes
    fqrv_json_bytes: bytes
    #: The CloudEvents headers every Kafka record of a served event, and of a shadow copy, repeats.
    ce_served: bytes
    ce_shadow: bytes


#: A servable's fields by the identity of its fqrv object: the service hands the same fqrv and
#: settings objects on every event of a servable, and hashing them (frozen dataclasses) per event
#: costs more than building the rest of the header. Each entry is checked against both objects: an
#: fqrv id reused by another object, or a servable's new settings, rebuild it.
_SERVABLE_FIELDS: dict[int, _ServableFields] = {}


def _servable_fields(logging: LoggingSettings, fqrv: FQRV) -> _ServableFields:
    hit = _SERVABLE_FIELDS.get(id(fqrv))
    if hit is None or hit.fqrv is not fqrv or hit.logging is not logging:
        if len(_SERVABLE_FIELDS) >= 1024:
            _SERVABLE_FIELDS.clear()
        logging_field = _logging_field(logging)
        logging_json, fqrv_json = orjson.dumps(logging_to_json(logging)), orjson.dumps(fqrv_to_json(fqrv))
        hit = _SERVABLE_FIELDS[id(fqrv)] = _ServableFields(
            logging,
            fqrv,
            _SERVED[True] + logging_field,
            _SERVED[False] + logging_field,
            embedded(12, fqrv_bytes(fqrv)),
            prediction_fqrv_field(fqrv),
            embedded(2, fqrv_bytes(fqrv)),
            orjson.Fragment(logging_json),
            orjson.Fragment(fqrv_json),
            logging_json,
            fqrv_json,
            fixed_headers(fqrv.contract, True),
            fixed_headers(fqrv.contract, False),
        )
    return hit


#: Field 17 (protocol) by protocol name: a dict lookup per event (an lru_cache call costs several).
_PROTOCOL_FIELDS: dict[str, bytes] = {}


def _protocol_field(protocol: str) -> bytes:
    field = _PROTOCOL_FIELDS.get(protocol)
    if field is None:
        if len(_PROTOCOL_FIELDS) >= 64:
            _PROTOCOL_FIELDS.clear()
        field = _PROTOCOL_FIELDS[protocol] = embedded(17, protocol.encode())
    return field


def _tail(record: PredictionRecord) -> bytes:
    """Fields 15-17 and 22/30 of an event (error, errorCode, protocol, pinned, traceId), as written."""
    if not (record.error or record.pinned or record.trace_id):  # the usual event: the protocol alone
        return _PROTOCOL_FIELDS.get(record.protocol) or _protocol_field(record.protocol)
    tail = _protocol_field(record.protocol)
    if record.pinned:
        tail += _PINNED
    if record.trace_id:
        tail += embedded(30, record.trace_id.encode())
    if record.error:
        tail = embedded(15, record.error.encode()) + embedded(16, record.error_code.encode()) + tail
    return tail


def _common_fields(
    record: PredictionRecord,
    fields: _ServableFields,
    request: bytes | None = None,
    response: bytes | None = None,
    request_json_length: int | None = None,
    response_json_length: int | None = None,
) -> bytes:
    """The fields PredictionEvent and PredictionEventGP share (servedRequest, loggingSettings, 10-17),
    and a V2 event's wire fields (18-21, each unless None) after them, in one C call."""
    return wire_event(
        fields.served_head if record.served else fields.shadow_head,
        record.event_time_ms,
        record.request_id,
        fields.fqrv_field,
        record.latency_ms,
        record.status,
        _tail(record),
        request,
        response,
        request_json_length,
        response_json_length,
    )


def encode_event(record: PredictionRecord) -> bytes:
    """The serialized event: PredictionEventGP for GraphPipe records, else PredictionEvent.

    Assembled as bytes (cached pieces for what repeats: the servable's fqrv and logging settings),
    which parses to the message the protobuf API builds field by field (tested).
    """
    return _event(record, _servable_fields(record.logging, record.fqrv))


def kafka_entry(record: PredictionRecord, key_text: str | None) -> LogEntry:
    """The Kafka sink's entry of a record: ``key_text`` (its key) encoded, :func:`encode_event`'s bytes and
    the CloudEvents headers of :func:`~forestflow.predlog.cloudevents.record_headers`, the servable's
    fields looked up once for both (this runs for every event logged to Kafka)."""
    fqrv = record.fqrv
    fields = _servable_fields(record.logging, fqrv)
    headers = ce_headers(fields.ce_served if record.served else fields.ce_shadow, record.request_id, record.event_time_ms)
    if headers is None:  # a time C does not write
        headers = python_record_headers(fqrv.contract, record.served, record.request_id, record.event_time_ms)
    return LogEntry(
        record.raw_request is not None,
        None if key_text is None else key_text.encode(),
        _event(record, fields),
        headers,
    )


def _event(record: PredictionRecord, fields: _ServableFields) -> bytes:
    """:func:`encode_event` with the servable's fields looked up."""
    if record.feedback is not None:
        return _feedback_event(record, fields)
    request = record.request_json
    if isinstance(request, WireBody):  # V2: the head and the bodies as they were on the wire, in one call
        response = record.response_json
        response_length = response.json_length if isinstance(response, WireBody) else None
        return _common_fields(record, fields, request, response, request.json_length, response_length)
    if record.raw_request is not None:  # GraphPipe: the head, the request and the answer's message, in one call
        return graphpipe_event(
            fields.served_head if record.served else fields.shadow_head,
            record.event_time_ms,
            record.request_id,
            fields.fqrv_field,
            record.latency_ms,
            record.status,
            _tail(record),
            record.raw_request,
            record.raw_response,
            fields.graphpipe_fqrv,
        )
    payload = _common_fields(record, fields)
    if record.response is None:
        return payload + inference_request_bytes(record.request, record.configs, _INFERENCE_REQUEST)
    # The request written between the head and the answer in one buffer (no join copying it again:
    # kilobytes at 100 rows).
    prediction = prediction_bytes_after(fields.prediction_fqrv, record.response, _PREDICTION)
    return inference_request_between(payload, record.request, record.configs, _INFERENCE_REQUEST, prediction)


def _feedback_event(record: PredictionRecord, fields: _ServableFields) -> bytes:
    """A feedback event: who answered (fqrv, requestId), when, and the reward (field 23)."""
    assert record.feedback is not None
    return b"".join(
        (
            fields.served_head,
            _EVENT_TIME + varint(record.event_time_ms),
            embedded(11, record.request_id.encode()),
            fields.fqrv_field,
            _protocol_field(record.protocol),
            _PINNED if record.pinned else b"",
            embedded(23, key(1, 1) + struct.pack("<d", record.feedback)),
        )
    )


def _feedback_event_json(record: PredictionRecord, fields: _ServableFields) -> dict[str, Any]:
    event: dict[str, Any] = {
        "servedRequest": True,
        "loggingSettings": fields.logging_json,
        "eventTimeMS": str(record.event_time_ms),
        "requestId": record.request_id,
        "fqrv": fields.fqrv_json,
        "protocol": record.protocol,
        "feedback": {"reward": record.feedback},
    }
    if record.pinned:
        event["pinned"] = True
    return event


def _wire_json(body: bytes, protocol: str, json_length: int | None) -> Any:
    """A wire body in the JSON line: REST JSON embedded as it is, anything else as base64 text."""
    if protocol == "v2" and json_length is None:
        return orjson.Fragment(one_line_json(bytes(body)))  # orjson takes exactly bytes, not a subclass
    return base64.b64encode(body).decode()


def _wire_event_json(record: PredictionRecord) -> dict[str, Any]:
    """The V2-specific part of a wire event's JSON line (see :func:`encode_event_json`)."""
    request, response = record.request_json, record.response_json
    assert isinstance(request, WireBody)
    event: dict[str, Any] = {"wireRequest": _wire_json(request, record.protocol, request.json_length)}
    if request.json_length is not None:
        event["wireRequestJsonLength"] = request.json_length
    if response is not None:
        response_length = response.json_length if isinstance(response, WireBody) else None
        event["wireResponse"] = _wire_json(response, record.protocol, response_length)
        if response_length is not None:
            event["wireResponseJsonLength"] = response_length
    return event


def decode_event(payload: bytes, graphpipe: bool = False) -> Any:
    """Parse an event written by :func:`encode_event`."""
    message = pb.PredictionEventGP() if graphpipe else pb.PredictionEvent()
    message.ParseFromString(payload)
    return message


def event_to_dict(payload: bytes, graphpipe: bool = False) -> dict[str, Any]:
    """An event as a JSON-ready dict (camelCase, as ``forestflow logs tail`` prints it)."""
    document: dict[str, Any] = json_format.MessageToDict(decode_event(payload, graphpipe))
    return document


#: encode_event_json's ``kafka_key`` when the caller has not computed it.
_KEY_OF_RECORD: Any = object()


#: The kinds of event :func:`_usual_line` writes (``usual_line``'s first argument).
_SCORE, _WIRE, _GRAPHPIPE = 0, 1, 2


def _usual_line(record: PredictionRecord, fields: _ServableFields, kind: int, kafka_key: str | None) -> bytes | None:
    """The JSON line of the events nearly every request makes, in one C call: a /score answer with its
    JSON bodies, a V2 REST one, or a GraphPipe answer (``kind``; no error, pin, trace or pipeline extras).
    None for any other event, and when the C writer leaves the line to orjson (:func:`encode_event_json`
    builds those field by field, in the same order, to the same bytes)."""
    if record.error or record.pinned or record.trace_id or record.feedback is not None:
        return None
    response = record.response
    # Only what a pipeline adds to the line makes it unusual: an answer's parameters may hold a flavor's
    # own (H2O: unknown and missing inputs, on every answer), which the line does not carry.
    parameters = response.parameters if response is not None else None
    if parameters and (parameters.get("metadata") or parameters.get("intermediate")):
        return None
    if kind == _GRAPHPIPE:  # the flatbuffers, written as base64 in C
        request, answer = record.raw_request, record.raw_response
    else:
        request, answer = record.request_json, record.response_json
    if request is None or answer is None:
        return None
    if kind == _WIRE and (
        record.protocol != "v2"
        or request.json_length is not None  # type: ignore[attr-defined]  # a WireBody (``kind``)
        or (isinstance(answer, WireBody) and answer.json_length is not None)
    ):
        return None
    return usual_line(
        kind,
        kafka_key,
        request,
        answer,
        record.served,
        fields.logging_json_bytes,
        record.event_time_ms,
        record.request_id,
        fields.fqrv_json_bytes,
        orjson.dumps(record.latency_ms),  # orjson's shortest float form, several times cheaper than repr()
        record.status,
        record.protocol,
    )


def encode_event_json(record: PredictionRecord, kafka_key: str | None = _KEY_OF_RECORD) -> bytes:
    """One JSON line ``{"topic", "key", "event"}`` for the local file log (no trailing newline).

    ``kafka_key`` is the record's key when the caller already has it (the log computes it once).
    """
    fields = _servable_fields(record.logging, record.fqrv)
    graphpipe, wire = record.raw_request is not None, isinstance(record.request_json, WireBody)
    if kafka_key is _KEY_OF_RECORD:
        kafka_key = record.key
    usual = _usual_line(record, fields, _GRAPHPIPE if graphpipe else _WIRE if wire else _SCORE, kafka_key)
    if usual is not None:
        return usual
    if record.feedback is not None:
        return orjson.dumps({"topic": "basic", "key": kafka_key, "event": _feedback_event_json(record, fields)})
    event: dict[str, Any] = {}
    if graphpipe:
        if record.raw_response is not None:
            event["prediction"] = {
                "inferResponse": base64.b64encode(record.raw_response).decode(),
                "fqrv": fields.fqrv_json,
            }
        event["servedRequest"] = record.served
        event["inferBytes"] = base64.b64encode(record.raw_request or b"").decode()
    elif wire:
        event["servedRequest"] = record.served
    else:
        if record.response_json is not None:
            event["prediction"] = orjson.Fragment(one_line_json(record.response_json))
        elif record.response is not None:
            event["prediction"] = orjson.Fragment(prediction_json(record.fqrv, record.response))
        event["servedRequest"] = record.served
        if record.request_json is not None:
            event["inferenceRequest"] = orjson.Fragment(one_line_json(record.request_json))
        else:
            event["inferenceRequest"] = orjson.Fragment(request_json(record.request, record.configs))
    event["loggingSettings"] = fields.logging_json
    event["eventTimeMS"] = str(record.event_time_ms)
    event["requestId"] = record.request_id
    event["fqrv"] = fields.fqrv_json
    event["latencyMs"] = record.latency_ms
    event["status"] = record.status
    if record.error:
        event["error"] = record.error
        event["errorCode"] = record.error_code
    event["protocol"] = record.protocol
    if record.pinned:
        event["pinned"] = True
    if record.trace_id:
        event["traceId"] = record.trace_id
    if wire:
        event.update(_wire_event_json(record))
    if record.response is not None:  # what pipelines add (runtime/pipeline.py): step metadata, intermediate tensors
        returned = record.response.parameters.get("metadata")
        if returned:
            event["metadata"] = returned
        between = record.response.parameters.get("intermediate")
        if between:
            event["intermediate"] = {name: column.tolist() for name, column in between.items()}
    line = {"topic": "graphpipe" if graphpipe else "basic", "key": kafka_key, "event": event}
    return orjson.dumps(line, option=orjson.OPT_SERIALIZE_NUMPY)


#: The modes of ``_kafka_records.usual_entry(record, mode)``, the LogEntry of the usual record in one C call
#: (set up here): the same bytes as :func:`kafka_entry` (``USUAL_KAFKA``), or an entry of :func:`encode_event`
#: (``USUAL_PROTOBUF``) or of :func:`encode_event_json` (``USUAL_JSONL``); None for any other record.
USUAL_KAFKA, USUAL_PROTOBUF, USUAL_JSONL = 0, 1, 2
set_usual(_servable_fields, _PROTOCOL_FIELDS, wire_event, graphpipe_event, usual_line, orjson.dumps, WireBody, message)
#: Imported from here, not from the extension: this module is what sets it up (set_usual above).
usual_entry = _kafka_records.usual_entry
