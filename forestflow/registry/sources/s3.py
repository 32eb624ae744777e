"""S3 artifacts through aiobotocore (botocore's request signing, retries and error codes, async).

ForestFlow's forms (spec 7.1) are parsed by :mod:`forestflow.core.locator`. The objects fetched
are the files a flavor names (``mojoPath``, under the path's key prefix) or, when it names none
(MLflow models), every object under the prefix. Credentials, most specific first:

1. ForestFlow's per-endpoint variables ``<key>_aws_access_key_id`` / ``<key>_aws_secret_access_key``
   with ``<key>`` tried as ``<authority><path>_<objectKey>``, ``<authority><path>`` and
   ``<authority>``, every non-alphanumeric character replaced by ``_`` (exact case, then upper case);
2. botocore's own chain: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, profiles, instance roles.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping
from pathlib import Path

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from forestflow.core.locator import S3Locator
from forestflow.errors import CreateServableRequestInvalidError
from forestflow.registry.sources import FetchLimits, safe_relative, timed_out, too_large

POSTFIXES = ("aws_access_key_id", "aws_secret_access_key")
_CREDENTIAL_ERRORS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken", "403"}


def layered_credentials(locator: S3Locator, object_key: str, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """ForestFlow's per-endpoint credentials for one object, or None (then botocore's chain)."""
    env = os.environ if environ is None else environ
    authority = locator.credential_base.split("/", 1)[0]
    for key in (f"{locator.credential_base}_{object_key}", locator.credential_base, authority):
        base = re.sub(r"[^A-Za-z0-9]", "_", key)
        for name in (base, base.upper()):
            key_id = env.get(f"{name}_{POSTFIXES[0]}") or env.get(f"{name}_{POSTFIXES[0]}".upper())
            secret = env.get(f"{name}_{POSTFIXES[1]}") or env.get(f"{name}_{POSTFIXES[1]}".upper())
            if key_id and secret:
                return key_id, secret
    return None


async def fetch_s3(locator: S3Locator, files: tuple[str, ...] | None, staging: Path, limits: FetchLimits) -> None:
    """Download the named files (or the whole prefix) into ``staging``."""
    where = f"S3 bucket {locator.bucket!r}" + (f" at {locator.endpoint}" if locator.endpoint else "")
    try:
        await asyncio.wait_for(_download(locator, files, staging, limits, where), limits.timeout_s)
    except TimeoutError:
        raise timed_out(where, limits) from None


def _key(locator: S3Locator, name: str) -> str:
    return f"{locator.prefix.rstrip('/')}/{name}" if locator.prefix else name


async def _download(locator: S3Locator, files: tuple[str, ...] | None, staging: Path, limits: FetchLimits, where: str) -> None:
    first_key = _key(locator, files[0]) if files else locator.prefix
    creds = layered_credentials(locator, first_key)
    config = AioConfig(
        s3={"addressing_style": {True: "path", False: "virtual", None: "auto"}[locator.path_style]},
        connect_timeout=min(10.0, limits.timeout_s),
        read_timeout=min(60.0, limits.timeout_s),
        retries={"max_attempts": 2, "mode": "standard"},
    )
    kwargs: dict[str, str] = {}
    if creds is not None:
        kwargs = {"aws_access_key_id": creds[0], "aws_secret_access_key": creds[1]}
    session = get_session()
    try:
        async with session.create_client(
            "s3", endpoint_url=locator.endpoint, region_name=locator.region or "us-east-1", config=config, **kwargs
        ) as client:
            names = list(files) if files else await _list(client, locator)
            total = 0
            for name in names:
                rel = safe_relative(name)
                key = _key(locator, name)
                try:
                    response = await client.get_object(Bucket=locator.bucket, Key=key)
                except ClientError as exc:
                    raise _client_error(exc, where, key) from None
                if total + int(response.get("ContentLength") or 0) > limits.max_bytes:
                    response["Body"].close()
                    raise too_large(f"{where} key {key!r}", limits)
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                async with response["Body"] as body:
                    with open(target, "wb") as out:  # noqa: ASYNC230 (a local staging file, written as chunks arrive)
                        while chunk := await body.read(1 << 16):
                            total += len(chunk)
                            if total > limits.max_bytes:
                                raise too_large(f"{where} key {key!r}", limits)
                            out.write(chunk)
    except NoCredentialsError:
        raise CreateServableRequestInvalidError(
            f"{where}: no S3 credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
            f"{re.sub(r'[^A-Za-z0-9]', '_', locator.credential_base.split('/', 1)[0])}_aws_access_key_id "
            "and _aws_secret_access_key"
        ) from None
    except ClientError as exc:
        raise _client_error(exc, where, locator.prefix) from None
    except BotoCoreError as exc:
        raise CreateServableRequestInvalidError(f"{where}: {exc}") from None


async def _list(client: object, locator: S3Locator) -> list[str]:
    prefix = locator.prefix.rstrip("/") + "/" if locator.prefix else ""
    names: list[str] = []
    paginator = client.get_paginator("list_objects_v2")  # type: ignore[attr-defined]  # aiobotocore's client is untyped
    async for page in paginator.paginate(Bucket=locator.bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            if not item["Key"].endswith("/"):
                names.append(item["Key"][len(prefix) :])
    if not names:
        raise CreateServableRequestInvalidError(f"S3 bucket {locator.bucket!r}: no objects under prefix {prefix!r}")
    return names


def _client_error(exc: ClientError, where: str, key: str) -> CreateServableRequestInvalidError:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code == "NoSuchBucket":
        return CreateServableRequestInvalidError(f"{where}: bucket does not exist")
    if code in ("NoSuchKey", "404") or status == 404:
        return CreateServableRequestInvalidError(f"{where}: object {key!r} not found")
    if code in _CREDENTIAL_ERRORS or status == 403:
        return CreateServableRequestInvalidError(f"{where}: credentials refused ({code or status})")
    return CreateServableRequestInvalidError(f"{where}: {code or status}: {error.get('Message', '')}".rstrip(": "))
