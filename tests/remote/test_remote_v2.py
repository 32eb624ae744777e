"""RemoteV2 servables against a real backend: a second gateway serving V2 over REST and gRPC."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.api.v2_support import V2Gateway, v2_gateway
from tests.remote.support import BACKEND_MODEL, FRONT_MODEL, grpc_infer, remote_servable, v2_body
from tests.support import ROOT, free_port, python_servable, score_body, wait_for


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[V2Gateway]:
    async with v2_gateway(tmp_path / "backend") as gw:
        await gw.deploy(python_servable())  # acme.demo.1 v1: the echo model
        yield gw


@pytest.fixture
async def front(tmp_path: Path) -> AsyncIterator[V2Gateway]:
    async with v2_gateway(tmp_path / "front") as gw:
        yield gw


async def post(gw: V2Gateway, path: str, payload: Any) -> tuple[int, Any]:
    status, body, _ = await gw.post_json(path, payload)
    return status, body


def outputs_of(grpc_response: Any) -> list[tuple[str, str, list[int], bytes]]:
    return [
        (t.name, t.datatype, list(t.shape), raw)
        for t, raw in zip(grpc_response.outputs, grpc_response.raw_output_contents, strict=True)
    ]


@pytest.mark.parametrize("protocol", ["rest", "rest-json", "grpc"])
async def test_remote_release_answers_what_the_backend_answers(backend: V2Gateway, front: V2Gateway, protocol: str) -> None:
    url = backend.url if protocol.startswith("rest") else backend.grpc_target
    json_only = {"binaryTensors": False} if protocol == "rest-json" else {}
    await front.deploy(remote_servable(url, protocol=protocol.split("-")[0], **json_only))
    xs, labels = [1.5, -2.0, 3.25], ["a", "ß", "c"]

    # V2 REST
    direct = await post(backend, f"/v2/models/{BACKEND_MODEL}/infer", v2_body(xs, labels))
    remote = await post(front, f"/v2/models/{FRONT_MODEL}/infer", v2_body(xs, labels))
    assert direct[0] == remote[0] == 200, remote
    assert remote[1]["outputs"] == direct[1]["outputs"]
    assert remote[1]["outputs"][0]["data"] == [3.0, -4.0, 6.5], remote
    assert (remote[1]["model_name"], remote[1]["model_version"]) == (FRONT_MODEL, "r1")

    # An empty batch is the backend's to answer too (never scored on the event loop here).
    empty = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [0], "data": []}]}
    direct = await post(backend, f"/v2/models/{BACKEND_MODEL}/infer", empty)
    remote = await post(front, f"/v2/models/{FRONT_MODEL}/infer", empty)
    assert direct[0] == remote[0] == 200, remote
    assert remote[1]["outputs"] == direct[1]["outputs"]

    # V2 gRPC
    direct_grpc = await grpc_infer(backend.grpc_target, BACKEND_MODEL, xs, labels)
    remote_grpc = await grpc_infer(front.grpc_target, FRONT_MODEL, xs, labels)
    assert outputs_of(remote_grpc) == outputs_of(direct_grpc)

    # BASIC /score
    direct = await post(backend, "/acme/demo/1/score", score_body(xs, labels))
    remote = await post(front, "/acme/front/1/score", score_body(xs, labels))
    assert direct[0] == remote[0] == 200, remote
    for key in ("schema", "datum"):
        assert remote[1]["Prediction"][key] == direct[1]["Prediction"][key]

    # V1
    v1 = {"instances": [{"x": x, "label": lab} for x, lab in zip(xs, labels)]}
    direct = await post(backend, f"/v1/models/{BACKEND_MODEL}:predict", v1)
    remote = await post(front, f"/v1/models/{FRONT_MODEL}:predict", v1)
    assert direct[0] == remote[0] == 200, remote
    assert remote[1] == direct[1]

    # The release's metadata names its backend, up.
    async with front.server.session.get(front.url + "/acme/front/1/r1/metadata") as r:
        meta = (await r.json())["BasicMetaData"]
    assert meta["backend"]["url"] == url and meta["backend"]["state"] == "up"
    assert meta["backend"]["binaryTensors"] is not bool(json_only)  # binary unless told: the backend lists it
    assert [i["name"] for i in meta["inputs"]] == ["x", "label"]


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
async def test_deploy_fails_422_naming_url_and_model(backend: V2Gateway, front: V2Gateway, protocol: str) -> None:
    url = backend.url if protocol == "rest" else backend.grpc_target
    status, body, _ = await front.post_json("/servable", remote_servable(url, "acme.nothing.7", protocol=protocol))
    assert status == 422, body
    assert url in body["error"] and "acme.nothing.7" in body["error"]
    dead = f"http://127.0.0.1:{free_port()}" if protocol == "rest" else f"127.0.0.1:{free_port()}"
    status, body, _ = await front.post_json("/servable", remote_servable(dead, protocol=protocol))
    assert status == 422, body
    assert dead in body["error"] and BACKEND_MODEL in body["error"]
    for bad, key in (({"protocol": "soap"}, "protocol"), ({"timeoutMs": -5}, "timeoutMs"), ({"modle": "x"}, "modle")):
        status, body, _ = await front.post_json("/servable", remote_servable(url, **{"protocol": protocol, **bad}))
        assert status == 422 and f"flavor.RemoteV2.{key}" in body["error"], body
    no_model = remote_servable(url, protocol=protocol)
    del no_model["flavor"]["RemoteV2"]["model"]
    status, body, _ = await front.post_json("/servable", no_model)
    assert status == 422 and "flavor.RemoteV2.model" in body["error"], body
    async with front.server.session.get(front.url + "/health/ready") as r:
        assert r.status == 200  # refused deploys leave nothing failed behind


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
async def test_releases_calling_one_server_share_its_connections(backend: V2Gateway, front: V2Gateway, protocol: str) -> None:
    from forestflow.runtime.remote import grpc_client, rest_client
    from forestflow.runtime.remote.http1 import MAX_BODY

    url = backend.url if protocol == "rest" else backend.grpc_target
    pool, key = (
        (rest_client._SESSIONS, rest_client.pool_key(url, {}, MAX_BODY)) if protocol == "rest" else (grpc_client._CHANNELS, url)
    )
    keep_two = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"LatestPhaseInPctBasedRouter": {}}}
    first = remote_servable(url, protocol=protocol, release="r1")
    first["contractSettings"] = keep_two
    await front.deploy(first)
    await front.deploy(remote_servable(url, protocol=protocol, release="r2", version="v1"))
    assert pool.users(key) == 2
    for release in ("r1", "r2"):
        status, body = await post(front, f"/v2/models/{FRONT_MODEL}/versions/{release}/infer", v2_body([1.0], ["a"]))
        assert status == 200 and body["outputs"][0]["data"] == [2.0], body
    async with front.server.session.delete(front.url + "/acme/front/1/r1") as r:
        assert r.status == 200
    await wait_for(lambda: pool.users(key) == 1, 10, "the first release's use given back")
    status, body = await post(front, f"/v2/models/{FRONT_MODEL}/versions/r2/infer", v2_body([1.0], ["a"]))
    assert status == 200, body  # the other release's calls go on over the shared pool
    async with front.server.session.delete(front.url + "/acme/front/1/r2") as r:
        assert r.status == 200
    await wait_for(lambda: pool.users(key) == 0, 10, "the pool closed with its last release")


async def test_score_fields_fill_a_backends_vector_input(backend: V2Gateway, front: V2Gateway) -> None:
    # A backend model taking one [-1, 4] FP32 input (as iris models do): /score's four Float64
    # fields are stacked into it, in schema order, as FP32.
    vector = python_servable(("acme", "vec", 1), directory=ROOT / "tests" / "api" / "servables", module="vector.py")
    await backend.deploy(vector)
    await front.deploy(remote_servable(backend.url, "acme.vec.1"))
    rows = [[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 8.0, 2.5]]
    body = {
        "schema": [{"type": "Float64", "fields": ["sepal_length", "sepal_width", "petal_length", "petal_width"]}],
        "datum": [{"tensors": [{"Float64": {"data": row}}]} for row in rows],
    }
    status, answer = await post(front, "/acme/front/1/score", body)
    assert status == 200, answer
    tensors = [d["tensors"][0] for d in answer["Prediction"]["datum"]]
    assert [next(iter(t.values()))["data"] for t in tensors] == [[10.0, 4.0], [10.0, 8.0]]
    # V2 np layout and V1 instances reach it as they would the backend itself.
    v2 = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 4], "data": rows}]}
    direct = await post(backend, "/v2/models/acme.vec.1/infer", v2)
    remote = await post(front, f"/v2/models/{FRONT_MODEL}/infer", v2)
    assert direct[0] == remote[0] == 200 and remote[1]["outputs"] == direct[1]["outputs"]
    direct = await post(backend, "/v1/models/acme.vec.1:predict", {"instances": rows})
    remote = await post(front, f"/v1/models/{FRONT_MODEL}:predict", {"instances": rows})
    assert direct[0] == remote[0] == 200 and remote[1] == direct[1]


async def test_a_model_repository_entry_may_name_a_backend(tmp_path: Path, backend: V2Gateway) -> None:
    entry = tmp_path / "repository" / "echo-remote"
    entry.mkdir(parents=True)
    (entry / "model.toml").write_text(
        f'contract = "acme.front.1"\nrelease = "r1"\nplatform = "remote_v2"\nurl = "{backend.grpc_target}"\n'
        f'protocol = "grpc"\nmodel = "{BACKEND_MODEL}"\ntimeoutMs = 5000\n'
    )
    async with v2_gateway(tmp_path / "repo-front", repository=str(tmp_path / "repository")) as front:
        status, body = await post(front, f"/v2/models/{FRONT_MODEL}/infer", v2_body([4.0], ["z"]))
        assert status == 200 and body["outputs"][0]["data"] == [8.0], body
        async with front.server.session.get(front.url + "/acme/front/1/r1/metadata") as r:
            backend_state = (await r.json())["BasicMetaData"]["backend"]
        assert backend_state["url"] == backend.grpc_target and backend_state["protocol"] == "grpc"


async def test_rest_calls_ask_for_answers_uncompressed(backend: V2Gateway, front: V2Gateway) -> None:
    """aiohttp asks for gzip by default, and MLServer then gzips every answer over 500 bytes, which
    the gateway only inflates again: a relay in front of the backend records what each call asks."""
    asked: list[str] = []

    async def relay(request: web.Request) -> web.Response:
        asked.append(request.headers.get("Accept-Encoding", "<none>"))
        sent = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with front.server.session.request(
            request.method, backend.url + request.path_qs, data=await request.read(), headers=sent
        ) as r:
            return web.Response(status=r.status, body=await r.read(), content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", relay)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        await front.deploy(remote_servable(f"http://127.0.0.1:{port}", binaryTensors=False))
        status, body = await post(front, f"/v2/models/{FRONT_MODEL}/infer", v2_body([1.0, 2.0], ["a", "b"]))
        assert status == 200, body
        assert body["outputs"][0]["data"] == [2.0, 4.0]
        assert len(asked) >= 3, asked  # metadata and readiness at deploy, then the inference
        assert set(asked) == {"identity"}, asked
    finally:
        await runner.cleanup()
