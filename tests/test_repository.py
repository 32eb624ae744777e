"""The model repository: entries deployed at start, idempotent restarts, broken entries skipped, V2 routes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support import H2O_DIR, ROOT, InProcessGateway, python_servable, score_body, serve_in_process

GBM_ENTRY = """
contract = "repo.gbm.1"
release = "v1"
name = "prostate"
platform = "h2o_mojo"
id = "prostate_gbm_binomial.zip"
[servable_settings]
policySettings = { validityPolicy = [{ ImmediatelyValid = {} }], phaseInPolicy = { ImmediatePhaseIn = {} } }
loggingSettings = { logLevel = "NONE" }
"""


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    gbm = root / "gbm-v1"
    gbm.mkdir(parents=True)
    (gbm / "model.toml").write_text(GBM_ENTRY)
    shutil.copy(H2O_DIR / "prostate_gbm_binomial.zip", gbm)
    pipe = root / "pipeline"
    shutil.copytree(ROOT / "servables" / "prostate-pipeline", pipe)
    text = (pipe / "pipeline.toml").read_text()
    (pipe / "pipeline.toml").write_text('contract = "repo.pipe.1"\nrelease = "p1"\n' + text)
    broken = root / "broken"
    broken.mkdir()
    (broken / "model.toml").write_text('contract = "repo.broken.1"\nname = "x"\nplatform = "h2o_mojo"\nid = "missing.zip"\n')
    (root / "bad-toml").mkdir()
    (root / "bad-toml" / "model.toml").write_text("contract = \n")
    return root


async def created_at(gw: InProcessGateway) -> dict[str, str]:
    out = {}
    for contract in ("repo/gbm/1", "repo/pipe/1"):
        async with gw.session.get(f"{gw.url}/{contract}/stats") as r:
            assert r.status == 200, await r.text()
            for item in await r.json():
                m = item["ServableMetrics"]
                out[f"{contract}/{m['fqrv']['releaseVersion']}"] = m["createdAtMS"]
    return out


async def v2(gw: InProcessGateway, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with gw.session.post(gw.url + path, json=body, headers=headers) as r:
        return r.status, await r.json(content_type=None)


async def test_entries_load_at_start_a_broken_one_is_skipped_and_a_restart_redeploys_nothing(
    tmp_path: Path, repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    async with serve_in_process(data, repository=str(repository)) as gw:
        first = await created_at(gw)
        assert set(first) == {"repo/gbm/1/v1", "repo/pipe/1/p1"}
        async with gw.session.get(gw.url + "/v2/models") as r:
            models = (await r.json())["models"]
        assert models == [
            {"name": "repo.gbm.1", "versions": ["v1"], "ready": True},
            {"name": "repo.pipe.1", "versions": ["p1"], "ready": True},
        ]
        values = {"age": 68, "race": "white", "dpros": 1, "dcaps": 1, "psa": 6.7, "vol": 16.7, "gleason": 6}
        body = {
            "inputs": [
                {"name": k, "datatype": "BYTES" if k == "race" else "FP64", "shape": [1], "data": [v]} for k, v in values.items()
            ]
        }
        async with gw.session.post(gw.url + "/v2/models/repo.pipe.1/infer", json=body) as r:
            assert r.status == 200, await r.text()
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "repository_entry_skipped" in out and "entry=broken" in out and "missing.zip" in out
    assert "entry=bad-toml" in out and "not valid TOML" in out
    assert out.count("servable_created") == 2

    async with serve_in_process(data, repository=str(repository)) as gw:
        assert await created_at(gw) == first  # restored from the registry, left alone
    out = capsys.readouterr().out
    assert "servable_created" not in out
    assert "repository_loaded" in out and "unchanged=2" in out and "failed=2" in out

    # A changed entry is redeployed; the unchanged one is not.
    (repository / "gbm-v1" / "model.toml").write_text(
        GBM_ENTRY.replace('logLevel = "NONE"', 'logLevel = "FULL", keyFeatures = ["reqid"]')
    )
    async with serve_in_process(data, repository=str(repository)) as gw:
        after = await created_at(gw)
        async with gw.session.get(gw.url + "/repo/gbm/1/v1/settings") as r:
            settings = await r.text()
    assert after["repo/pipe/1/p1"] == first["repo/pipe/1/p1"]
    assert after["repo/gbm/1/v1"] != first["repo/gbm/1/v1"]
    assert "FULL" in settings


async def test_v2_repository_index_load_and_unload(tmp_path: Path, repository: Path) -> None:
    async with serve_in_process(tmp_path / "data", repository=str(repository), admin_token="s3cret") as gw:
        status, body = await v2(gw, "/v2/repository/index")
        assert status == 401 and "Bearer" in body["error"]
        status, body = await v2(gw, "/v2/repository/index", token="wrong")
        assert status == 403 and "error" in body
        status, index = await v2(gw, "/v2/repository/index", token="s3cret")
        assert status == 200, index
        assert [(r["name"], r["version"], r["state"]) for r in index] == [
            ("bad-toml", "", "UNAVAILABLE"),
            ("repo.broken.1", "broken", "UNAVAILABLE"),
            ("repo.gbm.1", "v1", "READY"),
            ("repo.pipe.1", "p1", "READY"),
        ]
        assert "not valid TOML" in index[0]["reason"] and "missing.zip" in index[1]["reason"]

        status, body = await v2(gw, "/v2/repository/models/repo.pipe.1/unload", token="s3cret")
        assert (status, body) == (200, {})
        assert [str(c) for c in gw.gateway.contracts] == ["repo.gbm.1"]
        status, ready = await v2(gw, "/v2/repository/index", {"ready": True}, token="s3cret")
        assert [(r["name"], r["state"]) for r in ready] == [("repo.gbm.1", "READY")]
        status, index = await v2(gw, "/v2/repository/index", token="s3cret")
        assert {"name": "repo.pipe.1", "version": "p1", "state": "UNAVAILABLE", "reason": "unloaded"} in index
        async with gw.session.post(gw.url + "/v2/models/repo.pipe.1/infer", json={"inputs": []}) as r:
            assert r.status == 404

        status, body = await v2(gw, "/v2/repository/models/repo.pipe.1/load", token="s3cret")
        assert (status, body) == (200, {})
        status, ready = await v2(gw, "/v2/repository/index", {"ready": True}, token="s3cret")
        assert [(r["name"], r["state"]) for r in ready] == [("repo.gbm.1", "READY"), ("repo.pipe.1", "READY")]
        # Loading what is loaded changes nothing; unknown models are 404; a broken entry answers its reason.
        status, body = await v2(gw, "/v2/repository/models/repo.gbm.1/load", token="s3cret")
        assert status == 200
        status, body = await v2(gw, "/v2/repository/models/no.such.1/load", token="s3cret")
        assert status == 404 and "no entry" in body["error"]
        status, body = await v2(gw, "/v2/repository/models/repo.broken.1/load", token="s3cret")
        assert status == 422 and "missing.zip" in body["error"]
        status, body = await v2(gw, "/v2/repository/models/no.such.1/unload", token="s3cret")
        assert status == 404


def test_repository_setting_and_flag(tmp_path: Path, repository: Path) -> None:
    from forestflow.cli import build_parser
    from forestflow.settings import Settings, SettingsError

    args = build_parser().parse_args(["serve", "--repository", str(repository)])
    assert args.repository == str(repository)
    assert Settings.load(environ={"FORESTFLOW_REPOSITORY": str(repository)}).repository == str(repository)
    with pytest.raises(SettingsError, match="invalid repository = .*expected an existing directory"):
        Settings.load(environ={}, overrides={"repository": str(tmp_path / "nope")})


def counters(stats: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each release's persisted metrics from /stats (not the sliding windows of this process)."""
    return {
        m["ServableMetrics"]["fqrv"]["releaseVersion"]: {
            k: v for k, v in m["ServableMetrics"].items() if k != "performanceMetrics"
        }
        for m in stats
    }


