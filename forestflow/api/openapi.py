"""The OpenAPI 3.1 document of every REST route, served at ``/openapi.json``.

Written as data next to the routes it describes; ``tests/ops/test_openapi.py`` compares its paths
with the router's, and a schemathesis run checks the live gateway against it.
"""

from __future__ import annotations

from typing import Any

from forestflow import __version__

J = "application/json"

# ---- schemas ------------------------------------------------------------------------------------
_OBJ: dict[str, Any] = {"type": "object"}
_CONTRACT = {
    "type": "object",
    "required": ["organization", "project", "contractNumber"],
    "properties": {"organization": {"type": "string"}, "project": {"type": "string"}, "contractNumber": {"type": "integer"}},
}
_FQRV = {
    "type": "object",
    "required": ["contract", "releaseVersion"],
    "properties": {"contract": _CONTRACT, "releaseVersion": {"type": "string"}},
}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "description": "ForestFlow's envelope (keyed by the error type) plus fields every client can rely on.",
        "required": ["error", "code", "request_id"],
        "properties": {"error": {"type": "string"}, "code": {"type": "string"}, "request_id": {"type": "string"}},
    },
    "V2Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
    "Contract": _CONTRACT,
    "FQRV": _FQRV,
    "ServeRequest": {
        "type": "object",
        "description": (
            "ForestFlow's BasicServeRequest: path of the artifact, fqrv, flavor, servable and contract settings "
            "(RemoteV2 servables, scored by another V2 server, have no path)."
        ),
        "required": ["fqrv", "flavor"],
        "properties": {
            "path": {"type": "string", "description": "where the artifact is; required unless the flavor is RemoteV2"},
            "fqrv": _OBJ,
            "flavor": _OBJ,
            "servableSettings": _OBJ,
            "contractSettings": _OBJ,
            "explainer": {
                "type": "object",
                "description": (
                    "A model-agnostic explainer for /explain, :explain and V2's explain parameter, for models whose trees are "
                    'not explained exactly: {"KernelShap": {"background": "file.csv" or [records], "samples": 200}}'
                ),
            },
        },
    },
    "InferenceRequest": {
        "type": "object",
        "description": "ForestFlow's schema + datum batch (row-major typed groups) and optional configs.",
        "required": ["schema", "datum"],
        "properties": {
            "schema": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"type": {"type": "string"}, "fields": {"type": "array", "items": {"type": "string"}}},
                },
            },
            "datum": {"type": "array", "items": {"type": "object", "properties": {"tensors": {"type": "array", "items": _OBJ}}}},
            "configs": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    },
    "Prediction": {
        "type": "object",
        "required": ["Prediction"],
        "properties": {
            "Prediction": {
                "type": "object",
                "required": ["fqrv", "schema", "datum"],
                "properties": {"fqrv": _FQRV, "schema": {"type": "array"}, "datum": {"type": "array"}},
            }
        },
    },
    "Explained": {
        "type": "object",
        "description": "The Prediction /score answers and, per datum, the contributions by column name (the bias: BiasTerm).",
        "required": ["Prediction", "Explanation"],
        "properties": {
            "Prediction": {"type": "object"},
            "Explanation": {
                "type": "object",
                "required": ["fqrv", "method", "columns", "groups", "contributions"],
                "properties": {
                    "fqrv": _FQRV,
                    "method": {"type": "string", "enum": ["TreeSHAP", "KernelSHAP"]},
                    "columns": {"type": "array", "items": {"type": "string"}},
                    "groups": {"type": "array", "items": {"type": "string"}},
                    "contributions": {
                        "type": "array",
                        "description": "per datum {column: value}, or {group: {column: value}} for several outputs or classes",
                        "items": {"type": "object"},
                    },
                },
            },
        },
    },
    "BasicMetaData": {
        "type": "object",
        "required": ["fqrv", "name", "inputs", "outputs"],
        "properties": {
            "fqrv": _FQRV,
            "name": {"type": "string"},
            "server": {"type": "string"},
            "description": {"type": "string"},
            "inputs": {"type": "array"},
            "outputs": {"type": "array"},
            "explanations": {
                "type": ["object", "null"],
                "description": "how the release explains (method TreeSHAP or KernelSHAP), null when it cannot",
            },
            "load": {"$ref": "#/components/schemas/LoadStatus"},
        },
    },
    "LoadStatus": {
        "type": "object",
        "description": "A release whose load fails on this process (retried with backoff until it loads or is deleted).",
        "required": ["state", "attempts"],
        "properties": {
            "state": {"type": "string", "enum": ["loading", "failed"]},
            "attempts": {"type": "integer"},
            "error": {"type": "string"},
            "retryInS": {"type": "number", "description": "seconds to the next attempt"},
        },
    },
    "AdminResult": {
        "type": "object",
        "description": "One key naming the outcome (ServableCreatedSuccessfully, ContractUpdatedSuccessfully, ...).",
        "minProperties": 1,
        "maxProperties": 1,
    },
    "V2InferRequest": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": {
                "type": "object",
                "description": (
                    '"explain": true adds an output "contributions" ([n, F+1], or [n, groups, F+1]) whose parameters name '
                    "the columns (the bias last), the groups, the method and the release"
                ),
            },
            "inputs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "datatype", "shape"],
                    "properties": {
                        "name": {"type": "string"},
                        "datatype": {"type": "string"},
                        "shape": {"type": "array", "items": {"type": "integer"}},
                        "data": {},
                        "parameters": _OBJ,
                    },
                },
            },
            "outputs": {"type": "array", "items": _OBJ},
        },
    },
    "V2InferResponse": {
        "type": "object",
        "required": ["model_name", "outputs"],
        "properties": {
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "id": {"type": "string"},
            "parameters": _OBJ,
            "outputs": {"type": "array", "items": _OBJ},
        },
    },
    "V2ModelMetadata": {
        "type": "object",
        "required": ["name", "platform", "inputs", "outputs"],
        "properties": {
            "name": {"type": "string"},
            "versions": {"type": "array", "items": {"type": "string"}},
            "platform": {"type": "string"},
            "inputs": {"type": "array"},
            "outputs": {"type": "array"},
        },
    },
    "Readiness": {"type": "object", "required": ["ready"], "properties": {"ready": {"type": "boolean"}}},
    "Feedback": {
        "type": "object",
        "description": "A reward for the answer whose X-Request-Id was requestId (docs/experiments.md).",
        "required": ["requestId", "reward"],
        "properties": {"requestId": {"type": "string", "minLength": 1, "maxLength": 200}, "reward": {"type": "number"}},
    },
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {J: {"schema": schema}}}


