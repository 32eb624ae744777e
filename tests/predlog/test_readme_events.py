"""The example events of docs/prediction-log.md have exactly the fields the encoders write."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from forestflow.codecs.schema_datum import prediction_json, request_json
from forestflow.core.frame import Frame
from forestflow.predlog.encode import encode_event, encode_event_json, event_to_dict
from forestflow.predlog.record import PredictionRecord, WireBody
from tests.predlog import make_record

PAGE = Path(__file__).resolve().parents[2] / "docs" / "prediction-log.md"


def readme_examples() -> dict[str, dict[str, Any]]:
    """The JSON examples of the page, by protocol."""
    examples = [json.loads(block) for block in re.findall(r"```json\n(.*?)```", PAGE.read_text(), re.S)]
    return {example["event"]["protocol"]: example for example in examples}


def shape(value: Any) -> Any:
    """The field names of a JSON value, recursively (lists by their first element)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__ if isinstance(value, (bool, str)) else "number"


def logged(record: PredictionRecord) -> dict[str, Any]:
    return orjson.loads(encode_event_json(record))


def test_every_kind_of_event_is_documented_with_the_fields_it_has() -> None:
    examples = readme_examples()
    assert set(examples) == {"basic", "v2", "graphpipe"}
    # The examples' layout: a String and a Float64 input, a label and two probabilities out.
    request = Frame.from_columns({"country": ["NL"], "amount": np.array([12.5])})
    answer = Frame.from_columns({"predict": ["0"], "p0": np.array([0.93]), "p1": np.array([0.07])})
    base = dataclasses.replace(make_record(1, {"user": "u42"}), request=request, response=answer)
    basic = dataclasses.replace(
        base, request_json=request_json(base.request, base.configs), response_json=prediction_json(base.fqrv, base.response)
    )
    # V2 bodies are logged as they were sent: the example's own bodies, sent again.
    v2_request, v2_answer = (orjson.dumps(examples["v2"]["event"][k]) for k in ("wireRequest", "wireResponse"))
    v2 = dataclasses.replace(base, protocol="v2", request_json=WireBody.of(v2_request), response_json=WireBody.of(v2_answer))
    gp = dataclasses.replace(make_record(1, {"user": "u42"}, graphpipe=True), request=request, response=answer)
    for protocol, record in (("basic", basic), ("v2", v2), ("graphpipe", gp)):
        documented, written = examples[protocol], logged(record)
        assert shape(documented) == shape(written), protocol
        # On Kafka the same event is the protobuf message, with the same fields (bodies as bytes).
        on_kafka = event_to_dict(encode_event(record), graphpipe=record.is_graphpipe)
        assert set(on_kafka) == set(written["event"]), protocol
