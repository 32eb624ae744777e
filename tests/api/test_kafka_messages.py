"""What a Kafka request message's headers ask for (no broker needed)."""

from __future__ import annotations

from forestflow.api.kafka_messages import BASIC_JSON, BASIC_PROTOBUF, V2, read_request
from forestflow.core.ids import Contract
from forestflow.errors import InvalidInput


def read(headers: list[tuple[str, bytes]], default_reply: str = "replies"):
    return read_request("requests", 2, 41, headers, default_reply)


def test_contract_and_format_from_headers_matched_without_case() -> None:
    request = read([("Forestflow-Contract", b"acme/demo/1"), ("Content-Type", b"application/x-protobuf")])
    assert (request.contract, request.format, request.error) == (Contract("acme", "demo", 1), BASIC_PROTOBUF, None)
    assert (request.reply_topic, request.request_id) == ("replies", "requests:2:41")
    v2 = read([("forestflow-model", b"acme.demo.1"), ("content-type", b"application/vnd.v2+json; charset=utf-8")])
    assert (v2.contract, v2.format, v2.v2_model) == (Contract("acme", "demo", 1), V2, "acme.demo.1")
    assert read([("forestflow-contract", b"acme/demo/1")]).format == BASIC_JSON


def test_reply_topic_and_request_id_headers() -> None:
    request = read([("forestflow-contract", b"a/b/1"), ("forestflow-reply-topic", b"mine"), ("forestflow-request-id", b"id-1")])
    assert (request.reply_topic, request.request_id) == ("mine", "id-1")
    # An unusable id is replaced by the message's position, never refused.
    assert read([("forestflow-request-id", b"x" * 200)]).request_id == "requests:2:41"
    assert read([("forestflow-request-id", b"\xff\xfe")]).request_id == "requests:2:41"


def test_nowhere_to_answer_is_a_drop_not_an_error() -> None:
    assert read([("forestflow-contract", b"a/b/1")], default_reply="").dropped == "no_reply_topic"
    bad = read([("forestflow-contract", b"a/b/1"), ("forestflow-reply-topic", b"no such/topic")])
    assert (bad.reply_topic, bad.dropped) == (None, "invalid_reply_topic")


def test_header_problems_become_errors_answered_to_the_client() -> None:
    cases = {
        "no contract": [],
        "bad path": [("forestflow-contract", b"acme.demo.1")],
        "bad model": [("forestflow-model", b"acme/demo/1")],
        "bad org": [("forestflow-contract", b"ac me/demo/1")],
        "not utf-8": [("forestflow-contract", b"\xff/demo/1")],
        "content type": [("forestflow-contract", b"a/b/1"), ("content-type", b"text/csv")],
    }
    for name, headers in cases.items():
        request = read(headers)
        assert isinstance(request.error, InvalidInput), name
        assert request.reply_topic == "replies", name
