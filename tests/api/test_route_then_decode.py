"""One release decides a request (issue 33 item 9): positional layouts (V2 np, V1 instances,
GraphPipe without names) are decoded against the release the router picked, the contract is
resolved once per request, and one definition of the release that describes the contract."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from forestflow.core.frame import Frame
from forestflow.core.ids import Contract
from tests.api_gp.helpers import GP_PATH, execute_multi
from tests.support import InProcessGateway, python_servable

SERVABLES = Path(__file__).with_name("servables")
SPLIT = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 2}}, "router": {"FairPhaseInPctBasedRouter": {}}}
#: y = a + 2b + 3c for the row [1, 2, 3] read positionally: v1 takes (a, b, c), v2 takes (c, b, a).
EXPECTED = {"v1": 14.0, "v2": 10.0}


async def deploy_two_orders(gw: InProcessGateway) -> None:
    """v1 and v2 both at 100 % under the fair router: requests alternate between them."""
    for release, module, extra in (("v1", "linear.py", {"contract_settings": SPLIT}), ("v2", "linear_cba.py", {})):
        body = python_servable(release=release, directory=SERVABLES, module=module, **extra)
        async with gw.session.post(gw.url + "/servable", json=body) as r:
            assert r.status == 200, await r.text()


async def post(gw: InProcessGateway, path: str, body: Any) -> tuple[int, Any]:
    async with gw.session.post(gw.url + path, json=body) as r:
        return r.status, await r.json()


async def test_v2_np_and_v1_instances_decode_against_the_release_that_scores(gw: InProcessGateway) -> None:
    await deploy_two_orders(gw)
    np_body = {
        "inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 3], "data": [1.0, 2.0, 3.0]}],
        "parameters": {"content_type": "np"},
    }
    answered: Counter[str] = Counter()
    for _ in range(10):
        status, body = await post(gw, "/v2/models/acme.demo.1/infer", np_body)
        assert status == 200, body
        release = body["model_version"]
        answered[release] += 1
        y = next(o for o in body["outputs"] if o["name"] == "y")
        assert y["data"][0] == EXPECTED[release], (release, body)
        status, v1 = await post(gw, "/v1/models/acme.demo.1:predict", {"instances": [[1.0, 2.0, 3.0]]})
        assert status == 200, v1
        assert v1["predictions"][0]["y"] in EXPECTED.values()
    assert set(answered) == {"v1", "v2"}, answered  # both releases answered positional requests
    # V1 answers carry no release: scored on both, every answer is one of the two right ones,
    # and over an even number of requests both appear.
    seen = set()
    for _ in range(4):
        _, v1 = await post(gw, "/v1/models/acme.demo.1:predict", {"instances": [[1.0, 2.0, 3.0]]})
        seen.add(v1["predictions"][0]["y"])
    assert seen == set(EXPECTED.values()), seen


async def test_graphpipe_without_names_decodes_against_the_release_that_scores(gw: InProcessGateway) -> None:
    await deploy_two_orders(gw)
    got = set()
    for _ in range(4):
        outputs = await execute_multi(gw.url + GP_PATH, [np.array([[1.0, 2.0, 3.0]])], None, ["y"])
        got.add(float(np.asarray(outputs[0]).ravel()[0]))
    assert got == set(EXPECTED.values()), got


@pytest.mark.parametrize("path", ["/v2/models/acme.demo.1/infer", "/v1/models/acme.demo.1:predict", GP_PATH])
async def test_the_contract_is_resolved_once_per_request(
    gw: InProcessGateway, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await deploy_two_orders(gw)
    registry = gw.gateway.registry
    calls = []
    original = registry.contract_state

    def counted(contract: Any) -> Any:
        calls.append(contract)
        return original(contract)

    monkeypatch.setattr(registry, "contract_state", counted)
    body: Any = (
        {
            "inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 3], "data": [1.0, 2.0, 3.0]}],
            "parameters": {"content_type": "np"},
        }
        if path.startswith("/v2")
        else {"instances": [[1.0, 2.0, 3.0]]}
    )
    if path == GP_PATH:
        outputs = await execute_multi(gw.url + GP_PATH, [np.array([[1.0, 2.0, 3.0]])], None, ["y"])
        assert float(np.asarray(outputs[0]).ravel()[0]) in EXPECTED.values()
    else:
        status, answer = await post(gw, path, body)
        assert status == 200, answer
    assert len(calls) == 1, calls


async def test_v2_and_graphpipe_metadata_describe_the_same_release(gw: InProcessGateway) -> None:
    await deploy_two_orders(gw)
    async with gw.session.get(gw.url + "/v2/models/acme.demo.1") as r:
        v2 = await r.json()
    async with gw.session.get(gw.url + GP_PATH) as r:
        gp = await r.json()
    assert [i["name"] for i in v2["inputs"]] == [i["name"] for i in gp["inputs"]] == ["c", "b", "a"]
    assert gp["version"] == "acme.demo.1.v2"


async def test_a_request_whose_release_leaves_before_its_body_is_decoded_is_routed_again(gw: InProcessGateway) -> None:
    # Routing comes before the body is read; a release may expire or be deleted meanwhile (seen in a
    # rollout on a follower: a KeyError answered as a 500). The request then goes to the one left.
    await deploy_two_orders(gw)
    contract = Contract.parse("acme.demo.1")
    route = gw.gateway.route(contract)
    gone = route.answered
    assert gone in EXPECTED
    (left,) = set(EXPECTED) - {gone}
    async with gw.session.delete(gw.url + f"/acme/demo/1/{gone}") as r:
        assert r.status == 200, await r.text()
    meta = gw.gateway.decoding_metadata(route)
    assert meta is not None and [s.name for s in meta.inputs] == (["a", "b", "c"] if left == "v1" else ["c", "b", "a"])
    frame = Frame({"a": np.array([1.0]), "b": np.array([2.0]), "c": np.array([3.0])})
    result = await gw.gateway.infer(contract, frame, configs={}, request_id="r1", protocol="test", route=route)
    assert result.fqrv.release == left and result.frame["y"][0] == 14.0
