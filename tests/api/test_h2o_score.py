"""Every H2O fixture MOJO deployed and scored through /score matches genmodel's golden predictions."""

from __future__ import annotations

import csv
import io
import json
import math
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.support import H2O_DIR, InProcessGateway, prediction_columns

INFOS = {p.stem: json.loads(p.read_text()) for p in sorted(H2O_DIR.glob("*.json"))}
SCORED = sorted(name for name, info in INFOS.items() if info.get("golden"))
RTOL = 1e-9


def definition(name: str, release: str = "r1", directory: Path = H2O_DIR, mojo: str | None = None) -> dict[str, Any]:
    return {
        "path": directory.as_uri(),
        "fqrv": {
            "contract": {"organization": "h2o", "project": name.replace("_", "-"), "contract_number": 1},
            "release_version": release,
        },
        "flavor": {"H2OMojo": {"mojoPath": mojo or INFOS[name]["mojo"], "version": "3.46.0.11"}},
        "servableSettings": {
            "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
            "loggingSettings": {"logLevel": "NONE"},
        },
    }


def golden(name: str) -> list[dict[str, str]]:
    with (H2O_DIR / INFOS[name]["golden"]).open(newline="") as fh:
        return list(csv.DictReader(fh))


def as_float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def body(name: str, rows: list[dict[str, str]], typed: bool) -> dict[str, Any]:
    """All inputs as strings (numbers-as-strings), or numerics as Float64; blank -> null (missing)."""
    inputs = INFOS[name]["inputs"]
    text = [c["name"] for c in inputs if not typed or c["type"] != "numeric"]
    numeric = [c["name"] for c in inputs if typed and c["type"] == "numeric"]
    schema = [{"type": "String", "fields": text}] + ([{"type": "Float64", "fields": numeric}] if numeric else [])
    datum = []
    for r in rows:
        tensors = [{"String": {"data": [r[c] or None for c in text]}}]
        if numeric:
            tensors.append({"Float64": {"data": [as_float(r[c]) for c in numeric]}})
        datum.append({"tensors": tensors})
    return {"schema": schema, "datum": datum}


def columns(prediction: dict[str, Any]) -> dict[str, list[Any]]:
    """Output columns back out of ForestFlow's grouped datum (a vector's fields gathered back)."""
    return prediction_columns(prediction)


def check(name: str, got: dict[str, list[Any]], rows: list[dict[str, str]]) -> None:
    for key in (k for k in rows[0] if k.startswith("out:")):
        column = key[4:]
        if column.endswith("]"):
            base, idx = column[:-1].split("[")
            values = [v[int(idx)] for v in got[base]]
        else:
            values = got[column]
        expected = [r[key] for r in rows]
        if values and isinstance(values[0], str):
            assert values == expected, f"{name} {column}"
        else:
            for g, e in zip(values, expected):
                want = float(e)
                if math.isnan(want):
                    assert g is None, f"{name} {column}"
                else:
                    assert g == pytest.approx(want, rel=RTOL, abs=0), f"{name} {column}"


@pytest.mark.parametrize("name", SCORED)
async def test_fixture_scored_through_score_matches_golden(gw: InProcessGateway, name: str) -> None:
    async with gw.session.post(gw.url + "/servable", json=definition(name)) as r:
        assert r.status == 200, await r.text()
    path = f"/h2o/{name.replace('_', '-')}/1/score"
    rows = golden(name)
    for typed in (False, True):
        async with gw.session.post(gw.url + path, json=body(name, rows, typed)) as r:
            payload = await r.json()
            assert r.status == 200, payload
        check(name, columns(payload["Prediction"]), rows)
    async with gw.session.get(gw.url + f"/h2o/{name.replace('_', '-')}/1/r1/metadata") as r:
        meta = (await r.json())["BasicMetaData"]
    assert [i["name"] for i in meta["inputs"]] == [c["name"] for c in INFOS[name]["inputs"]]
    assert meta["outputs"], "outputs are listed (ForestFlow left them empty)"


