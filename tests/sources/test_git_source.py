"""Git model sources against a bare repository served by ``git http-backend`` on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.sources.git_server import git_http_server, make_repo
from tests.sources.support import assert_golden, cache_entries, delete, deploy, error_text, fqrv, h2o_request
from tests.support import H2O_DIR, InProcessGateway, serve_in_process, wait_for

BINOMIAL = (H2O_DIR / "prostate_gbm_binomial.zip").read_bytes()
REGRESSION = (H2O_DIR / "prostate_gbm_regression.zip").read_bytes()
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 53212\n"


@pytest.fixture
async def git_gw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[InProcessGateway, str]]:
    """A gateway and a Git server holding h2o/prostate.git with three tags.

    The ssh form git@127.0.0.1:... is fetched as https://127.0.0.1/...; git's own url.insteadOf
    (what an operator would put in the gateway's gitconfig) points that at the test server's port.
    """
    make_repo(
        tmp_path / "git" / "h2o",
        "prostate.git",
        {
            "v1.gbm-bin": {"models/model.zip": BINOMIAL, "README": b"binomial"},
            "v2.gbm-reg": {"models/model.zip": REGRESSION},
            "v3.lfs": {"models/model.zip": LFS_POINTER},
        },
    )
    async with git_http_server(tmp_path / "git") as url:
        monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
        monkeypatch.setenv("GIT_CONFIG_KEY_0", f"url.{url}/.insteadOf")
        monkeypatch.setenv("GIT_CONFIG_VALUE_0", "https://127.0.0.1/")
        async with serve_in_process(tmp_path / "data") as gw:
            yield gw, url


async def test_tags_deploy_with_fqrv_from_the_path_and_score_golden(git_gw: tuple[InProcessGateway, str]) -> None:
    gw, url = git_gw
    # ssh form, no fqrv in the body: ForestFlow's extraction gives h2o/prostate/1 release gbm-bin.
    status, payload = await deploy(gw, h2o_request("git@127.0.0.1:h2o/prostate.git#v1.gbm-bin", "models/model.zip"))
    assert status == 200, payload
    assert payload["ServableCreatedSuccessfully"]["fqrv"] == {
        "contract": {"organization": "h2o", "project": "prostate", "contractNumber": 1},
        "releaseVersion": "gbm-bin",
    }
    # http form with an explicit fqrv: the tag checked out is v<N>.<release> of that fqrv.
    status, payload = await deploy(
        gw, h2o_request(f"{url}/h2o/prostate.git", "models/model.zip", fqrv("h2o", "prostate", 2, "gbm-reg"))
    )
    assert status == 200, payload
    await assert_golden(gw, "h2o/prostate/1", "prostate_gbm_binomial")
    await assert_golden(gw, "h2o/prostate/2", "prostate_gbm_regression")
    assert len([n for n in cache_entries(gw) if len(n) == 64]) == 2  # one tree per tag, .git left out
    await delete(gw, "h2o/prostate/1", "gbm-bin")
    await delete(gw, "h2o/prostate/2", "gbm-reg")
    assert cache_entries(gw) == []


async def test_missing_tag_and_lfs_pointer_are_422_and_leave_nothing(git_gw: tuple[InProcessGateway, str]) -> None:
    gw, _ = git_gw
    status, payload = await deploy(gw, h2o_request("git@127.0.0.1:h2o/prostate.git#v1.nope", "models/model.zip"))
    assert status == 422, payload
    assert "tag v1.nope not found" in error_text(payload)
    status, payload = await deploy(gw, h2o_request("git@127.0.0.1:h2o/prostate.git#v3.lfs", "models/model.zip"))
    assert status == 422, payload
    assert "models/model.zip" in error_text(payload) and "LFS" in error_text(payload)
    status, payload = await deploy(gw, h2o_request("git@127.0.0.1:h2o/absent.git#v1.x", "models/model.zip"))
    assert status == 422, payload
    assert "absent.git" in error_text(payload), payload
    assert cache_entries(gw) == []
    assert gw.gateway.contracts == {} or all(not s.servables for s in gw.gateway.contracts.values())


async def test_size_cap_and_timeout_stop_git_and_leave_nothing(tmp_path: Path) -> None:
    make_repo(tmp_path / "git" / "h2o", "prostate.git", {"v1.gbm-bin": {"models/model.zip": BINOMIAL}})
    async with git_http_server(tmp_path / "git") as url:
        path = f"{url}/h2o/prostate.git#v1.gbm-bin"
        async with serve_in_process(tmp_path / "small", artifact_max_bytes=20_000) as gw:
            status, payload = await deploy(gw, h2o_request(path, "models/model.zip"))
            assert status == 422, payload
            assert "artifact_max_bytes = 20000" in error_text(payload)
            assert cache_entries(gw) == []
    async with (
        git_http_server(tmp_path / "git", delay_s=1.0) as url,  # a server slower than the timeout
        serve_in_process(tmp_path / "slow", artifact_download_timeout_s=0.5) as gw,
    ):
        status, payload = await deploy(gw, h2o_request(f"{url}/h2o/prostate.git#v1.gbm-bin", "models/model.zip"))
        assert status == 422, payload
        assert "artifact_download_timeout_s = 0.5 s" in error_text(payload)
        assert cache_entries(gw) == []


async def test_deploy_whose_client_disconnects_completes(tmp_path: Path) -> None:
    make_repo(tmp_path / "git" / "h2o", "prostate.git", {"v1.gbm-bin": {"models/model.zip": BINOMIAL}})
    async with git_http_server(tmp_path / "git", delay_s=0.3) as url, serve_in_process(tmp_path / "data") as gw:
        request = asyncio.ensure_future(deploy(gw, h2o_request(f"{url}/h2o/prostate.git#v1.gbm-bin", "models/model.zip")))
        await wait_for(lambda: gw.gateway.registry.pending, 5, "the deploy to start")
        request.cancel()  # the client goes away while the repository is being fetched
        with pytest.raises(asyncio.CancelledError):
            await request
        await wait_for(lambda: not gw.gateway.registry.pending, 30, "the deploy to finish")
        assert len(gw.gateway.loaded) == 1  # completed, not half done
        assert len([n for n in cache_entries(gw) if len(n) == 64]) == 1
        await assert_golden(gw, "h2o/prostate/1", "prostate_gbm_binomial")
