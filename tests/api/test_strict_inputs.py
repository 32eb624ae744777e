"""Missing inputs are reported like unknown ones; ``strictInputs`` makes either a 400 that lists them.

Before: a batch with only ``AGE`` scored 200 with NAs for every other column and nothing told
the caller.
"""

from __future__ import annotations

from typing import Any

from tests.api.test_h2o_score import INFOS, body, definition, golden
from tests.support import InProcessGateway

NAME = "prostate_gbm_regression"
SCORE = "/h2o/prostate-gbm-regression/1/score"
V2 = "/v2/models/h2o.prostate-gbm-regression.1/infer"
OTHERS = [c["name"] for c in INFOS[NAME]["inputs"] if c["name"] != "AGE"]


def only_age() -> dict[str, Any]:
    return {"schema": [{"type": "Float64", "fields": ["AGE"]}], "datum": [{"tensors": [{"Float64": {"data": [65]}}]}]}


def v2_only_age() -> dict[str, Any]:
    return {"inputs": [{"name": "AGE", "datatype": "FP64", "shape": [1], "data": [65.0]}]}


async def deploy(gw: InProcessGateway, strict: bool | None) -> None:
    defn = definition(NAME)
    if strict is not None:
        defn["servableSettings"]["strictInputs"] = strict
    async with gw.session.post(gw.url + "/servable", json=defn) as r:
        assert r.status == 200, await r.text()


async def test_missing_inputs_are_reported_in_header_and_body(gw: InProcessGateway) -> None:
    await deploy(gw, None)
    async with gw.session.post(gw.url + SCORE, json=only_age()) as r:
        payload = await r.json()
        assert r.status == 200, payload  # ForestFlow's lenient default: NAs are scored
        assert r.headers["X-Forestflow-Missing-Inputs"] == ",".join(OTHERS)
        assert "X-Forestflow-Unknown-Inputs" not in r.headers
    assert payload["Prediction"]["missingInputs"] == OTHERS
    assert "unknownInputs" not in payload["Prediction"]
    async with gw.session.post(gw.url + V2, json=v2_only_age()) as r:
        assert r.status == 200, await r.text()
        assert r.headers["X-Forestflow-Missing-Inputs"] == ",".join(OTHERS)
    # A complete request says nothing (the wire format of a good answer is unchanged).
    async with gw.session.post(gw.url + SCORE, json=body(NAME, golden(NAME)[:2], typed=True)) as r:
        payload = await r.json()
        assert r.status == 200
        assert "X-Forestflow-Missing-Inputs" not in r.headers
    assert set(payload["Prediction"]) == {"fqrv", "schema", "datum"}


async def test_strict_inputs_turns_missing_and_unknown_columns_into_a_400_listing_them(gw: InProcessGateway) -> None:
    await deploy(gw, True)
    async with gw.session.post(gw.url + SCORE, json=only_age()) as r:
        error = await r.json()
        assert r.status == 400, error
    assert error["error"] == "strictInputs: missing inputs: " + ", ".join(OTHERS)

    typo = body(NAME, golden(NAME)[:2], typed=True)
    typo["schema"][0]["fields"][0] = "RACEE"
    async with gw.session.post(gw.url + SCORE, json=typo) as r:
        error = await r.json()
        assert r.status == 400, error
    assert error["error"] == "strictInputs: missing inputs: RACE; unknown inputs: RACEE"

    async with gw.session.post(gw.url + V2, json=v2_only_age()) as r:
        assert r.status == 400
        assert "missing inputs: RACE" in (await r.json())["error"]

    async with gw.session.post(gw.url + SCORE, json=body(NAME, golden(NAME)[:2], typed=True)) as r:
        assert r.status == 200, await r.text()

    # The setting is shown, and survives a policy update.
    settings_url = gw.url + "/h2o/prostate-gbm-regression/1/r1/settings"
    async with gw.session.get(settings_url) as r:
        assert (await r.json())["ServableSettings"]["strictInputs"] is True
    policy = {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}}
    async with gw.session.put(gw.url + "/h2o/prostate-gbm-regression/1/r1/policy", json=policy) as r:
        assert r.status == 200, await r.text()
    async with gw.session.get(settings_url) as r:
        assert (await r.json())["ServableSettings"]["strictInputs"] is True
    async with gw.session.post(gw.url + SCORE, json=only_age()) as r:
        assert r.status == 400


async def test_strict_inputs_must_be_a_boolean(gw: InProcessGateway) -> None:
    defn = definition(NAME)
    defn["servableSettings"]["strictInputs"] = "yes"
    async with gw.session.post(gw.url + "/servable", json=defn) as r:
        assert r.status == 400
        assert "strictInputs" in (await r.json())["error"]


async def test_column_names_any_client_may_send_are_percent_encoded_in_the_header(gw: InProcessGateway) -> None:
    await deploy(gw, None)
    request = body(NAME, golden(NAME)[:1], typed=True)
    request["schema"][0]["fields"][0] = "RA\r\nCE, é%"  # a newline would break the header, a comma the list
    async with gw.session.post(gw.url + SCORE, json=request) as r:
        payload = await r.json()
        assert r.status == 200, payload
        assert r.headers["X-Forestflow-Unknown-Inputs"] == "RA%0D%0ACE%2C %C3%A9%25"
        assert r.headers["X-Forestflow-Missing-Inputs"] == "RACE"
    assert payload["Prediction"]["unknownInputs"] == ["RA\r\nCE, é%"]