async def test_unload_frees_a_model_and_load_brings_back_its_releases_settings_and_counters(tmp_path: Path) -> None:
    data = tmp_path / "data"
    contract = {"expirationPolicy": {"KeepLatest": {"servablesToKeep": 3}}, "router": {"LatestPhaseInPctBasedRouter": {}}}
    async with serve_in_process(data) as gw:  # no repository: deployed through the admin API
        for release in ("v1", "v2"):
            body = python_servable(release=release, contract_settings=contract)
            async with gw.session.post(gw.url + "/servable", json=body) as r:
                assert r.status == 200, await r.text()
        for x in (1.0, 2.0, 3.0):
            async with gw.session.post(gw.url + "/acme/demo/1/score", json=score_body([x])) as r:
                assert r.status == 200
        async with gw.session.get(gw.url + "/acme/demo/1/stats") as r:
            before = counters(await r.json())
        async with gw.session.get(gw.url + "/acme/demo/1/contract-settings") as r:
            settings_before = await r.json()
        status, body = await v2(gw, "/v2/repository/models/acme.demo.1/unload")
        assert (status, body) == (200, {})
        assert gw.gateway.loaded == {}
        async with gw.session.post(gw.url + "/acme/demo/1/score", json=score_body([1.0])) as r:
            assert r.status == 404
        status, index = await v2(gw, "/v2/repository/index")
        assert [(r["name"], r["version"], r["state"], r["reason"]) for r in index] == [
            ("acme.demo.1", "v1", "UNAVAILABLE", "unloaded"),
            ("acme.demo.1", "v2", "UNAVAILABLE", "unloaded"),
        ]
    async with serve_in_process(data) as gw:  # what was set aside outlives a restart
        assert gw.gateway.loaded == {}
        status, body = await v2(gw, "/v2/repository/models/acme.demo.1/load")
        assert (status, body) == (200, {})
        async with gw.session.get(gw.url + "/acme/demo/1/stats") as r:
            after = counters(await r.json())
        async with gw.session.get(gw.url + "/acme/demo/1/contract-settings") as r:
            assert await r.json() == settings_before
        assert after == before and sum(int(m["scoreCount"]) for m in after.values()) == 3
        async with gw.session.post(gw.url + "/acme/demo/1/score", json=score_body([1.0])) as r:
            assert r.status == 200
        # errors of the repository API carry code and request_id like every other error
        async with gw.session.post(gw.url + "/v2/repository/models/no.such.1/unload") as r:
            body = await r.json()
            assert r.status == 404 and body["code"] == "NotFound" and body["request_id"] == r.headers["X-Request-Id"]
        async with gw.session.post(gw.url + "/v2/repository/models/acme.demo.1/load") as r:
            body = await r.json()
            assert r.status == 404 and "no entry" in body["error"] and body["request_id"] == r.headers["X-Request-Id"]


async def test_the_repository_example_holds_real_files_and_a_dangling_link_is_named(tmp_path: Path) -> None:
    copy = tmp_path / "copied"
    shutil.copytree(ROOT / "config" / "repository", copy, symlinks=True)  # as cp -a or a Docker COPY would
    mojo = copy / "prostate-gbm" / "prostate_gbm.zip"
    assert mojo.is_file() and not mojo.is_symlink()
    async with serve_in_process(tmp_path / "data", repository=str(copy)) as gw:
        status, index = await v2(gw, "/v2/repository/index")
        assert [(r["name"], r["state"]) for r in index] == [("samples.repo-prostate.1", "READY")], index
    mojo.unlink()
    mojo.symlink_to("../../../servables/prostate-gbm/prostate_gbm.zip")  # what the example used to hold: dangling here
    async with serve_in_process(tmp_path / "data2", repository=str(copy)) as gw:
        status, index = await v2(gw, "/v2/repository/index")
    (row,) = index
    assert row["state"] == "UNAVAILABLE" and "is a symbolic link to ../../../servables" in row["reason"], row
    assert "does not exist" in row["reason"] and "artifact_roots" not in row["reason"]
