"""V2 REST over real HTTP: health, metadata, JSON and binary inference, gzip, and bad input."""

from __future__ import annotations

import gzip
import struct
from typing import Any

import numpy as np
import orjson
import pytest

from forestflow.codecs import _ffjson
from tests.support import InProcessGateway, python_servable

MODEL = "acme.demo.1"
INFER = f"/v2/models/{MODEL}/infer"
KEEP_TWO = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"LatestPhaseInPctBasedRouter": {}}}


def json_inputs(xs: list[float], labels: list[str]) -> list[dict[str, Any]]:
    return [
        {"name": "x", "shape": [len(xs)], "datatype": "FP64", "data": xs},
        {"name": "label", "shape": [len(labels)], "datatype": "BYTES", "data": labels},
    ]


def bytes_blob(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def split_binary(body: bytes, header_length: int) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The JSON part of a binary response and each binary output's bytes."""
    head = orjson.loads(body[:header_length])
    blobs, offset = {}, header_length
    for out in head["outputs"]:
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            blobs[out["name"]] = body[offset : offset + size]
            offset += size
    assert offset == len(body)
    return head, blobs


async def deploy(gw: InProcessGateway, **kw: Any) -> None:
    async with gw.session.post(gw.url + "/servable", json=python_servable(**kw)) as r:
        assert r.status == 200, await r.text()


async def test_health_and_server_metadata(gw: InProcessGateway) -> None:
    for path, body in (("/v2/health/live", {"live": True}), ("/v2/health/ready", {"ready": True})):
        async with gw.session.get(gw.url + path) as r:
            assert r.status == 200
            assert r.headers["Content-Type"] == "application/json"
            assert await r.json() == body
    for path in ("/v2", "/v2/"):
        async with gw.session.get(gw.url + path) as r:
            meta = await r.json()
            assert r.status == 200 and meta["name"] == "forestflow"
            assert "binary_tensor_data" in meta["extensions"] and meta["version"]


async def test_model_metadata_and_readiness(gw: InProcessGateway) -> None:
    await deploy(gw, contract_settings=KEEP_TWO)
    await deploy(gw, release="v2")
    for path in (f"/v2/models/{MODEL}", f"/v2/models/{MODEL}/versions/v1"):
        async with gw.session.get(gw.url + path) as r:
            meta = await r.json()
        assert r.status == 200
        assert meta["name"] == MODEL and meta["platform"] == "python" and sorted(meta["versions"]) == ["v1", "v2"]
        assert meta["inputs"] == [
            {"name": "x", "datatype": "FP64", "shape": [-1]},
            {"name": "label", "datatype": "BYTES", "shape": [-1]},
        ]
        assert [o["name"] for o in meta["outputs"]] == ["double", "echo"]
    async with gw.session.get(gw.url + f"/v2/models/{MODEL}/ready") as r:
        assert (r.status, await r.json()) == (200, {"name": MODEL, "ready": True})
    async with gw.session.get(gw.url + f"/v2/models/{MODEL}/versions/v2/ready") as r:
        assert r.status == 200
    for path in (
        "/v2/models/acme.demo.9",
        "/v2/models/acme.demo.9/ready",
        "/v2/models/not-a-contract",
        f"/v2/models/{MODEL}/versions/v7",
        f"/v2/models/{MODEL}/versions/v7/ready",
    ):
        async with gw.session.get(gw.url + path) as r:
            assert r.status == 404, path
            assert r.headers["Content-Type"] == "application/json"
            body = await r.json()
            assert list(body) == ["error"] and body["error"], path


async def test_json_inference_echoes_id_and_names_the_model(gw: InProcessGateway) -> None:
    await deploy(gw)
    payload = {"id": "my-42", "inputs": json_inputs([1.0, 2.5], ["a", "ß"]), "unknown_field": 1}
    async with gw.session.post(gw.url + INFER, json=payload) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "application/json"
        body = await r.json()
    assert body["id"] == "my-42" and body["model_name"] == MODEL and body["model_version"] == "v1"
    assert body["outputs"] == [
        {"name": "double", "datatype": "FP64", "shape": [2], "data": [2.0, 5.0]},
        {"name": "echo", "datatype": "BYTES", "shape": [2], "data": ["a", "ß"]},
    ]
    # Nested data, a requested subset, a version in the path; no id: the gateway's request id.
    payload = {
        "inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "data": [[1.0], [4.0]]}],
        "outputs": [{"name": "double"}],
    }
    async with gw.session.post(gw.url + f"/v2/models/{MODEL}/versions/v1/infer", json=payload) as r:
        body = await r.json()
        assert r.status == 200 and body["id"] == r.headers["X-Request-Id"]
    assert body["outputs"] == [{"name": "double", "datatype": "FP64", "shape": [2, 1], "data": [2.0, 8.0]}]


async def test_plain_requests_are_answered_as_the_general_path_answers_them(gw: InProcessGateway) -> None:
    """A plain request (read straight into columns, answered without Tensor objects) gets the very
    bytes the general path gives the same request made general by an empty ``outputs`` list."""
    await deploy(gw)
    for rows in (1, 3):
        xs, labels = [0.5 + i for i in range(rows)], [f"l{i}\u00e9" for i in range(rows)]
        plain: dict[str, Any] = {"id": "q", "inputs": json_inputs(xs, labels), "parameters": {"reqid": "a", "n": 2}}
        answers = []
        for body in (plain, {**plain, "outputs": []}):
            async with gw.session.post(gw.url + INFER, data=orjson.dumps(body)) as r:
                assert r.status == 200, await r.text()
                answers.append((await r.read(), r.headers["Content-Type"]))
        assert answers[0] == answers[1]
        assert orjson.loads(answers[0][0])["outputs"][0]["data"] == [2 * x for x in xs]
        assert _ffjson.v2_columns(orjson.dumps(plain)) is not None  # the plain reader takes the first
        assert _ffjson.v2_columns(orjson.dumps({**plain, "outputs": []})) is None  # and leaves the second


async def test_version_path_scores_that_release(gw: InProcessGateway) -> None:
    await deploy(gw, contract_settings=KEEP_TWO)
    await deploy(gw, release="v2", validity=[{"NeverValid": {}}])
    async with gw.session.post(gw.url + INFER, json={"inputs": json_inputs([1.0], ["a"])}) as r:
        assert (await r.json())["model_version"] == "v1"  # routed: v2 never becomes valid
    for version in ("v1", "v2"):
        async with gw.session.post(
            gw.url + f"/v2/models/{MODEL}/versions/{version}/infer", json={"inputs": json_inputs([1.0], ["a"])}
        ) as r:
            assert r.status == 200 and (await r.json())["model_version"] == version
    async with gw.session.post(gw.url + f"/v2/models/{MODEL}/versions/v9/infer", json={"inputs": json_inputs([1.0], ["a"])}) as r:
        assert r.status == 404 and "v9" in (await r.json())["error"]


async def test_binary_inputs_and_outputs(gw: InProcessGateway) -> None:
    await deploy(gw)
    x = np.array([0.5, -1.0, 3.0], dtype=np.float64).tobytes()
    labels = bytes_blob([b"one", b"\xff\xfe", b"three"])  # the second is not UTF-8: must come back binary
    head = orjson.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [3], "datatype": "FP64", "parameters": {"binary_data_size": len(x)}},
                {"name": "label", "shape": [3, 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(labels)}},
            ],
            "outputs": [
                {"name": "double", "parameters": {"binary_data": True}},
                {"name": "echo", "parameters": {"binary_data": False}},
            ],
        }
    )
    headers = {"Inference-Header-Content-Length": str(len(head))}
    async with gw.session.post(gw.url + INFER, data=head + x + labels, headers=headers, skip_auto_headers=["Content-Type"]) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"] == "application/octet-stream"
        body = await r.read()
        reply, blobs = split_binary(body, int(r.headers["Inference-Header-Content-Length"]))
    assert [o["shape"] for o in reply["outputs"]] == [[3, 1], [3, 1]]
    assert np.frombuffer(blobs["double"], dtype="<f8").tolist() == [1.0, -2.0, 6.0]
    assert blobs["echo"] == labels  # asked for JSON, but non-UTF-8 bytes can only go binary

    # binary_data_output asks for every output in binary unless one says otherwise.
    payload = {
        "parameters": {"binary_data_output": True},
        "inputs": json_inputs([2.0], ["ok"]),
        "outputs": [{"name": "double"}, {"name": "echo", "parameters": {"binary_data": False}}],
    }
    async with gw.session.post(gw.url + INFER, json=payload) as r:
        reply, blobs = split_binary(await r.read(), int(r.headers["Inference-Header-Content-Length"]))
    assert np.frombuffer(blobs["double"], dtype="<f8").tolist() == [4.0]
    assert reply["outputs"][1]["data"] == ["ok"]