async def test_unknown_field_is_listed(gw: InProcessGateway) -> None:
    name = "prostate_gbm_binomial"
    async with gw.session.post(gw.url + "/servable", json=definition(name)) as r:
        assert r.status == 200
    request = body(name, golden(name)[:2], typed=True)
    request["schema"][0]["fields"][0] = "AGEE"  # a typo
    async with gw.session.post(gw.url + "/h2o/prostate-gbm-binomial/1/score", json=request) as r:
        payload = await r.json()
        assert r.status == 200
        assert r.headers["X-Forestflow-Unknown-Inputs"] == "AGEE"
    assert payload["Prediction"]["unknownInputs"] == ["AGEE"]


async def test_corrupt_and_non_mojo_zips_are_422_and_others_keep_serving(gw: InProcessGateway, tmp_path: Path) -> None:
    name = "prostate_gbm_regression"
    async with gw.session.post(gw.url + "/servable", json=definition(name)) as r:
        assert r.status == 200
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "corrupt.zip").write_bytes((H2O_DIR / INFOS[name]["mojo"]).read_bytes()[:2000])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("hello.txt", "not a model")
    (bad / "other.zip").write_bytes(buf.getvalue())
    (bad / "text.zip").write_text("plain text")
    for mojo in ("corrupt.zip", "other.zip", "text.zip", "missing.zip"):
        async with gw.session.post(
            gw.url + "/servable", json=definition(name, release=mojo.split(".")[0], directory=bad, mojo=mojo)
        ) as r:
            payload = await r.json()
            assert r.status == 422, payload
            assert payload["code"] == "CreateServableRequestInvalidError"
            assert mojo in payload["error"] or "MOJO" in payload["error"] or "zip" in payload["error"], payload
    rows = golden(name)[:3]
    async with gw.session.post(gw.url + "/h2o/prostate-gbm-regression/1/score", json=body(name, rows, True)) as r:
        assert r.status == 200
    async with gw.session.get(gw.url + "/h2o/prostate-gbm-regression/1/releases") as r:
        assert [e["FQRV"]["releaseVersion"] for e in await r.json()] == ["r1"]


async def test_a_malformed_mojo_is_a_422_naming_it_and_what_is_wrong(gw: InProcessGateway, tmp_path: Path) -> None:
    """Crafted from a fixture: a bernoulli model of one class (the C scorer wrote past its rows) and a
    169-byte tree whose left subtrees have size 0 (it flattened into 2^19 nodes)."""
    from tests.runtime.test_h2o_invalid import BAD
    from tests.runtime.test_h2o_native import edited_mojo

    name = "prostate_gbm_binomial"
    models = tmp_path / "models"  # not the gateway's data directory's parent: deploys from there are refused
    models.mkdir()
    for i, case in enumerate(("bernoulli with one class", "an exploding tree")):
        source, ini, tree, reason = BAD[case]
        mojo = edited_mojo(models, source, ini, {"trees/t00_000.bin": tree} if tree else None, name=f"crafted{i}.zip")
        async with gw.session.post(
            gw.url + "/servable", json=definition(name, release=f"bad{i}", directory=models, mojo=mojo)
        ) as r:
            payload = await r.json()
        assert r.status == 422, payload
        assert payload["code"] == "CreateServableRequestInvalidError"
        assert f"MOJO file {mojo!r} is invalid" in payload["error"] and reason in payload["error"], payload
    async with gw.session.get(gw.url + "/h2o/prostate-gbm-binomial/1/releases") as r:
        assert r.status == 404 or await r.json() == [], "no malformed release was kept"


async def test_metadata_names_the_scorer_the_gateway_setting_picked(tmp_path: Path) -> None:
    """h2o_scorer = auto: the GBM natively, the GLM with genmodel; = jvm: both with genmodel."""
    from tests.support import serve_in_process

    expected = {
        "auto": {"prostate_gbm_binomial": "natively", "prostate_glm_binomial": "JVM"},
        "jvm": {"prostate_gbm_binomial": "JVM", "prostate_glm_binomial": "JVM"},
    }
    for scorer, models in expected.items():
        async with serve_in_process(tmp_path / scorer, h2o_scorer=scorer) as gw:
            for name, word in models.items():
                async with gw.session.post(gw.url + "/servable", json=definition(name)) as r:
                    assert r.status == 200, await r.text()
                async with gw.session.get(gw.url + f"/h2o/{name.replace('_', '-')}/1/r1/metadata") as r:
                    meta = (await r.json())["BasicMetaData"]
                assert word in meta["description"], (scorer, name, meta["description"])
