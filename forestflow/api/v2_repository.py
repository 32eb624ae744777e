"""Triton's model repository extension over REST, plus ``GET /v2/models``.

``POST /v2/repository/index`` (body ``{"ready": true}`` optional) lists ``{name, version, state}``
for every repository entry, servable and unloaded release; ``.../models/{name}/unload`` frees every
release of a model (a contract, ``org.project.N``), keeping its definitions, settings and counters,
and ``.../load`` brings them back and deploys the model's repository entries. The three are admin
routes (bearer token when one is set); ``GET /v2/models`` lists the models the gateway serves.
Errors are V2 bodies with ``code`` and ``request_id`` (``{"error", "code", "request_id"}``). The repository itself is
``forestflow/repository.py``; a gateway started without one still indexes and unloads what it has.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from forestflow.api.admin import admin
from forestflow.api.common import AFTER_START, GATEWAY, SETTINGS, WORKER
from forestflow.api.responses import json_response
from forestflow.api.v2_rest import v2_errors
from forestflow.errors import InvalidInput
from forestflow.repository import ModelRepository

REPOSITORY = web.AppKey("repository", ModelRepository)


async def repository_context(app: web.Application) -> AsyncIterator[None]:
    """Once the gateway has started: deploy the configured repository's entries (idempotently)."""
    settings = app[SETTINGS]
    repository = ModelRepository(app[GATEWAY], Path(settings.repository) if settings.repository else None)
    app[REPOSITORY] = repository
    worker = app.get(WORKER)
    if settings.repository and (worker is None or worker.index == 0):  # one worker deploys; the others follow the store
        app[AFTER_START].append(repository.deploy_all)
    yield


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"body: not valid JSON ({exc.msg})") from None
    if not isinstance(doc, dict):
        raise InvalidInput("body: expected a JSON object")
    return doc


@v2_errors
async def list_models(request: web.Request) -> web.Response:
    """GET /v2/models: ``{"models": [{name, versions, ready}]}`` for every contract."""
    gateway = request.app[GATEWAY]
    models = []
    for contract, state in sorted(gateway.contracts.items()):
        releases = list(state.servables)
        ready = any(
            (loaded := gateway.loaded.get(e.fqrv)) is not None and loaded.servable.ready for e in state.servables.values()
        )
        models.append({"name": str(contract), "versions": releases, "ready": ready})
    return json_response({"models": models})


async def index(request: web.Request) -> web.Response:
    """POST /v2/repository/index."""
    ready = (await _body(request)).get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidInput("ready: expected true or false")
    return json_response(await request.app[REPOSITORY].index(ready_only=ready))


async def load(request: web.Request) -> web.Response:
    """POST /v2/repository/models/{name}/load."""
    await _body(request)
    await request.app[REPOSITORY].load(request.match_info["name"])
    return json_response({})


async def unload(request: web.Request) -> web.Response:
    """POST /v2/repository/models/{name}/unload."""
    await _body(request)
    await request.app[REPOSITORY].unload(request.match_info["name"])
    return json_response({})


def add_routes(app: web.Application) -> None:
    """Register the repository routes (before the generic ``/v2/models/{model}`` ones)."""
    r = app.router
    r.add_get("/v2/models", list_models)
    # Token errors are V2 error bodies too: the admin check runs inside v2_errors.
    r.add_post("/v2/repository/index", v2_errors(admin(index), detailed=True))
    r.add_post("/v2/repository/models/{name}/load", v2_errors(admin(load), detailed=True))
    r.add_post("/v2/repository/models/{name}/unload", v2_errors(admin(unload), detailed=True))