_ERROR = _json(_ref("Error"), "Error (ForestFlow envelope)")
_V2_ERROR = _json(_ref("V2Error"), "Error (KServe body)")
_P_ORG = {"name": "org", "in": "path", "required": True, "schema": {"type": "string"}, "example": "h2o"}
_P_PROJECT = {"name": "project", "in": "path", "required": True, "schema": {"type": "string"}, "example": "fuzz"}
_P_N = {"name": "n", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 0}, "example": 1}
_P_RELEASE = {"name": "release", "in": "path", "required": True, "schema": {"type": "string"}, "example": "r1"}


def _p_contract_name(name: str) -> dict[str, Any]:
    """A path parameter that names a contract as ``org.project.n``."""
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "description": "org.project.n",
        "example": "h2o.fuzz.1",
    }


_P_NAME = _p_contract_name("name")
_P_MODEL = _p_contract_name("model")
_P_VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}, "example": "r1"}
_P_TIMEOUT = {
    "name": "X-Request-Timeout-Ms",
    "in": "header",
    "required": False,
    "schema": {"type": "integer", "minimum": 1, "maximum": 3600000},
    "example": 30000,
}
_P_PIN = {
    "name": "X-Forestflow-Release",
    "in": "header",
    "required": False,
    "description": "the release that must answer (allowPinnedReleases, or the admin token)",
    "schema": {"type": "string"},
}
_CONTRACT_PARAMS = [_P_ORG, _P_PROJECT, _P_N]
_RELEASE_PARAMS = [*_CONTRACT_PARAMS, _P_RELEASE]
_BEARER: list[dict[str, list[str]]] = [{"bearer": []}, {}]


#: One row for the H2O prostate GBM the examples' contract (h2o.fuzz.1) serves.
_FEATURES = {"AGE": 65.0, "RACE": 1.0, "DPROS": 2.0, "DCAPS": 1.0, "PSA": 1.4, "VOL": 0.0, "GLEASON": 6.0}
SCORE_EXAMPLE = {
    "schema": [{"type": "Float64", "fields": list(_FEATURES)}],
    "datum": [{"tensors": [{"Float64": {"data": list(_FEATURES.values())}}]}],
}
V2_EXAMPLE = {"inputs": [{"name": k, "datatype": "FP64", "shape": [1], "data": [v]} for k, v in _FEATURES.items()]}


