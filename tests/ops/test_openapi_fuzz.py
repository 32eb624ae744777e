"""schemathesis against a live gateway serving an H2O model: no server errors, responses as documented.

Bounded: per operation its documented examples, 20 generated positive and 10 negative cases (positive and
negative data), admin writes with the admin token so their bodies are parsed too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import content_type_conformance, not_a_server_error, response_schema_conformance, status_code_conformance

from tests.api.test_h2o_score import definition
from tests.support import GatewayProcess

TOKEN = "fuzz-token"
MAX_EXAMPLES = int(os.environ.get("FF_FUZZ_EXAMPLES", "20"))
CALLS: list[tuple[str, str, int]] = []


@pytest.fixture(scope="module")
def live_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[schemathesis.BaseSchema]:
    data = tmp_path_factory.mktemp("fuzz") / "data"
    gateway = GatewayProcess(data, env={"FORESTFLOW_ADMIN_TOKEN": TOKEN, "FORESTFLOW_REQUEST_TIMEOUT_MS": "5000"}).start()
    try:
        schema = schemathesis.openapi.from_url(gateway.url + "/openapi.json")
        redeploy(schema)
        yield schema
        assert gateway.proc is not None and gateway.proc.poll() is None, "the gateway died during the fuzz run"
        assert "unhandled_error" not in gateway.log(), gateway.log()
    finally:
        print(f"schemathesis: {len(CALLS)} cases, statuses {json.dumps(_by_status())}")
        assert gateway.stop() == 0


def redeploy(schema: schemathesis.BaseSchema) -> None:
    """The H2O model the documented examples name (h2o.fuzz.1.r1): deployed afresh when it is gone."""
    url = schema.get_base_url().rstrip("/")
    body = definition("prostate_gbm_binomial", release="r1")
    body["fqrv"]["contract"] = {"organization": "h2o", "project": "fuzz", "contract_number": 1}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    if requests.get(url + "/h2o/fuzz/1/r1/settings", timeout=30).status_code == 200:
        requests.delete(url + "/h2o/fuzz/1/r1", headers=auth, timeout=30).raise_for_status()  # its settings may be fuzzed
    r = requests.post(url + "/servable", json=body, headers=auth, timeout=120)
    assert r.status_code == 200, r.text


def _by_status() -> dict[int, int]:
    out: dict[int, int] = {}
    for _, _, status in CALLS:
        out[status] = out.get(status, 0) + 1
    return dict(sorted(out.items()))


@pytest.mark.slow
def test_live_gateway_matches_its_openapi(live_schema: schemathesis.BaseSchema) -> None:
    """Every operation: generated cases (and the documented examples) against the live gateway."""
    failures: list[str] = []
    operations = [result.ok() for result in live_schema.get_all_operations()]
    assert len(operations) >= 40

    def check(case: schemathesis.Case) -> None:
        try:
            response = case.call_and_validate(
                headers={"Authorization": f"Bearer {TOKEN}"},
                checks=[not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance],
                timeout=30,
            )
        except Exception as exc:  # collect every operation's failure, then fail once
            failures.append(f"{case.method} {case.formatted_path}: {str(exc)[:800]}")
            return
        CALLS.append((case.method, case.path, response.status_code))
        # 503 and 504 are documented answers (overload, deadline); any other 5xx is a defect
        if response.status_code >= 500 and response.status_code not in (503, 504):
            failures.append(f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}")

    changed = False  # the fixture deployed the model; only a write may have changed it since
    for operation in operations:
        if changed:
            redeploy(live_schema)  # a fuzzed DELETE or policy change may have removed or changed it
        changed = operation.method.upper() not in ("GET", "HEAD", "OPTIONS")
        strategies = [(strategy, 1) for strategy in operation.get_strategies_from_examples()]
        generated = [
            (operation.as_strategy(), MAX_EXAMPLES),
            # data that breaks the schema (wrong types, missing fields, bad path values): 4xx, never 5xx
            (operation.as_strategy(GenerationMode.NEGATIVE), MAX_EXAMPLES // 2),
        ]
        for strategy, examples in [*strategies, *generated]:
            run = settings(
                max_examples=examples,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.generate],
                derandomize=True,
                database=None,
            )(given(strategy)(lambda case: check(case)))
            try:
                run()
            except Unsatisfiable:  # nothing in this operation can be made invalid (no parameters, no body)
                assert strategy is generated[1][0], operation.label
    assert not failures, "\n".join(failures[:20])
    # the documented examples reach the deployed H2O model through BASIC and V2
    assert ("POST", "/{org}/{project}/{n}/score", 200) in CALLS
    assert ("POST", "/v2/models/{model}/infer", 200) in CALLS