async def test_gzip_request_and_response(gw: InProcessGateway) -> None:
    await deploy(gw)
    n = 300
    raw = orjson.dumps({"inputs": json_inputs([float(i) for i in range(n)], [f"row{i}" for i in range(n)])})
    headers = {"Content-Encoding": "gzip", "Accept-Encoding": "gzip"}
    async with gw.session.post(gw.url + INFER, data=gzip.compress(raw), headers=headers, skip_auto_headers=["Content-Type"]) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Encoding"] == "gzip"
        body = await r.json()  # aiohttp inflates it
    assert body["outputs"][0]["data"] == [2.0 * i for i in range(n)]
    async with gw.session.post(gw.url + INFER, data=raw, headers={"Accept-Encoding": "identity"}) as r:
        assert r.status == 200 and "Content-Encoding" not in r.headers


BAD_REQUESTS: list[tuple[str, Any, str]] = [
    ("not json", b"{nope", "not valid JSON"),
    ("not an object", b"[1, 2]", "body"),
    ("no inputs", {"inputs": []}, "inputs"),
    ("unknown datatype", {"inputs": [{"name": "x", "shape": [1], "datatype": "FP99", "data": [1]}]}, "'x'"),
    ("length mismatch", {"inputs": [{"name": "x", "shape": [3], "datatype": "FP64", "data": [1, 2]}]}, "'x'"),
    ("ragged", {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP64", "data": [[1, 2], [3]]}]}, "'x'"),
    ("strings as numbers", {"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": ["a"]}]}, "'x'"),
    ("fraction as int", {"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [1.5]}]}, "'x'"),
    ("numbers as BYTES", {"inputs": [{"name": "label", "shape": [1], "datatype": "BYTES", "data": [3]}]}, "'label'"),
    ("negative shape", {"inputs": [{"name": "x", "shape": [-1], "datatype": "FP64", "data": [1]}]}, "'x'"),
    (
        "two values per row",
        {
            "inputs": [
                {"name": "x", "shape": [2, 2], "datatype": "FP64", "data": [1, 2, 3, 4]},
                {"name": "label", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]},
            ]
        },
        "'x'",
    ),
    ("rows disagree", {"inputs": json_inputs([1.0, 2.0], ["a"])}, "rows"),
    ("no data", {"inputs": [{"name": "x", "shape": [1], "datatype": "FP64"}]}, "'x'"),
    (
        "missing binary",
        {"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "parameters": {"binary_data_size": 8}}]},
        "'x'",
    ),
    ("unknown output", {"inputs": json_inputs([1.0], ["a"]), "outputs": [{"name": "nope"}]}, "nope"),
    (
        "bad binary_data",
        {"inputs": json_inputs([1.0], ["a"]), "outputs": [{"name": "echo", "parameters": {"binary_data": "yes"}}]},
        "'echo'",
    ),
    ("bad content_type", {"parameters": {"content_type": "xml"}, "inputs": json_inputs([1.0], ["a"])}, "content_type"),
    (
        "shape product overflows",  # was a 500 with a traceback (numpy: array is too big)
        {"inputs": [{"name": "x", "shape": [1, 2**62, 2**62, 0], "datatype": "FP64", "data": []}]},
        "input 'x': shape [1, 4611686018427387904, 4611686018427387904, 0] is larger than any tensor can be",
    ),
    (
        "binary shape product overflows",
        b'{"inputs": [{"name": "x", "shape": [2, 4611686018427387904, 4, 0], "datatype": "FP32",'
        b' "parameters": {"binary_data_size": 0}}]}',
        "'x': shape",
    ),
]


@pytest.mark.parametrize(("case", "payload", "mentions"), BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
async def test_bad_input_is_a_400_naming_it(gw: InProcessGateway, case: str, payload: Any, mentions: str) -> None:
    await deploy(gw)
    data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    async with gw.session.post(gw.url + INFER, data=data) as r:
        assert r.status == 400, await r.text()
        assert r.headers["Content-Type"] == "application/json"
        body = await r.json()
    assert list(body) == ["error"] and mentions in body["error"]
    async with gw.session.post(gw.url + INFER, json={"inputs": json_inputs([1.0], ["a"])}) as r:
        assert r.status == 200  # still serving


async def test_bad_binary_framing(gw: InProcessGateway) -> None:
    await deploy(gw)
    head = orjson.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "parameters": {"binary_data_size": 8}}]})
    cases = [
        ({"Inference-Header-Content-Length": "999"}, head + bytes(8), "Inference-Header-Content-Length"),
        ({"Inference-Header-Content-Length": "abc"}, head + bytes(8), "Inference-Header-Content-Length"),
        ({"Inference-Header-Content-Length": str(len(head))}, head + bytes(12), "after the last binary input"),
        ({"Inference-Header-Content-Length": str(len(head))}, head + bytes(4), "'x'"),
    ]
    for headers, body, mentions in cases:
        async with gw.session.post(gw.url + INFER, data=body, headers=headers) as r:
            assert r.status == 400
            assert mentions in (await r.json())["error"]


