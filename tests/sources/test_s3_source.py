"""S3 model sources against moto's standalone S3 server on loopback, with good and bad credentials."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.sources.s3_server import S3Server, moto_s3
from tests.sources.support import assert_golden, cache_entries, delete, deploy, error_text, fqrv, h2o_request
from tests.support import H2O_DIR, InProcessGateway, serve_in_process

BINOMIAL = (H2O_DIR / "prostate_gbm_binomial.zip").read_bytes()
KMEANS = (H2O_DIR / "prostate_kmeans.zip").read_bytes()
MLMODEL = (
    b"flavors:\n  h2o_mojo:\n    data: data\n    h2o_version: 3.46.0.11\n"
    b"run_id: abc\nutc_time_created: '2026-11-23 10:00:00.000000'\n"
)


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    objects = {
        "models": {
            "mojos/prostate_gbm_binomial.zip": BINOMIAL,
            "mojos/prostate_kmeans.zip": KMEANS,
            "mlflow/m1/MLmodel": MLMODEL,
            "mlflow/m1/data/h2o.yaml": b"full_file: data/model.zip\nmodel_dir: data\nmodel_file: model.zip\n",
            "mlflow/m1/data/model.zip": BINOMIAL,
        }
    }
    with moto_s3(objects) as server:
        yield server


@pytest.fixture
async def gw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3: S3Server) -> AsyncIterator[InProcessGateway]:
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    async with serve_in_process(tmp_path / "data", artifact_download_timeout_s=20) as server:
        yield server


def endpoint_path(s3: S3Server, bucket: str = "models") -> str:
    """ForestFlow's form, path-style: the bucket is in the URL's path."""
    return f"s3::http://127.0.0.1:{s3.port}/{bucket}/mojos bucket={bucket} region=us-east-1"


async def test_endpoint_form_with_per_endpoint_credentials(
    gw: InProcessGateway, s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ForestFlow's layered variables, keyed by the endpoint's authority, win over the AWS ones.
    monkeypatch.setenv(f"127_0_0_1_{s3.port}_aws_access_key_id", s3.key_id)
    monkeypatch.setenv(f"127_0_0_1_{s3.port}_aws_secret_access_key", s3.secret)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    # Three deploys of one artifact at once: one download.
    bodies = [h2o_request(endpoint_path(s3), "prostate_gbm_binomial.zip", fqrv("s3", "prostate", n, "r1")) for n in (1, 2, 3)]
    results = await asyncio.gather(*(deploy(gw, b) for b in bodies))
    assert [status for status, _ in results] == [200, 200, 200], results
    assert gw.gateway.loader.artifacts.fetch_count == 1
    for n in (1, 2, 3):
        await assert_golden(gw, f"s3/prostate/{n}", "prostate_gbm_binomial")
    assert len(cache_entries(gw)) == 2  # the one artifact and the source index
    await delete(gw, "s3/prostate/1", "r1")
    await delete(gw, "s3/prostate/2", "r1")
    assert len(cache_entries(gw)) == 2  # still used by s3.prostate.3
    await assert_golden(gw, "s3/prostate/3", "prostate_gbm_binomial")
    await delete(gw, "s3/prostate/3", "r1")
    assert cache_entries(gw) == []


async def test_plain_s3_url_and_mlflow_model_with_aws_variables(
    gw: InProcessGateway, s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.url)
    status, payload = await deploy(gw, h2o_request("s3://models/mojos", "prostate_kmeans.zip", fqrv("s3", "kmeans", 1, "r1")))
    assert status == 200, payload
    await assert_golden(gw, "s3/kmeans/1", "prostate_kmeans")
    # An MLflow model under a prefix: every object below it is fetched, MLmodel picks h2o_mojo.
    mlflow = {
        "path": "s3://models/mlflow/m1/MLmodel",
        "fqrv": fqrv("s3", "mlflow", 1, "r1"),
        "servableSettings": h2o_request("", "")["servableSettings"],
    }
    status, payload = await deploy(gw, mlflow)
    assert status == 200, payload
    await assert_golden(gw, "s3/mlflow/1", "prostate_gbm_binomial")


async def test_failures_are_422_naming_the_cause_and_leave_nothing(
    gw: InProcessGateway, s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret)
    release = fqrv("s3", "bad", 1, "r1")
    cases = [
        (h2o_request(endpoint_path(s3, "absent"), "prostate_gbm_binomial.zip", release), "bucket does not exist"),
        (h2o_request(endpoint_path(s3), "nothing.zip", release), "'mojos/nothing.zip' not found"),
        (h2o_request(endpoint_path(s3), "prostate_gbm_binomial.zip", release, sha256="0" * 64), "sha256 mismatch"),
    ]
    for body, expected in cases:
        status, payload = await deploy(gw, body)
        assert status == 422, payload
        assert expected in error_text(payload), payload
        assert cache_entries(gw) == [], expected
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    status, payload = await deploy(gw, h2o_request(endpoint_path(s3), "prostate_gbm_binomial.zip", release))
    assert status == 422, payload
    assert "credentials refused" in error_text(payload), payload
    assert cache_entries(gw) == []
    # The right digest deploys.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret)
    good = hashlib.sha256(BINOMIAL).hexdigest()
    status, payload = await deploy(gw, h2o_request(endpoint_path(s3), "prostate_gbm_binomial.zip", release, sha256=good))
    assert status == 200, payload
