"""BASIC API over real HTTP: deploy, score, errors, routing split, validity, expiration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from forestflow._proto import forestflow_pb2 as pb
from tests.support import InProcessGateway, python_servable, score_body


async def deploy(gw: InProcessGateway, body: dict[str, Any]) -> dict[str, Any]:
    async with gw.session.post(gw.url + "/servable", json=body) as r:
        payload = await r.json()
        assert r.status == 200, payload
        return payload


async def score(gw: InProcessGateway, body: Any, path: str = "/acme/demo/1/score") -> tuple[int, dict[str, Any]]:
    kwargs = {"data": body} if isinstance(body, (str, bytes)) else {"json": body}
    async with gw.session.post(gw.url + path, **kwargs) as r:
        assert r.headers["Content-Type"] == "application/json"
        return r.status, await r.json()


async def score_protobuf(gw: InProcessGateway, request: pb.InferenceRequest) -> tuple[int, bytes]:
    """POST a protobuf InferenceRequest to /score: the status and the body."""
    async with gw.session.post(
        gw.url + "/acme/demo/1/score", data=request.SerializeToString(), headers={"Content-Type": "application/x-protobuf"}
    ) as r:
        return r.status, await r.read()


async def test_deploy_and_score_mixed_batch(gw: InProcessGateway) -> None:
    created = await deploy(gw, python_servable())
    assert created == {
        "ServableCreatedSuccessfully": {
            "fqrv": {"contract": {"organization": "acme", "project": "demo", "contractNumber": 1}, "releaseVersion": "v1"}
        }
    }
    status, body = await score(gw, score_body([1.5, -2.0, 10.0], ["a", "b", "c"]))
    assert status == 200
    prediction = body["Prediction"]
    assert prediction["fqrv"]["releaseVersion"] == "v1"
    assert prediction["schema"] == [{"type": "Float64", "fields": ["double"]}, {"type": "String", "fields": ["echo"]}]
    assert [d["tensors"][0]["Float64"]["data"][0] for d in prediction["datum"]] == [3.0, -4.0, 20.0]
    assert [d["tensors"][1]["String"]["data"][0] for d in prediction["datum"]] == ["a", "b", "c"]


async def test_protobuf_score_body(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable())
    request = pb.InferenceRequest()
    entry = request.schema.add()
    entry.type = pb.Float64
    entry.fields.append("x")
    for x in (1.0, 2.0):
        request.datum.add().tensors.add().Float64.data.append(x)
    status, answer = await score_protobuf(gw, request)
    assert status == 200
    prediction = pb.Prediction.FromString(answer)
    assert [d.tensors[0].Float64.data[0] for d in prediction.datum] == [2.0, 4.0]
    assert prediction.fqrv.release_version == "v1"


async def test_malformed_bodies_are_400_with_a_reason(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable())
    cases: list[tuple[Any, str]] = [
        ("{not json", "not valid JSON"),
        (b"\xff\xfe\x00", "not valid JSON"),
        (
            {"schema": [{"type": "Float99", "fields": ["x"]}], "datum": [{"tensors": [{"Float64": {"data": [1]}}]}]},
            "unknown tensor type",
        ),
        (
            {"schema": [{"type": "Float64", "fields": ["x"]}], "datum": [{"tensors": [{"Float32": {"data": [1]}}]}]},
            "schema has no Float32",
        ),
        (
            {"schema": [{"type": "Float64", "fields": ["x", "y"]}], "datum": [{"tensors": [{"Float64": {"data": [1]}}]}]},
            "1 value(s) for 2",
        ),
        ({"schema": [{"type": "Float64", "fields": ["x"]}], "datum": []}, "at least one record"),
        (
            {"schema": [{"type": "Float64", "fields": ["x"]}], "datum": [{"tensors": [{"Float64": {"data": ["a"]}}]}]},
            "not valid Float64",
        ),
        ({"schema": [{"type": "Float64", "fields": ["x"]}]}, "datum: required"),
        ([1, 2], "expected an InferenceRequest"),
    ]
    for body, reason in cases:
        status, payload = await score(gw, body)
        assert status == 400, (body, payload)
        assert reason in payload["error"], (reason, payload)
        assert payload["code"] == "InvalidInput" and payload["request_id"]
    status, _ = await score(gw, score_body([1.0]))
    assert status == 200  # still serving


async def test_unknown_contract_and_release_are_404(gw: InProcessGateway) -> None:
    status, body = await score(gw, score_body([1.0]), "/nobody/here/7/score")
    assert status == 404
    assert body["UnknownContract"]["contract"] == {"organization": "nobody", "project": "here", "contractNumber": 7}
    await deploy(gw, python_servable())
    async with gw.session.get(gw.url + "/acme/demo/1/v9/metadata") as r:
        assert r.status == 404
        assert (await r.json())["UnknownServable"]["fqrv"]["releaseVersion"] == "v9"
    async with gw.session.get(gw.url + "/no/route/here/at/all/x") as r:
        assert r.status == 404
        assert r.headers["Content-Type"] == "application/json"


async def test_duplicate_is_409_and_bad_definitions_are_400_or_422(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable())
    async with gw.session.post(gw.url + "/servable", json=python_servable()) as r:
        assert r.status == 409
        assert "ServableAlreadyExistsError" in await r.json()
    no_logging = python_servable(release="v2")
    del no_logging["servableSettings"]["loggingSettings"]
    async with gw.session.post(gw.url + "/servable", json=no_logging) as r:
        assert r.status == 400
        assert "loggingSettings: required" in (await r.json())["error"]
    missing_module = python_servable(release="v3", module="nope.py")
    async with gw.session.post(gw.url + "/servable", json=missing_module) as r:
        body = await r.json()
        assert r.status == 422
        assert "not found in the artifact" in body["error"]
    async with gw.session.get(gw.url + "/acme/demo/1/list") as r:
        releases = [e["FQRV"]["releaseVersion"] for e in await r.json()]
    assert releases == ["v1"]  # the failed load left nothing behind


async def test_no_active_servable_is_422_and_never_valid_never_answers(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable(validity=[{"NeverValid": {}}]))
    status, body = await score(gw, score_body([1.0]))
    assert status == 422
    assert "NoActiveServablesForContract" in body
    await deploy(gw, python_servable(release="v2"))
    for _ in range(20):
        status, body = await score(gw, score_body([1.0]))
        assert status == 200 and body["Prediction"]["fqrv"]["releaseVersion"] == "v2"


async def test_phase_in_split_observed_in_stats(gw: InProcessGateway) -> None:
    now = [1_000_000]
    gw.gateway.clock = lambda: now[0]
    keep_two = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"FairPhaseInPctBasedRouter": {}}}
    await deploy(gw, python_servable(contract_settings=keep_two))
    await deploy(gw, python_servable(release="v2", phase_in={"LinearTimeBasedPhaseIn": {"phase_in_over_secs": 100}}))
    now[0] += 30_000  # 30 s into a 100 s linear phase-in: v2 at 30 %, v1 at 100 %
    await gw.gateway.admin.evaluate_all()
    counts = {"v1": 0, "v2": 0}
    for _ in range(1000):
        status, body = await score(gw, score_body([1.0]))
        assert status == 200
        counts[body["Prediction"]["fqrv"]["releaseVersion"]] += 1
    assert abs(counts["v1"] - 769) <= 1 and abs(counts["v2"] - 231) <= 1, counts
    async with gw.session.get(gw.url + "/acme/demo/1/stats") as r:
        stats = {m["ServableMetrics"]["fqrv"]["releaseVersion"]: m["ServableMetrics"] for m in await r.json()}
    assert stats["v2"]["currentPhaseInPct"] == 30
    assert int(stats["v1"]["scoreCount"]) == counts["v1"]
    assert int(stats["v2"]["scoreCount"]) == counts["v2"]


async def test_keep_latest_one_expires_the_older_release(gw: InProcessGateway) -> None:
    await deploy(gw, python_servable())  # default contract settings: KeepLatest(1) + Fair
    await deploy(gw, python_servable(release="v2"))
    async with gw.session.get(gw.url + "/acme/demo/1/releases") as r:
        assert [e["FQRV"]["releaseVersion"] for e in await r.json()] == ["v2"]
    status, body = await score(gw, score_body([2.0]))
    assert status == 200 and body["Prediction"]["fqrv"]["releaseVersion"] == "v2"


async def test_policy_put_moves_traffic_and_delete_removes_contract(gw: InProcessGateway) -> None:
    keep_two = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"LatestPhaseInPctBasedRouter": {}}}
    await deploy(gw, python_servable(contract_settings=keep_two))
    await deploy(gw, python_servable(release="v2", validity=[{"NeverValid": {}}]))
    status, body = await score(gw, score_body([1.0]))
    assert body["Prediction"]["fqrv"]["releaseVersion"] == "v1"
    policy = {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}}
    async with gw.session.put(gw.url + "/acme/demo/1/v2/policy-settings", json=policy) as r:
        assert r.status == 200
        assert (await r.json())["ServableUpdatedSuccessfully"]["fqrv"]["releaseVersion"] == "v2"
    status, body = await score(gw, score_body([1.0]))
    assert body["Prediction"]["fqrv"]["releaseVersion"] == "v2"  # Latest router: newest at 100 % takes all
    async with gw.session.get(gw.url + "/acme/demo/1/v2/settings") as r:
        assert (await r.json())["ServableSettings"]["policySettings"]["validityPolicy"] == [{"ImmediatelyValid": {}}]
    for release in ("v1", "v2"):
        async with gw.session.delete(gw.url + f"/acme/demo/1/{release}") as r:
            assert r.status == 200
    async with gw.session.get(gw.url + "/contracts/list") as r:
        assert (await r.json()) == {"Contracts": {"contracts": []}}
    status, _ = await score(gw, score_body([1.0]))
    assert status == 404


async def test_contract_routes(gw: InProcessGateway) -> None:
    settings = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 3}}, "router": {"FairPhaseInPctBasedRouter": {}}}
    async with gw.session.post(gw.url + "/contract/acme/demo/1", json=settings) as r:
        assert r.status == 200
        assert (await r.json())["ContractCreatedSuccessfully"]["contract"]["contractNumber"] == 1
    async with gw.session.post(gw.url + "/contract/acme/demo/1", json=settings) as r:
        assert r.status == 422 and "ContractValidationError" in await r.json()
    async with gw.session.get(gw.url + "/acme/demo/1/stats") as r:
        assert r.status == 422  # no servables yet, as ForestFlow
    status, body = await score(gw, score_body([1.0]))
    assert status == 422 and "NoActiveServablesForContract" in body
    await deploy(gw, python_servable())
    async with gw.session.get(gw.url + "/acme/demo/1/c-settings") as r:
        assert (await r.json()) == {"ContractSettings": settings}
    latest = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 3}}, "router": {"LatestPhaseInPctBasedRouter": {}}}
    async with gw.session.put(gw.url + "/acme/demo/1", json=latest) as r:
        assert r.status == 200 and "ContractUpdatedSuccessfully" in await r.json()
    async with gw.session.put(gw.url + "/acme/demo/1", json={"router": {"Nope": {}}}) as r:
        assert r.status == 422  # settings that cannot be applied, naming the field
        assert "expirationPolicy: required" in (await r.json())["error"]
    async with gw.session.get(gw.url + "/acme/demo/1/servable-settings") as r:
        [entry] = await r.json()
        assert entry["ServableSettings"]["loggingSettings"]["logLevel"] == "NONE"
    async with gw.session.get(gw.url + "/acme/demo/1/metadata") as r:
        [meta] = await r.json()
        assert [i["name"] for i in meta["BasicMetaData"]["inputs"]] == ["x", "label"]
        assert [o["type"] for o in meta["BasicMetaData"]["outputs"]] == ["Float64", "String"]


async def test_contracts_named_in_paths_are_cached_within_a_bound(gw: InProcessGateway) -> None:
    from forestflow.api import common, v2_common

    await deploy(gw, python_servable())
    body = score_body([1.0], ["a"])
    # A bad name answers 400 every time: it is never cached as a contract.
    for _ in range(2):
        status, payload = await score(gw, body, "/ac.me/demo/1/score")
        assert status == 400, payload
    assert not any(key[0] == "ac.me" for key in common._PATH_CONTRACTS)
    # Unknown contracts are 404 each; however many, the cache stays within its bound.
    for n in range(common.MAX_CACHED_CONTRACTS + 5):
        status, _ = await score(gw, body, f"/acme/other/{n}/score")
        assert status == 404
    assert 0 < len(common._PATH_CONTRACTS) <= common.MAX_CACHED_CONTRACTS
    # The deployed contract still scores after the cache was emptied and refilled.
    status, payload = await score(gw, body, "/acme/demo/1/score")
    assert status == 200 and payload["Prediction"]["fqrv"]["releaseVersion"] == "v1"
    async with gw.session.post(gw.url + "/v2/models/acme.demo.1/infer", json={"inputs": []}) as r:
        assert r.status != 404
    assert v2_common._MODEL_CONTRACTS.get("acme.demo.1") is not None


async def test_values_a_declared_type_cannot_hold_are_400_naming_the_field(gw: InProcessGateway) -> None:
    """JSON (the C reader declines these, the Python path answers) and protobuf; each value used to be
    changed silently: 1.5 -> 1, -1.9 -> -1, 1e39 -> inf, 70000 -> inf."""
    await deploy(gw, python_servable())
    cases = [
        ("Int64", 1.5, "field 'n': Int64 data must be integers"),
        ("Int8", -1.9, "field 'n': Int8 data must be integers"),
        ("Int8", 300, "field 'n': value out of range for Int8"),
        ("Int16", "70000", "field 'n': value out of range for Int16"),
        ("Float32", 1e39, "field 'n': value out of range for Float32"),
        ("Float16", 70000, "field 'n': value out of range for Float16"),
    ]
    for ff_type, value, message in cases:
        body = {
            "schema": [{"type": "Float64", "fields": ["x"]}, {"type": ff_type, "fields": ["n"]}],
            "datum": [{"tensors": [{"Float64": {"data": [1.0]}}, {ff_type: {"data": [value]}}]}],
        }
        status, payload = await score(gw, body)
        assert status == 400, (ff_type, value, payload)
        assert message in payload["error"], payload
    request = pb.InferenceRequest()
    request.schema.add(type=pb.TensorType.Value("Int8"), fields=["n"])
    request.datum.add().tensors.add().Int8.data.append(300)
    status, answer = await score_protobuf(gw, request)
    assert status == 400 and "field 'n': value out of range for Int8" in orjson.loads(answer)["error"], answer
    fine = {"schema": [{"type": "Int8", "fields": ["n"]}], "datum": [{"tensors": [{"Int8": {"data": [-128]}}]}]}
    assert (await score(gw, fine))[0] == 200


async def test_uint64_answers_past_int64_read_back_exactly_in_protobuf_and_json(gw: InProcessGateway) -> None:
    """They were written as negative Int64 in the protobuf answer (and the Kafka event)."""
    await deploy(gw, python_servable(directory=Path(__file__).with_name("servables"), module="uint64.py"))
    request = pb.InferenceRequest()
    request.schema.add(type=pb.Float64, fields=["x"])
    for x in (0.0, 7.0):
        request.datum.add().tensors.add().Float64.data.append(x)
    status, answer = await score_protobuf(gw, request)
    assert status == 200
    prediction = pb.Prediction.FromString(answer)
    assert [(e.type, list(e.fields)) for e in prediction.schema] == [(pb.String, ["big"]), (pb.Int64, ["fits"])]
    assert [(d.tensors[0].String.data[0], d.tensors[1].Int64.data[0]) for d in prediction.datum] == [
        (str(2**64 - 1), 0),
        (str(2**64 - 8), 7),
    ]
    status, payload = await score(
        gw, {"schema": [{"type": "Float64", "fields": ["x"]}], "datum": [{"tensors": [{"Float64": {"data": [7]}}]}]}
    )
    assert status == 200 and payload["Prediction"]["datum"][0]["tensors"][0] == {"String": {"data": [str(2**64 - 8)]}}, payload
