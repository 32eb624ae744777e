"""V2 prediction events carry the request and the answer as they were on the wire; readers convert.

Through a real gateway (HTTP and gRPC servers, Python test servable, FULL logging to the local
JSON-lines file) and a real broker for the Kafka topic and ``logs tail``.
"""

from __future__ import annotations

import argparse
import base64
import io
import struct
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson

from forestflow._proto import forestflow_pb2 as pb
from forestflow._proto.grpc_predict_v2 import SERVICE, messages
from forestflow.codecs.schema_datum import frame_from_json
from forestflow.predlog.convert import to_forestflow
from forestflow.predlog.encode import encode_event, encode_event_json, event_to_dict
from forestflow.predlog.file_tail import tail_file
from forestflow.predlog.log import LogEntry
from forestflow.predlog.record import PredictionRecord, WireBody
from forestflow.predlog.tail import add_tail_arguments, run_tail, tail
from tests.api.v2_support import v2_gateway
from tests.kafka_broker import KafkaBroker
from tests.predlog import kafka_sink, make_record
from tests.support import python_servable

MODEL = "acme.demo.1"
INFER = f"/v2/models/{MODEL}/infer"
M = messages()


def _columns(inference_request: dict[str, Any]) -> dict[str, list[Any]]:
    frame, _ = frame_from_json(inference_request)
    return {name: np.asarray(frame.columns[name]).tolist() for name in frame.columns}


def _datum_by_name(prediction: dict[str, Any]) -> dict[str, list[Any]]:
    """Prediction datum values per output name, whatever the order of the type groups."""
    out: dict[str, list[Any]] = {}
    for row in prediction["datum"]:
        for group, tensor in zip(prediction["schema"], row["tensors"], strict=True):
            values = next(iter(tensor.values()))["data"]
            for name, value in zip(group["fields"], values, strict=True):
                out.setdefault(name, []).append(value)
    return out


