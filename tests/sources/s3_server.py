"""moto's standalone S3 server on a loopback port, with an IAM user whose keys are the good credentials.

The server starts with authentication off, the test data and the user are created, then
``/moto-api/reset-auth`` turns signature and key checks on: from then on only the user's keys work.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import boto3
import requests

from tests.support import free_port

POLICY = '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}'


@dataclass(frozen=True)
class S3Server:
    """Where the server listens and the keys it accepts."""

    url: str
    port: int
    key_id: str
    secret: str


@contextmanager
def moto_s3(objects: dict[str, dict[str, bytes]]) -> Iterator[S3Server]:
    """Run moto_server with ``objects`` (bucket -> key -> bytes) and auth on; yields the server."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(url + "/moto-api/", timeout=1)
                break
            except requests.RequestException:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        setup = {"endpoint_url": url, "region_name": "us-east-1", "aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
        iam = boto3.client("iam", **setup)
        iam.create_user(UserName="deployer")
        iam.put_user_policy(UserName="deployer", PolicyName="all", PolicyDocument=POLICY)
        key = iam.create_access_key(UserName="deployer")["AccessKey"]
        s3 = boto3.client("s3", **setup)
        for bucket, keys in objects.items():
            s3.create_bucket(Bucket=bucket)
            for name, data in keys.items():
                s3.put_object(Bucket=bucket, Key=name, Body=data)
        requests.post(url + "/moto-api/reset-auth", data=b"0", timeout=5).raise_for_status()
        yield S3Server(url, port, key["AccessKeyId"], key["SecretAccessKey"])
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