def _op(
    tag: str,
    summary: str,
    ok: dict[str, Any],
    params: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    error: dict[str, Any] = _ERROR,
    admin: bool = False,
    extra: dict[str, Any] | None = None,
    example: Any = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {"tags": [tag], "summary": summary, "responses": {"200": ok, **(extra or {}), "default": error}}
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {J: {"schema": body} | ({"example": example} if example is not None else {})},
        }
    if admin:
        op["security"] = _BEARER
    return op


def _paths() -> dict[str, dict[str, Any]]:
    c, r = "/{org}/{project}/{n}", "/{org}/{project}/{n}/{release}"
    arr = {"type": "array", "items": _OBJ}
    paths: dict[str, dict[str, Any]] = {
        # BASIC
        c + "/score": {
            "post": _op(
                "BASIC",
                "Score a batch on the contract's routed release",
                _json(_ref("Prediction")),
                [*_CONTRACT_PARAMS, _P_TIMEOUT, _P_PIN],
                _ref("InferenceRequest"),
                extra={"502": _ERROR, "503": _ERROR, "504": _ERROR},
                example=SCORE_EXAMPLE,
            )
        },
        c + "/explain": {
            "post": _op(
                "BASIC",
                "Score and explain a batch on the contract's routed release (422 if it cannot explain)",
                _json(_ref("Explained")),
                [*_CONTRACT_PARAMS, _P_TIMEOUT],
                _ref("InferenceRequest"),
                extra={"502": _ERROR, "503": _ERROR, "504": _ERROR},
                example=SCORE_EXAMPLE,
            )
        },
        c + "/metadata": {
            "get": _op(
                "BASIC",
                "Metadata of every release",
                _json({"type": "array", "items": {"type": "object", "properties": {"BasicMetaData": _ref("BasicMetaData")}}}),
                _CONTRACT_PARAMS,
            )
        },
        r + "/metadata": {
            "get": _op(
                "BASIC",
                "Metadata of one release",
                _json({"type": "object", "properties": {"BasicMetaData": _ref("BasicMetaData")}}),
                _RELEASE_PARAMS,
            )
        },
        c + "/gp": {
            "get": _op("GraphPipe", "GraphPipe metadata as JSON", _json(_OBJ), _CONTRACT_PARAMS),
            "post": {
                "tags": ["GraphPipe"],
                "summary": "GraphPipe flatbuffers request",
                "parameters": _CONTRACT_PARAMS,
                "requestBody": {
                    "required": True,
                    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                },
                "responses": {
                    "200": {
                        "description": "GraphPipe flatbuffers response",
                        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                    },
                    "default": {
                        "description": "Error (GraphPipe error entry or JSON)",
                        "content": {
                            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                            J: {"schema": _OBJ},
                        },
                    },
                },
            },
        },
        # admin
        "/servable": {
            "post": _op("admin", "Deploy a servable", _json(_ref("AdminResult")), body=_ref("ServeRequest"), admin=True)
        },
        "/servable" + r: {
            "post": _op(
                "admin",
                "Deploy a servable named by the path",
                _json(_ref("AdminResult")),
                _RELEASE_PARAMS,
                _ref("ServeRequest"),
                admin=True,
            )
        },
        "/contract" + c: {
            "post": _op("admin", "Create a contract", _json(_ref("AdminResult")), _CONTRACT_PARAMS, _OBJ, admin=True)
        },
        c: {"put": _op("admin", "Replace a contract's settings", _json(_ref("AdminResult")), _CONTRACT_PARAMS, _OBJ, admin=True)},
        r: {"delete": _op("admin", "Delete a release", _json(_ref("AdminResult")), _RELEASE_PARAMS, admin=True)},
        "/contracts/list": {
            "get": _op(
                "admin",
                "List contracts",
                _json(
                    {
                        "type": "object",
                        "required": ["Contracts"],
                        "properties": {
                            "Contracts": {"type": "object", "properties": {"contracts": {"type": "array", "items": _CONTRACT}}}
                        },
                    }
                ),
            )
        },
        c + "/feedback": {
            "post": _op(
                "experiments",
                "Report a reward for an answer (counted for the release that gave it)",
                _json(_OBJ),
                _CONTRACT_PARAMS,
                _ref("Feedback"),
            )
        },
        "/v2/models/{model}/feedback": {
            "post": _op(
                "experiments",
                "Report a reward for an answer of a V2 model",
                _json({"type": "object", "required": ["model_name", "model_version"]}),
                [_P_MODEL],
                _ref("Feedback"),
                error=_V2_ERROR,
            )
        },
        c + "/stats": {"get": _op("admin", "Counters of every release", _json(arr), _CONTRACT_PARAMS)},
        r + "/settings": {"get": _op("admin", "Settings of one release", _json(_OBJ), _RELEASE_PARAMS)},
        r + "/performance-metrics": {
            "put": _op(
                "admin",
                "Report performance metrics",
                _json(_ref("AdminResult")),
                _RELEASE_PARAMS,
                {
                    "type": "object",
                    "required": ["performanceMetrics"],
                    "properties": {"performanceMetrics": {"type": "object", "additionalProperties": {"type": "number"}}},
                },
                admin=True,
            )
        },
        # V1
        "/": {
            "get": _op(
                "V1",
                "Liveness (kserve V1 client)",
                _json({"type": "object", "properties": {"status": {"type": "string"}}}),
                error=_V2_ERROR,
            )
        },
        "/v1/models": {
            "get": _op(
                "V1",
                "List models",
                _json({"type": "object", "properties": {"models": {"type": "array", "items": {"type": "string"}}}}),
                error=_V2_ERROR,
            )
        },
        "/v1/models/{model}": {
            "get": _op(
                "V1",
                "Model readiness",
                _json({"type": "object", "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}}}),
                [_P_MODEL],
                error=_V2_ERROR,
            )
        },
        "/v1/models/{model}:predict": {
            "post": _op(
                "V1",
                "Predict instances",
                _json({"type": "object", "required": ["predictions"], "properties": {"predictions": {"type": "array"}}}),
                [_P_MODEL, _P_TIMEOUT],
                {
                    "type": "object",
                    "properties": {"instances": {"type": "array"}, "inputs": {"type": "array"}, "parameters": _OBJ},
                },
                error=_V2_ERROR,
            )
        },
        "/v1/models/{model}:explain": {
            "post": _op(
                "V1",
                "Predict and explain instances (KServe's explainer shape; 422 if the release cannot explain)",
                _json(
                    {
                        "type": "object",
                        "required": ["explanations"],
                        "properties": {
                            "predictions": {"type": "array"},
                            "outputs": _OBJ,
                            "explanations": {"type": "array", "items": _OBJ},
                            "release": {"type": "string"},
                            "method": {"type": "string"},
                        },
                    }
                ),
                [_P_MODEL, _P_TIMEOUT],
                {
                    "type": "object",
                    "properties": {"instances": {"type": "array"}, "inputs": {"type": "array"}, "parameters": _OBJ},
                },
                error=_V2_ERROR,
            )
        },
        # V2
        "/v2": {
            "get": _op(
                "V2", "Server metadata", _json({"type": "object", "required": ["name", "version", "extensions"]}), error=_V2_ERROR
            )
        },
        "/v2/": {
            "get": _op(
                "V2", "Server metadata", _json({"type": "object", "required": ["name", "version", "extensions"]}), error=_V2_ERROR
            )
        },
        "/v2/health/live": {"get": _op("V2", "Server liveness", _json({"type": "object"}), error=_V2_ERROR)},
        "/v2/health/ready": {
            "get": _op(
                "V2",
                "Server readiness (503 when not ready)",
                _json(_ref("Readiness")),
                error=_V2_ERROR,
                extra={"503": _json(_ref("Readiness"), "Not ready")},
            )
        },
        # V2 model repository extension (model names are contracts; load/unload deploy or remove every release)
        "/v2/models": {
            "get": _op(
                "V2",
                "Every model (contract) with its versions and readiness",
                _json(
                    {
                        "type": "object",
                        "required": ["models"],
                        "properties": {
                            "models": {"type": "array", "items": {"type": "object", "required": ["name", "versions", "ready"]}}
                        },
                    }
                ),
                error=_V2_ERROR,
            )
        },
        "/v2/repository/index": {
            "post": _op(
                "V2",
                "The model repository's entries",
                _json(
                    {
                        "type": "array",
                        "items": {"type": "object", "required": ["name", "version", "state"]},
                    }
                ),
                body={"type": "object", "properties": {"ready": {"type": "boolean"}}},
                error=_V2_ERROR,
                admin=True,
            )
        },
        "/v2/repository/models/{name}/load": {
            "post": _op(
                "V2", "Deploy a model's repository entries", _json(_OBJ), [_P_NAME], body=_OBJ, error=_V2_ERROR, admin=True
            )
        },
        "/v2/repository/models/{name}/unload": {
            "post": _op("V2", "Remove every release of a model", _json(_OBJ), [_P_NAME], body=_OBJ, error=_V2_ERROR, admin=True)
        },
        "/ops/dashboard": {
            "get": _op(
                "ops",
                "Everything /ui shows, as JSON",
                _json({"type": "object", "required": ["contracts", "predictionLog", "errors", "ready"]}),
            )
        },
    }
    for base, params in (("/v2/models/{model}", [_P_MODEL]), ("/v2/models/{model}/versions/{version}", [_P_MODEL, _P_VERSION])):
        paths[base] = {"get": _op("V2", "Model metadata", _json(_ref("V2ModelMetadata")), params, error=_V2_ERROR)}
        paths[base + "/ready"] = {
            "get": _op(
                "V2",
                "Model readiness",
                _json({"type": "object", "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}}}),
                params,
                error=_V2_ERROR,
            )
        }
        paths[base + "/infer"] = {
            "post": _op(
                "V2",
                "Inference (JSON tensors; binary extension also accepted)",
                _json(_ref("V2InferResponse")),
                [*params, _P_TIMEOUT, _P_PIN] if len(params) == 1 else [*params, _P_TIMEOUT],
                _ref("V2InferRequest"),
                error=_V2_ERROR,
                extra={"502": _V2_ERROR, "503": _V2_ERROR, "504": _V2_ERROR},
                example=V2_EXAMPLE,
            )
        }
    for alias, target in (("/releases", "/list"), ("/servable-settings", "/s-settings"), ("/contract-settings", "/c-settings")):
        summary = {
            "/releases": "Releases of a contract",
            "/servable-settings": "Settings of every release",
            "/contract-settings": "Contract settings",
        }[alias]
        schema = _json(_OBJ) if alias == "/contract-settings" else _json(arr)
        paths[c + alias] = {"get": _op("admin", summary, schema, _CONTRACT_PARAMS)}
        paths[c + target] = {"get": _op("admin", summary + " (alias)", schema, _CONTRACT_PARAMS)}
    for alias, target, summary in (
        ("/policy-settings", "/policy", "Replace validity and phase-in"),
        ("/logging-settings", "/logging", "Replace logging settings"),
    ):
        for suffix in (alias, target):
            paths[r + suffix] = {"put": _op("admin", summary, _json(_ref("AdminResult")), _RELEASE_PARAMS, _OBJ, admin=True)}
    # ops
    ready = {
        "type": "object",
        "required": ["ready"],
        "properties": {
            "ready": {"type": "boolean"},
            "draining": {"type": "boolean"},
            "loading": {"type": "array"},
            "loadingPhases": _OBJ,
            "failed": {"type": "object", "additionalProperties": _ref("LoadStatus")},
            "workers": {
                "type": "object",
                "description": "--workers N: each worker's state (ready, loading, failed with its failing releases, down)",
            },
        },
    }
    paths["/health/live"] = {
        "get": _op(
            "ops", "Liveness: the event loop answers", _json({"type": "object", "properties": {"live": {"type": "boolean"}}})
        )
    }
    paths["/health/ready"] = {
        "get": _op(
            "ops",
            "Readiness (503 while loading, a release failing to load, draining, store unreachable at start, JVM dead)",
            _json(ready),
            extra={"503": _json(ready, "Not ready")},
        )
    }
    paths["/metrics"] = {
        "get": {
            "tags": ["ops"],
            "summary": "Prometheus text format",
            "responses": {
                "200": {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}},
                "default": _ERROR,
            },
        }
    }
    paths["/metrics/json"] = {"get": _op("ops", "Scheduler and prediction-log counters as JSON", _json(_OBJ))}
    paths["/openapi.json"] = {"get": _op("ops", "This document", _json(_OBJ))}
    paths["/ui"] = {
        "get": {
            "tags": ["ops"],
            "summary": "Live page of contracts and traffic",
            "responses": {
                "200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}},
                "default": _ERROR,
            },
        }
    }
    return paths


def document() -> dict[str, Any]:
    """The whole OpenAPI document."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "forestflow gateway",
            "version": __version__,
            "description": "ForestFlow's admin and BASIC APIs, KServe V1 and V2 REST, GraphPipe and operations routes.",
        },
        "paths": _paths(),
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "admin token, when one is configured"}
            },
        },
    }
