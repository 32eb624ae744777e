"""KServe V1 (TF-Serving style) REST: model list, model readiness and ``:predict``.

``POST /v1/models/{model}:predict`` takes ``{"instances": [...]}`` (or ``"inputs"``), each instance
either a list of values in the model's input order or an object keyed by input name, and answers
``{"predictions": [...]}``, one per instance: the value of a one-output model, else an object of
output name -> value. Routed by phase-in exactly like /score (shadows and logging included).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from aiohttp import web

from forestflow.api import v2_common
from forestflow.api.common import SCORING_S, CONTRACT, FQRV_TAG, GATEWAY, read_json, request_id_of, timeout_from
from forestflow.api.responses import json_response
from forestflow.api.v2_rest import v2_errors
from forestflow.core.frame import DATATYPES, Frame, TensorSpec
from forestflow.errors import InvalidInput


def _column(name: str, values: list[Any], spec: TensorSpec | None) -> np.ndarray:
    """One input's values across instances, typed as the model declares it."""
    datatype = spec.datatype if spec is not None else None
    if datatype in DATATYPES and datatype not in ("BYTES", "BOOL"):
        if any(isinstance(v, (bool, str, dict)) for v in values):
            raise InvalidInput(f"input {name!r}: expected numbers ({datatype}), got {next(v for v in values if isinstance(v, (bool, str, dict)))!r}")
        if datatype.startswith("FP"):
            values = [np.nan if v is None else v for v in values]
        try:
            return np.array(values, dtype=DATATYPES[datatype])
        except (ValueError, TypeError, OverflowError):
            raise InvalidInput(f"input {name!r}: values do not fit {datatype}") from None
    if datatype == "BOOL" and all(isinstance(v, bool) for v in values):
        return np.array(values, dtype=np.bool_)
    try:
        arr = np.array(values)
    except ValueError:
        raise InvalidInput(f"input {name!r}: values of different shapes across instances") from None
    if arr.dtype.kind in "USO" or arr.ndim == 0:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    return arr


def frame_from_instances(instances: Any, specs: Sequence[TensorSpec], parameters: dict[str, Any]) -> Frame:
    """The Frame of a V1 ``instances`` list (lists in input order, or objects by input name)."""
    if not isinstance(instances, list) or not instances:
        raise InvalidInput("instances: required, a non-empty list")
    by_name = {s.name: s for s in specs}
    names = [s.name for s in specs]
    if all(isinstance(row, dict) for row in instances):
        order = list(names)
        for row in instances:
            order.extend(k for k in row if k not in by_name and k not in order)
        present = [n for n in order if any(n in row for row in instances)]
        table = {n: [row.get(n) for row in instances] for n in present}
    elif all(isinstance(row, list) for row in instances):
        if not names:
            raise InvalidInput("instances: this model does not describe its inputs; send objects keyed by input name")
        for i, row in enumerate(instances):
            if len(row) != len(names):
                raise InvalidInput(
                    f"instances[{i}]: expected {len(names)} values ({', '.join(names)}), got {len(row)}"
                )
        table = {n: [row[j] for row in instances] for j, n in enumerate(names)}
    elif len(names) == 1 and not any(isinstance(row, (dict, list)) for row in instances):
        table = {names[0]: list(instances)}
    else:
        raise InvalidInput("instances: every instance must be a list (values in input order) or an object (by input name)")
    return Frame({n: _column(n, values, by_name.get(n)) for n, values in table.items()}, dict(parameters))


def _plain(v: Any) -> Any:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def predictions(frame: Frame) -> list[Any]:
    """One prediction per row: the value of a single output, else ``{output: value}``."""
    columns = {name: [_plain(v) for v in col.tolist()] if col.dtype == object else col.tolist() for name, col in frame.columns.items()}
    if len(columns) == 1:
        return next(iter(columns.values()))
    names = list(columns)
    return [dict(zip(names, values)) for values in zip(*columns.values())]


@v2_errors
async def list_models(request: web.Request) -> web.Response:
    """GET /v1/models: ``{"models": [names]}``."""
    return json_response({"models": [str(c) for c in sorted(request.app[GATEWAY].contracts)]})


@v2_errors
async def model_ready(request: web.Request) -> web.Response:
    """GET /v1/models/{model}: ``{"name", "ready"}``, 200 ready, 503 not ready, 404 unknown."""
    name = request.match_info["model"]
    ready = v2_common.model_ready(request.app[GATEWAY], name, None)
    return json_response({"name": name, "ready": ready}, status=200 if ready else 503)


@v2_errors
async def predict(request: web.Request) -> web.Response:
    """POST /v1/models/{model}:predict."""
    gateway = request.app[GATEWAY]
    name = request.match_info["model"]
    request[CONTRACT] = name
    contract = v2_common.model_contract(name)
    gateway.contract_state(contract)
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidInput("body: expected a JSON object with instances")
    instances = body.get("instances", body.get("inputs"))
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInput("parameters: expected a JSON object")
    frame = frame_from_instances(instances, v2_common.input_specs(gateway, contract, None), parameters)
    result = await gateway.infer(
        contract,
        frame,
        configs=v2_common.configs_from(parameters),
        request_id=request_id_of(request),
        protocol="v1",
        timeout_s=timeout_from(request),
    )
    request[FQRV_TAG] = str(result.fqrv)
    request[SCORING_S] = result.latency_ms / 1000
    return json_response({"predictions": predictions(result.frame)})


async def alive(request: web.Request) -> web.Response:
    """GET /: ``{"status": "alive"}`` (what the kserve V1 client checks for liveness)."""
    return json_response({"status": "alive"})


def add_routes(app: web.Application) -> None:
    """Register the V1 routes (and ``GET /`` unless another front-end already serves it)."""
    r = app.router
    r.add_get("/v1/models", list_models)
    r.add_get("/v1/models/{model:[^/:]+}", model_ready)
    r.add_post("/v1/models/{model:[^/:]+}:predict", predict)
    if not any(getattr(res, "canonical", None) == "/" for res in r.resources()):
        r.add_get("/", alive)
