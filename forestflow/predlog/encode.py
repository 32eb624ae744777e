"""PredictionRecord -> ForestFlow's PredictionEvent / PredictionEventGP protobuf, or a JSON line.

The JSON line is built straight from the record (no protobuf on the way) and has the shape
protobuf's JSON mapping gives the same event (camelCase, int64 as strings, bytes as base64).
"""

from __future__ import annotations

from typing import Any

import base64

import orjson
from google.protobuf import json_format

from forestflow._proto import forestflow_pb2 as pb
from forestflow.codecs.ff_settings import fqrv_to_json, logging_to_json
from forestflow.codecs.ff_protobuf import embedded, inference_request_bytes, prediction_bytes
from forestflow.codecs.schema_datum import prediction_json, request_json
from forestflow.core.ids import FQRV
from forestflow.core.policies import LoggingSettings
from forestflow.predlog.record import PredictionRecord


def _fill_fqrv(message: Any, fqrv: FQRV) -> None:
    message.contract.organization = fqrv.contract.organization
    message.contract.project = fqrv.contract.project
    message.contract.contract_number = fqrv.contract.number
    message.release_version = fqrv.release


def _fill_logging(message: Any, logging: LoggingSettings) -> None:
    message.logLevel = logging.log_level.value
    message.keyFeatures.extend(logging.key_features)
    message.keyFeaturesSeparator = logging.key_features_separator


def _fill_common(event: Any, record: PredictionRecord) -> None:
    event.servedRequest = record.served
    _fill_logging(event.loggingSettings, record.logging)
    event.eventTimeMS = record.event_time_ms
    event.requestId = record.request_id
    _fill_fqrv(event.fqrv, record.fqrv)
    event.latencyMs = record.latency_ms
    event.status = record.status
    if record.error:
        event.error = record.error
        event.errorCode = record.error_code
    event.protocol = record.protocol


def encode_event(record: PredictionRecord) -> bytes:
    """The serialized event: PredictionEventGP for GraphPipe records, else PredictionEvent."""
    if record.is_graphpipe:
        gp = pb.PredictionEventGP()
        _fill_common(gp, record)
        assert record.raw_request is not None
        gp.inferBytes = record.raw_request
        if record.raw_response is not None:
            gp.prediction.inferResponse = record.raw_response
            _fill_fqrv(gp.prediction.fqrv, record.fqrv)
        return gp.SerializeToString()
    event = pb.PredictionEvent()
    _fill_common(event, record)
    # The request and the prediction are assembled as bytes and appended: a parser merges fields
    # in any order, and this skips a protobuf API call per record and tensor.
    payload = event.SerializeToString() + embedded(3, inference_request_bytes(record.request, record.configs))
    if record.response is not None:
        payload += embedded(1, prediction_bytes(record.fqrv, record.response))
    return payload


def decode_event(payload: bytes, graphpipe: bool = False) -> Any:
    """Parse an event written by :func:`encode_event`."""
    message = pb.PredictionEventGP() if graphpipe else pb.PredictionEvent()
    message.ParseFromString(payload)
    return message


def event_to_dict(payload: bytes, graphpipe: bool = False) -> dict[str, Any]:
    """An event as a JSON-ready dict (camelCase, as ``forestflow logs tail`` prints it)."""
    return json_format.MessageToDict(decode_event(payload, graphpipe))


def encode_event_json(record: PredictionRecord) -> bytes:
    """One JSON line ``{"topic", "key", "event"}`` for the local file log (no trailing newline)."""
    event: dict[str, Any] = {}
    if record.is_graphpipe:
        if record.raw_response is not None:
            event["prediction"] = {
                "inferResponse": base64.b64encode(record.raw_response).decode(),
                "fqrv": fqrv_to_json(record.fqrv),
            }
        event["servedRequest"] = record.served
        event["inferBytes"] = base64.b64encode(record.raw_request or b"").decode()
    else:
        if record.response_json is not None:
            event["prediction"] = orjson.Fragment(record.response_json)
        elif record.response is not None:
            event["prediction"] = orjson.Fragment(prediction_json(record.fqrv, record.response))
        event["servedRequest"] = record.served
        if record.request_json is not None:
            event["inferenceRequest"] = orjson.Fragment(record.request_json)
        else:
            event["inferenceRequest"] = orjson.Fragment(request_json(record.request, record.configs))
    event["loggingSettings"] = logging_to_json(record.logging)
    event["eventTimeMS"] = str(record.event_time_ms)
    event["requestId"] = record.request_id
    event["fqrv"] = fqrv_to_json(record.fqrv)
    event["latencyMs"] = record.latency_ms
    event["status"] = record.status
    if record.error:
        event["error"] = record.error
        event["errorCode"] = record.error_code
    event["protocol"] = record.protocol
    line = {"topic": "graphpipe" if record.is_graphpipe else "basic", "key": record.key, "event": event}
    return orjson.dumps(line, option=orjson.OPT_SERIALIZE_NUMPY)