async def test_unknown_model_is_404_and_forestflow_routes_still_work(gw: InProcessGateway) -> None:
    await deploy(gw)
    for model in ("acme.demo.2", "no-dots", "v2"):
        async with gw.session.post(gw.url + f"/v2/models/{model}/infer", json={"inputs": json_inputs([1.0], ["a"])}) as r:
            assert r.status == 404 and model in (await r.json())["error"]
    score = {"schema": [{"type": "Float64", "fields": ["x"]}], "datum": [{"tensors": [{"Float64": {"data": [2.0]}}]}]}
    async with gw.session.post(gw.url + "/acme/demo/1/score", json=score) as r:
        assert r.status == 200 and "Prediction" in await r.json()
    # /{org}/{project}/{n} with org "v2" and project "models" still belongs to ForestFlow's routes.
    async with gw.session.post(gw.url + "/v2/models/1/score", json=score) as r:
        assert r.status == 404 and "UnknownContract" in await r.json()


async def test_v2_and_v1_are_routed_shadowed_and_logged_like_score(tmp_path: Any) -> None:
    from tests.support import serve_in_process

    async with serve_in_process(tmp_path / "data", access_log=False) as gw:
        await deploy(gw, release="live", log_level="FULL", contract_settings=KEEP_TWO)
        await deploy(gw, release="cand", log_level="FULL", validity=[{"NeverValid": {}}])
        for i in range(3):
            payload = {"parameters": {"reqid": f"v2-{i}"}, "inputs": json_inputs([1.0], ["a"])}
            async with gw.session.post(gw.url + INFER, json=payload) as r:
                assert (await r.json())["model_version"] == "live"
        async with gw.session.post(
            gw.url + "/v1/models/acme.demo.1:predict",
            json={"parameters": {"reqid": "v1-0"}, "instances": [{"x": 2.0, "label": "b"}]},
        ) as r:
            assert r.status == 200
        # A version in the path answers from that release only: no shadow copy.
        async with gw.session.post(
            gw.url + f"/v2/models/{MODEL}/versions/cand/infer",
            json={"parameters": {"reqid": "direct"}, "inputs": json_inputs([1.0], ["a"])},
        ) as r:
            assert (await r.json())["model_version"] == "cand"
        async with gw.session.get(gw.url + "/acme/demo/1/stats") as r:
            stats = {m["ServableMetrics"]["fqrv"]["releaseVersion"]: m["ServableMetrics"] for m in await r.json()}
        assert (int(stats["live"]["scoreCount"]), int(stats["live"]["shadeCount"])) == (4, 0)
        assert (int(stats["cand"]["scoreCount"]), int(stats["cand"]["shadeCount"])) == (1, 4)
    log = tmp_path / "data" / "predictions.jsonl"
    events = [orjson.loads(line)["event"] for line in log.read_bytes().splitlines() if line.strip()]

    # V2 events carry the request as it was sent (wireRequest); V1 ones ForestFlow's InferenceRequest.
    def reqid(e: dict[str, Any]) -> str:
        return e["wireRequest"]["parameters"]["reqid"] if e["protocol"] == "v2" else e["inferenceRequest"]["configs"]["reqid"]

    seen = sorted((e["fqrv"]["releaseVersion"], bool(e.get("servedRequest")), reqid(e), e["protocol"]) for e in events)
    expected = [("cand", False, f"v2-{i}", "v2") for i in range(3)] + [
        ("cand", False, "v1-0", "v1"),
        ("cand", True, "direct", "v2"),
    ]
    expected += [("live", True, f"v2-{i}", "v2") for i in range(3)] + [("live", True, "v1-0", "v1")]
    assert seen == sorted(expected)


async def test_body_over_the_limit_is_a_413_in_v2_form(tmp_path: Any) -> None:
    from tests.support import serve_in_process

    async with serve_in_process(tmp_path / "data", max_body_bytes=4096) as gw:
        await deploy(gw)
        payload = {"inputs": json_inputs([1.0] * 2000, ["a"] * 2000)}
        async with gw.session.post(gw.url + INFER, json=payload) as r:
            assert r.status == 413 and r.headers["Content-Type"] == "application/json"
            body = await r.json()
        assert list(body) == ["error"] and "4096" in body["error"]
