"""Answered: the configs an answer's log key is made of, kept without a dict per answer, and its shared form."""

from __future__ import annotations

import orjson

from forestflow.core.ids import FQRV, Contract
from forestflow.registry.answers import Answered

FQ = FQRV(Contract("acme", "demo", 1), "v1")


def test_key_configs_are_the_request_configs_of_the_key_features() -> None:
    configs = {"user": "u1", "region": "eu", "other": "x"}
    one = Answered.of(FQ, ("user",), configs, 5)
    assert one.key_values is configs["user"]  # the request's own str: nothing allocated per answer
    assert one.key_configs == {"user": "u1"}
    assert Answered.of(FQ, ("user", "session", "region"), configs, 5).key_configs == {"user": "u1", "region": "eu"}
    assert Answered.of(FQ, ("session",), configs, 5).key_configs == {}
    assert Answered.of(FQ, (), configs, 5).key_configs == {}  # a release that logs nothing


def test_the_shared_form_is_the_configs_dict_and_reads_back() -> None:
    answered = Answered.of(FQ, ("user", "session", "region"), {"user": "u1", "region": "eu"}, 7, pinned=True)
    raw = answered.to_bytes("req-1")
    assert orjson.loads(raw) == ["req-1", "acme.demo.1", "v1", {"user": "u1", "region": "eu"}, 7, True]
    back = Answered.from_bytes(raw, with_id=True)
    assert (back.fqrv, back.key_configs, back.at_ms, back.pinned) == (FQ, {"user": "u1", "region": "eu"}, 7, True)
    single = Answered.from_bytes(Answered.of(FQ, ("user",), {"user": "u2"}, 8).to_bytes())
    assert (single.key_values, single.key_configs) == ("u2", {"user": "u2"})
    assert Answered.from_bytes(Answered.of(FQ, (), {}, 9).to_bytes()).key_configs == {}
