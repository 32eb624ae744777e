"""Shared by the model-source tests: serve requests, golden scoring and a look into the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.api.test_h2o_score import body as score_request
from tests.api.test_h2o_score import check, columns, golden
from tests.support import InProcessGateway

SETTINGS = {
    "policySettings": {"validityPolicy": [{"ImmediatelyValid": {}}], "phaseInPolicy": {"ImmediatePhaseIn": {}}},
    "loggingSettings": {"logLevel": "NONE"},
}


def fqrv(org: str, project: str, n: int, release: str) -> dict[str, Any]:
    """An FQRV object as a serve request carries it."""
    return {"contract": {"organization": org, "project": project, "contract_number": n}, "release_version": release}


def h2o_request(path: str, mojo: str, release: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A BasicServeRequest of the H2OMojo flavor (no fqrv unless ``release`` is given)."""
    body: dict[str, Any] = {"path": path, "flavor": {"H2OMojo": {"mojoPath": mojo}}, "servableSettings": SETTINGS, **extra}
    if release is not None:
        body["fqrv"] = release
    return body


async def deploy(gw: InProcessGateway, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST /servable; the status and JSON answer."""
    async with gw.session.post(gw.url + "/servable", json=body) as r:
        return r.status, await r.json()


async def delete(gw: InProcessGateway, contract: str, release: str) -> None:
    """DELETE a release (``contract`` as org/project/n)."""
    async with gw.session.delete(f"{gw.url}/{contract}/{release}") as r:
        assert r.status == 200, await r.text()


async def assert_golden(gw: InProcessGateway, contract: str, name: str) -> None:
    """Score the fixture's golden rows through /score on ``contract`` (org/project/n) and compare."""
    rows = golden(name)
    async with gw.session.post(f"{gw.url}/{contract}/score", json=score_request(name, rows, typed=True)) as r:
        payload = await r.json()
        assert r.status == 200, payload
    check(name, columns(payload["Prediction"]), rows)


def cache_entries(gw: InProcessGateway) -> list[str]:
    """What the artifact cache directory holds (directories, staging leftovers, the index)."""
    root = Path(gw.gateway.settings.data_dir) / "artifacts"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def error_text(payload: dict[str, Any]) -> str:
    """The message of an error answer."""
    return str(payload.get("error") or payload)