async def test_v2_events_are_logged_as_sent_and_converted_to_forestflow_shape(tmp_path: Path) -> None:
    async with v2_gateway(tmp_path / "data") as gw:
        await gw.deploy(python_servable(log_level="FULL"))
        # REST, JSON, written over several lines: logged as that document, on one line.
        rest_doc = {
            "id": "rest-json",
            "parameters": {"reqid": "rest-json"},
            "inputs": [
                {"name": "x", "shape": [2], "datatype": "FP64", "data": [1.5, 2.0]},
                {"name": "label", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]},
            ],
        }
        rest_body = orjson.dumps(rest_doc, option=orjson.OPT_INDENT_2)
        assert b"\n" in rest_body
        async with gw.server.session.post(gw.url + INFER, data=rest_body) as r:
            assert r.status == 200
            rest_answer = await r.json()
        # REST with binary tensors in and out: logged byte for byte with the JSON header's length.
        x = np.array([0.5, -1.0, 3.0], dtype="<f8").tobytes()
        labels = b"".join(struct.pack("<I", len(b)) + b for b in (b"one", b"two", b"three"))
        head = orjson.dumps(
            {
                "id": "rest-binary",
                "parameters": {"reqid": "rest-binary", "binary_data_output": True},
                "inputs": [
                    {"name": "x", "shape": [3], "datatype": "FP64", "parameters": {"binary_data_size": len(x)}},
                    {"name": "label", "shape": [3], "datatype": "BYTES", "parameters": {"binary_data_size": len(labels)}},
                ],
            }
        )
        headers = {"Inference-Header-Content-Length": str(len(head))}
        async with gw.server.session.post(gw.url + INFER, data=head + x + labels, headers=headers) as r:
            assert r.status == 200
            binary_answer, binary_answer_json = await r.read(), int(r.headers["Inference-Header-Content-Length"])
        # gRPC: the serialized ModelInferRequest and ModelInferResponse.
        request = M["ModelInferRequest"](model_name=MODEL, id="grpc")
        request.parameters["reqid"].string_param = "grpc"
        request.inputs.add(name="x", datatype="FP64", shape=[2])
        request.inputs.add(name="label", datatype="BYTES", shape=[2])
        request.raw_input_contents.append(np.array([1.5, 2.0], dtype="<f8").tobytes())
        request.raw_input_contents.append(b"".join(struct.pack("<I", 1) + b for b in (b"a", b"b")))
        grpc_request = request.SerializeToString()
        async with grpc.aio.insecure_channel(gw.grpc_target) as channel:
            call = channel.unary_unary(f"/{SERVICE}/ModelInfer", request_serializer=bytes, response_deserializer=bytes)
            grpc_answer = await call(grpc_request)
        # BASIC /score with the same rows as the JSON and gRPC requests: ForestFlow's event, as before.
        score = {
            "schema": [{"type": "Float64", "fields": ["x"]}, {"type": "String", "fields": ["label"]}],
            "datum": [{"tensors": [{"Float64": {"data": [v]}}, {"String": {"data": [s]}}]} for v, s in ((1.5, "a"), (2.0, "b"))],
            "configs": {"reqid": "score"},
        }
        async with gw.server.session.post(gw.url + "/acme/demo/1/score", json=score) as r:
            assert r.status == 200
    log = tmp_path / "data" / "predictions.jsonl"
    lines = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    assert len(lines) == 4  # one line per event, the multi-line body included
    events = {line["key"]: line["event"] for line in lines}
    assert {line["topic"] for line in lines} == {"basic"}

    rest = events["rest-json"]
    assert (rest["protocol"], rest["wireRequest"], rest["wireResponse"]) == ("v2", rest_doc, rest_answer)
    assert "inferenceRequest" not in rest and "prediction" not in rest and "wireRequestJsonLength" not in rest

    binary = events["rest-binary"]
    assert base64.b64decode(binary["wireRequest"]) == head + x + labels
    assert binary["wireRequestJsonLength"] == len(head)
    assert base64.b64decode(binary["wireResponse"]) == binary_answer
    assert binary["wireResponseJsonLength"] == binary_answer_json

    over_grpc = events["grpc"]
    assert over_grpc["protocol"] == "v2-grpc"
    assert base64.b64decode(over_grpc["wireRequest"]) == grpc_request
    assert base64.b64decode(over_grpc["wireResponse"]) == grpc_answer

    basic = events["score"]
    assert basic["protocol"] == "basic" and "wireRequest" not in basic and basic["inferenceRequest"] == score

    # logs tail --file ... --format forestflow: V2 events in ForestFlow's shape, BASIC untouched.
    out = io.StringIO()
    assert tail_file(log, "jsonl", out, convert=True) == 4
    # Each printed line is the event with the record's key, topic and offset beside its fields.
    printed = [orjson.loads(line) for line in out.getvalue().splitlines()]
    converted = {line["key"]: {k: v for k, v in line.items() if k not in ("key", "topic", "offset")} for line in printed}
    assert converted["score"] == basic
    for key in ("rest-json", "grpc"):
        event = converted[key]
        assert not any(name.startswith("wire") for name in event) and "conversionError" not in event
        assert event["inferenceRequest"]["configs"] == {"reqid": key}
        assert _columns(event["inferenceRequest"]) == _columns(score) == {"x": [1.5, 2.0], "label": ["a", "b"]}
        assert event["prediction"]["fqrv"] == basic["prediction"]["fqrv"]
        assert _datum_by_name(event["prediction"]) == _datum_by_name(basic["prediction"])
        assert {k: v for k, v in event.items() if k not in ("inferenceRequest", "prediction")} == {
            k: v for k, v in events[key].items() if not k.startswith("wire")
        }
    event = converted["rest-binary"]
    assert _columns(event["inferenceRequest"]) == {"x": [0.5, -1.0, 3.0], "label": ["one", "two", "three"]}
    assert _datum_by_name(event["prediction"])["double"] == [1.0, -2.0, 6.0]


def _wire_record(i: int, request: bytes, response: bytes | None, **kw: Any) -> PredictionRecord:
    record = make_record(i, {"user": f"u{i}"})
    record.protocol = "v2"
    record.request_json = WireBody.of(request, kw.get("request_json_length"))
    record.response_json = WireBody.of(response, kw.get("response_json_length")) if response is not None else None
    if response is None:
        record.status, record.error, record.error_code, record.response = 504, "deadline exceeded", "DeadlineExceeded", None
    return record


REQUEST = orjson.dumps(
    {"parameters": {"user": "u1"}, "inputs": [{"name": "x", "shape": [2], "datatype": "FP64", "data": [1.0, 2.0]}]}
)
RESPONSE = orjson.dumps(
    {
        "model_name": "a.b.1",
        "model_version": "r",
        "id": "req-1",
        "outputs": [{"name": "y", "shape": [2], "datatype": "FP64", "data": [2.0, 4.0]}],
    }
)


