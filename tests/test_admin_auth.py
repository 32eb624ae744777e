"""Admin routes need the bearer token when one is set; scoring routes do not."""

from __future__ import annotations

from pathlib import Path

from tests.support import python_servable, score_body, serve_in_process


async def test_admin_token(tmp_path: Path) -> None:
    async with serve_in_process(tmp_path / "d", admin_token="s3cret") as gw:
        body = python_servable()
        async with gw.session.post(gw.url + "/servable", json=body) as r:
            assert r.status == 401
            assert (await r.json())["code"] == "Unauthenticated"
        async with gw.session.post(gw.url + "/servable", json=body, headers={"Authorization": "Bearer nope"}) as r:
            assert r.status == 403
            assert (await r.json())["code"] == "Forbidden"
        async with gw.session.post(gw.url + "/servable", json=body, headers={"Authorization": "Bearer s3cret"}) as r:
            assert r.status == 200
        async with gw.session.delete(gw.url + "/acme/demo/1/v1") as r:
            assert r.status == 401
        async with gw.session.post(gw.url + "/acme/demo/1/score", json=score_body([1.0])) as r:
            assert r.status == 200
        async with gw.session.get(gw.url + "/acme/demo/1/stats") as r:
            assert r.status == 200


async def test_python_flavor_is_off_by_default(tmp_path: Path) -> None:
    async with (
        serve_in_process(tmp_path / "d", allow_python=False) as gw,
        gw.session.post(gw.url + "/servable", json=python_servable()) as r,
    ):
        assert r.status == 422
        assert "FORESTFLOW_ALLOW_PYTHON" in (await r.json())["error"]
