"""Servable paths parsed into locators: Git forms and FQRV extraction, S3 forms, credentials lookup."""

from __future__ import annotations

import pytest

from forestflow.core.ids import FQRV, Contract
from forestflow.core.locator import (
    FileLocator,
    GitLocator,
    HttpLocator,
    S3Locator,
    fqrv_from_path,
    git_tag,
    mlflow_model_dir,
    parse_locator,
)
from forestflow.errors import CreateServableRequestInvalidError
from forestflow.registry.sources.s3 import layered_credentials


def test_git_ssh_form_is_rewritten_and_its_fqrv_extracted() -> None:
    path = "git@github.com:ForestFlow/samples.git#v0.h2o_regression_v2"
    assert parse_locator(path) == GitLocator("https://github.com/ForestFlow/samples.git")
    assert parse_locator(path, git_ssh_scheme="http") == GitLocator("http://github.com/ForestFlow/samples.git")
    fqrv = fqrv_from_path(path)
    assert fqrv == FQRV(Contract("ForestFlow", "samples", 0), "h2o_regression_v2")
    assert fqrv is not None and git_tag(fqrv) == "v0.h2o_regression_v2"
    # Nested groups: ForestFlow's greedy regex made the organization "grp/org" (not a valid name); the last group wins.
    assert fqrv_from_path("git@host:grp/org/project.git#v12.gbm-v2.1") == FQRV(Contract("org", "project", 12), "gbm-v2.1")


def test_git_http_form() -> None:
    assert parse_locator("https://host:8443/org/project.git#v1.a") == GitLocator("https://host:8443/org/project.git")
    assert fqrv_from_path("http://host/org/project.git#v3.rel") == FQRV(Contract("org", "project", 3), "rel")
    assert fqrv_from_path("http://host/org/project.git") is None
    assert fqrv_from_path("http://host/org/project.git#main") is None
    assert fqrv_from_path("file:///models/a") is None
    with pytest.raises(CreateServableRequestInvalidError, match="fetched over http"):
        parse_locator("ssh://host/org/project.git")


def test_s3_forms() -> None:
    assert parse_locator("s3::http://127.0.0.1:9000/models/mojos bucket=models region=eu-west-1") == S3Locator(
        "http://127.0.0.1:9000", "models", "mojos", "eu-west-1", True, "127.0.0.1:9000/models/mojos"
    )
    # Virtual-hosted: the bucket is in the host name, not the path; region "none" is no region.
    assert parse_locator("s3://models.s3.us-west-1.amazonaws.com bucket=models region=none") == S3Locator(
        "https://s3.us-west-1.amazonaws.com", "models", "", None, False, "models.s3.us-west-1.amazonaws.com"
    )
    assert parse_locator("s3://models/team/a") == S3Locator(None, "models", "team/a", None, None, "models/team/a")
    with pytest.raises(CreateServableRequestInvalidError, match="unexpected 'bucket'"):
        parse_locator("s3::http://h/x bucket")
    with pytest.raises(CreateServableRequestInvalidError, match="needs bucket"):
        parse_locator("s3::http://h/x")


def test_other_schemes() -> None:
    assert parse_locator("file:///srv/models") == FileLocator("/srv/models")
    assert parse_locator("https://host/m.zip") == HttpLocator("https://host/m.zip")
    with pytest.raises(CreateServableRequestInvalidError, match="unsupported scheme 'hdfs'"):
        parse_locator("hdfs://nn/models")
    assert mlflow_model_dir("file:///m/model/MLmodel") == "file:///m/model"
    assert mlflow_model_dir("s3::http://h/b/m/MLmodel bucket=b") == "s3::http://h/b/m bucket=b"


def test_layered_credentials_most_specific_first() -> None:
    locator = parse_locator("s3::https://s3.us-west-1.amazonaws.com:8082/models bucket=models")
    assert isinstance(locator, S3Locator)
    env = {
        "s3_us_west_1_amazonaws_com_8082_aws_access_key_id": "host-id",
        "s3_us_west_1_amazonaws_com_8082_aws_secret_access_key": "host-secret",
        "S3_US_WEST_1_AMAZONAWS_COM_8082_MODELS_MOJOS_M_ZIP_AWS_ACCESS_KEY_ID": "object-id",
        "S3_US_WEST_1_AMAZONAWS_COM_8082_MODELS_MOJOS_M_ZIP_AWS_SECRET_ACCESS_KEY": "object-secret",
    }
    assert layered_credentials(locator, "mojos/m.zip", env) == ("object-id", "object-secret")
    assert layered_credentials(locator, "other.zip", env) == ("host-id", "host-secret")
    assert layered_credentials(locator, "other.zip", {}) is None
