"""/openapi.json describes exactly the routes the aiohttp router serves."""

from __future__ import annotations

import re

from aiohttp import web

from forestflow.api.app import build_app
from forestflow.settings import Settings
from tests.support import InProcessGateway


def router_operations(app: web.Application) -> set[tuple[str, str]]:
    """(method, path template) of every route; regex parts of {name:regex} dropped; HEAD is implied."""
    ops = set()
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        ops.add((route.method.lower(), re.sub(r"\{(\w+):[^}]*\}", r"{\1}", path)))
    return ops


async def test_openapi_lists_every_route_and_nothing_else(gw: InProcessGateway, tmp_path) -> None:
    async with gw.session.get(gw.url + "/openapi.json") as r:
        assert r.status == 200
        doc = await r.json()
    assert doc["openapi"].startswith("3.1")
    documented = {(method, path) for path, item in doc["paths"].items() for method in item}
    app = build_app(Settings.load(environ={}, overrides={"data_dir": tmp_path, "grpc_port": -1}))
    served = router_operations(app)
    assert served - documented == set(), "routes without documentation"
    assert documented - served == set(), "documented routes the router does not serve"
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert op["responses"]["200"]["description"], (method, path)
            assert "default" in op["responses"], (method, path)
            names = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert names == set(re.findall(r"\{(\w+)\}", path)), (method, path)