def test_protobuf_wire_event_carries_the_bytes_and_no_forestflow_copy() -> None:
    record = _wire_record(1, REQUEST, RESPONSE)
    message = pb.PredictionEvent.FromString(encode_event(record))
    assert (message.wireRequest, message.wireResponse, message.protocol) == (REQUEST, RESPONSE, "v2")
    assert not message.HasField("inferenceRequest") and not message.HasField("prediction")
    assert not message.HasField("wireRequestJsonLength") and message.requestId == "req-1"
    # The JSON line holds the same fields, the JSON bodies as documents instead of base64.
    line = orjson.loads(encode_event_json(record))["event"]
    mapped = event_to_dict(encode_event(record))
    assert line["wireRequest"] == orjson.loads(REQUEST) and line["wireResponse"] == orjson.loads(RESPONSE)
    assert {k: v for k, v in line.items() if not k.startswith("wire")} == {
        k: v for k, v in mapped.items() if not k.startswith("wire")
    }
    # A failed V2 prediction: the request, the status and the error, no answer.
    failed = pb.PredictionEvent.FromString(encode_event(_wire_record(2, REQUEST, None)))
    assert failed.wireRequest == REQUEST and not failed.HasField("wireResponse") and failed.status == 504
    assert to_forestflow(event_to_dict(encode_event(_wire_record(2, REQUEST, None))))["inferenceRequest"]["configs"] == {
        "user": "u1"
    }


def test_undecodable_wire_body_is_reported_not_raised() -> None:
    event = event_to_dict(encode_event(_wire_record(3, b"{not json", RESPONSE)))
    converted = to_forestflow(event)
    assert converted["wireRequest"] == event["wireRequest"] and "JSONDecodeError" in converted["conversionError"]


async def test_tail_format_forestflow_converts_v2_events_from_the_topic(broker: KafkaBroker, topic: str) -> None:
    records = [_wire_record(1, REQUEST, RESPONSE), make_record(2, {"user": "u2"})]
    sink = kafka_sink(broker.bootstrap, topic)
    await sink.start()
    try:
        entries = [LogEntry(False, r.key.encode() if r.key else None, encode_event(r)) for r in records]
        assert await sink.send(entries) == []
    finally:
        await sink.close()
    logged, converted = io.StringIO(), io.StringIO()
    assert await tail(broker.bootstrap, topic, True, None, logged, max_events=2, idle_timeout_s=10) == 2
    assert await tail(broker.bootstrap, topic, True, None, converted, max_events=2, idle_timeout_s=10, fmt="forestflow") == 2
    as_logged = {d["requestId"]: d for d in map(orjson.loads, logged.getvalue().splitlines())}
    as_forestflow = {d["requestId"]: d for d in map(orjson.loads, converted.getvalue().splitlines())}
    assert base64.b64decode(as_logged["req-1"]["wireRequest"]) == REQUEST
    wire = as_forestflow["req-1"]
    assert "wireRequest" not in wire and wire["inferenceRequest"]["configs"] == {"user": "u1"}
    assert _columns(wire["inferenceRequest"]) == {"x": [1.0, 2.0]}
    assert _datum_by_name(wire["prediction"]) == {"y": [2.0, 4.0]}
    assert wire["prediction"]["fqrv"] == as_logged["req-1"]["fqrv"]
    assert as_forestflow["req-2"] == as_logged["req-2"]  # a BASIC event is printed as it is


def test_logs_tail_file_cli_converts_and_survives_a_cut_line(tmp_path: Path, capsys: Any) -> None:
    log = tmp_path / "predictions.jsonl"
    # A line a crash cut short, which the next event written after a restart then ends.
    cut = b'{"topic": "basic", "ke' + encode_event_json(_wire_record(2, REQUEST, RESPONSE))
    log.write_bytes(encode_event_json(_wire_record(1, REQUEST, RESPONSE)) + b"\n" + cut + b"\n")
    parser = argparse.ArgumentParser()
    add_tail_arguments(parser)
    assert run_tail(parser.parse_args(["--file", str(log), "--format", "forestflow"])) == 0
    printed = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    (broken,) = [p for p in printed if "error" in p]  # the reader orders events by time; a broken line has none
    (first,) = [p for p in printed if "error" not in p]
    assert first["key"] == "u1" and first["inferenceRequest"]["configs"] == {"user": "u1"}
    assert "not a prediction event" in broken["error"]
    assert run_tail(parser.parse_args(["--file", str(tmp_path / "absent.jsonl")])) == 1
